"""`localspec serve` for real: uvicorn on loopback and a Unix socket, the real engine, real clients."""

import json
import os
import re
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from localspec.engine.events import Round
from localspec.engine.sampling import SamplingSettings
from localspec.server.run import start_in_thread
from servers import serving

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(smollm2_path):
    folder = Path(tempfile.mkdtemp(prefix="ls"))  # short: Unix socket paths are limited to ~100 bytes
    with serving(smollm2_path, str(smollm2_path), 512, socket_path=folder / "s.sock") as running:
        yield running


@pytest.fixture(scope="module")
def fim_server(qwen_coder_path):
    # two slots: a chat's and a completion's
    with serving(qwen_coder_path, "qwen2.5-coder-0.5b-instruct", 2048, slots=2) as running:
        yield running


@pytest.fixture(scope="module")
def batch_server(qwen_coder_path):
    with serving(qwen_coder_path, "qwen2.5-coder-0.5b-instruct", 4096, slots=4) as running:
        yield running


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=120, **kw)


# ----------------------------------------------------------------------------- OpenAI


def test_openai_sdk_streams_a_chat_completion_with_usage(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count from 1 to 5."}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and finishes in (["length"], ["stop"])
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens >= 1 and usage.prompt_tokens > 5


def test_openai_sdk_non_streaming_chat_carries_speculation_stats(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    reply = client.chat.completions.create(model="localspec", messages=[{"role": "user", "content": "Say hi"}],
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].message.content
    extra = reply.model_extra["localspec"]
    assert {"drafted", "accepted", "speedup", "baseline_tokens_per_s"} <= set(extra)


def test_openai_sdk_n_choices_are_decoded_together_and_equal_their_single_requests_streamed_or_not(fim_server):
    from openai import OpenAI

    client = OpenAI(base_url=fim_server.url + "/v1", api_key="unused")
    ask = {"model": "localspec", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 10,
           "temperature": 1.0, "seed": 3, "extra_body": {"drafter": "none"}}
    reply = client.chat.completions.create(n=3, **ask)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    alone = [client.chat.completions.create(**{**ask, "seed": 3 + i}) for i in range(3)]
    assert [c.message.content for c in reply.choices] == [a.choices[0].message.content for a in alone]
    assert reply.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert reply.usage.prompt_tokens == alone[0].usage.prompt_tokens
    streamed: dict[int, str] = {}
    finished, usage = set(), None
    for chunk in client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **ask):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finished.add(choice.index)
        usage = chunk.usage or usage
    assert [streamed[i] for i in range(3)] == [c.message.content for c in reply.choices]  # each choice's own text
    assert finished == {0, 1, 2} and usage is not None and usage.completion_tokens == reply.usage.completion_tokens


def test_openai_legacy_completion_with_suffix_is_fim(fim_server):
    from openai import OpenAI

    client = OpenAI(base_url=fim_server.url + "/v1", api_key="unused")
    stream = client.completions.create(model="qwen2.5-coder-0.5b-instruct", prompt="def add(a, b):\n    return ",
                                       suffix="\n\nprint(add(1, 2))\n", max_tokens=8, temperature=0, stream=True)
    text = "".join(c.choices[0].text for c in stream)
    assert "a" in text and "b" in text


# ----------------------------------------------------------------------------- llama.cpp (llama.vim, llama.vscode)


def test_llama_vim_infill_body_gets_compact_flat_fields(fim_server):
    body = {
        "input_prefix": "def fib(n):\n", "input_suffix": "\n", "input_extra": [
            {"filename": "util.py", "text": "def helper():\n    pass\n", "time": 123}, {"text": "no name"}],
        "prompt": "    if n < 2:", "n_predict": 16, "n_indent": 4, "top_k": 40, "top_p": 0.99, "stream": False,
        "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000, "response_fields": ["content", "timings/prompt_n", "timings/predicted_n",
                                                      "timings/predicted_ms", "tokens_cached", "truncated", "nope/x"],
    }
    r = post(fim_server, "/infill", body)
    assert r.status_code == 200, r.text
    assert '"content":"' in r.text  # llama.vim's regex: no space after the colon
    data = r.json()
    assert set(data) == {"content", "timings/prompt_n", "timings/predicted_n", "timings/predicted_ms",
                         "tokens_cached", "truncated"}
    assert data["timings/predicted_n"] >= 1


def test_a_completion_past_its_time_limit_ends_at_a_line_boundary(fim_server):
    """llama.vim's first request at a position sets t_max_predict_ms; llama.cpp then ends the completion
    with a token that contains a newline, so Tab never inserts half a line (the real model, greedy)."""
    body = {"input_prefix": "class Circle:\n    def __init__(self, r):\n        self.r = r\n\n    def area(self):\n",
            "input_suffix": "\n", "n_predict": 48, "temperature": 0, "t_max_predict_ms": 1, "stream": False}

    def cancelled() -> int:
        metrics = httpx.get(fim_server.url + "/metrics", timeout=10).text
        return int(re.search(r"^localspec_cancelled_total\{[^}]*\} (\d+)", metrics, re.M).group(1))

    before = cancelled()
    data = post(fim_server, "/infill", body).json()
    content = data["content"]
    assert data["stop_type"] == "limit" and data["tokens_predicted"] < 48, data
    assert "\n" in content and content[content.rindex("\n") + 1:].strip() == "", repr(content)
    assert cancelled() == before  # a completion ended by its limit is not a cancelled one


def test_warm_up_with_empty_response_fields_answers_empty_object(fim_server):
    r = post(fim_server, "/infill", {"input_prefix": "x = ", "input_suffix": "", "n_predict": 0,
                                     "response_fields": [""]})
    assert r.status_code == 200 and r.text == "{}"


def test_repeated_infill_reuses_the_cached_prefix(fim_server):
    prefix = "import os\n\n" + "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(20))
    body = {"input_prefix": prefix, "input_suffix": "", "n_predict": 4, "temperature": 0}
    first = post(fim_server, "/infill", body).json()
    body["input_prefix"] = prefix + "def g"
    second = post(fim_server, "/infill", body).json()
    assert second["tokens_cached"] > first["tokens_evaluated"] * 0.8


def test_llama_vscode_completion_fields_and_n_cmpl(fim_server):
    body = {"input_prefix": "for i in range(", "input_suffix": "):\n    pass\n", "input_extra": [], "prompt": "",
            "n_predict": 6, "temperature": 0, "n_cmpl": 2, "stream": False}
    r = post(fim_server, "/infill", body)
    data = r.json()
    assert isinstance(data, list) and len(data) == 2
    assert {"content", "tokens_predicted", "tokens_evaluated", "timings", "stop_type"} <= set(data[0])
    health = httpx.get(fim_server.url + "/health").json()
    props = httpx.get(fim_server.url + "/props").json()
    assert health == {"status": "ok"} and props["default_generation_settings"]["n_ctx"] == 1024


def test_n_cmpl_completions_are_decoded_together_and_equal_their_single_requests(fim_server):
    """Three sampled completions of one prompt in one request (decoded two at a time on the server's two
    slots, then the third alone): each is what a request of its own with that seed returns."""
    body = {"input_prefix": "def mean(xs):\n    ", "input_suffix": "\n", "n_predict": 16, "temperature": 0.9,
            "seed": 11, "n_cmpl": 3, "drafter": "none"}
    together = post(fim_server, "/infill", body).json()
    alone = [post(fim_server, "/infill", {**body, "n_cmpl": 1, "seed": 11 + i}).json() for i in range(3)]
    assert [c["content"] for c in together] == [c["content"] for c in alone]
    assert len({c["content"] for c in together}) > 1  # three samples, not one answer thrice
    assert [c["index"] for c in together] == [0, 1, 2]
    assert together[0]["timings"]["prompt_n"] > 0 and together[1]["timings"]["prompt_n"] == 0  # evaluated once


def _metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return float(re.search(rf"^localspec_{name}{{[^}}]*}} (\S+)$", text, re.M).group(1))


class StreamingChat:
    """A chat streaming from `server` in a thread; `start()` returns once its first text has arrived."""

    def __init__(self, server, body: dict):
        self.server, self.body = server, body
        self.streamed: list[str] = []
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._stream)

    def _stream(self) -> None:
        with httpx.stream("POST", self.server.url + "/v1/chat/completions", json={**self.body, "stream": True},
                          timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.streamed.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
        self.finished.set()

    def start(self) -> "StreamingChat":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.text and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    @property
    def text(self) -> str:
        return "".join(self.streamed)


def test_an_editor_completion_is_answered_while_a_chat_streams(fim_server):
    """The completion runs between two rounds of the chat's answer (not after it), and neither answer
    changes: both equal the same requests asked one after the other. (Both decode plainly: llama.cpp's
    greedy answer depends on the verify batches' sizes, which drafting chooses by timing, so drafted
    answers to one prompt may part at a near tie; plain rounds are one shape.)"""
    chat = {"messages": [{"role": "user", "content": "Write a long, detailed story about a lighthouse keeper."}],
            "max_tokens": 200, "temperature": 0, "drafter": "none"}
    infill = {"input_prefix": "def mean(xs):\n    ", "input_suffix": "\n", "n_predict": 24, "temperature": 0,
              "cache_prompt": True, "drafter": "none"}
    before = _metric(fim_server, "interjected_total")
    chatting = StreamingChat(fim_server, chat).start()
    busy = [s["is_processing"] for s in httpx.get(fim_server.url + "/slots", timeout=10).json()]
    completion = post(fim_server, "/infill", infill).json()["content"]
    answered_during_chat = not chatting.finished.is_set()
    chatting.thread.join(120)
    assert answered_during_chat and _metric(fim_server, "interjected_total") == before + 1
    assert busy.count(True) == 1  # /slots: the chat's slot, not the other
    deadline = time.monotonic() + 10  # (the engine lets go of a slot just after its last event is sent)
    while any(s["is_processing"] for s in httpx.get(fim_server.url + "/slots", timeout=10).json()):
        assert time.monotonic() < deadline, "a slot still reads busy after every request ended"
        time.sleep(0.05)
    assert len(chatting.text) > 200  # (a long answer: the completion arrived in its middle)
    alone = post(fim_server, "/v1/chat/completions", chat).json()["choices"][0]["message"]["content"]
    assert chatting.text == alone
    assert post(fim_server, "/infill", infill).json()["content"] == completion


def test_a_chat_that_arrives_while_another_streams_joins_it_and_finishes_first(batch_server):
    """Four slots: the second chat joins the first's generation (one llama_decode per step for both)
    instead of waiting for its whole answer."""
    long = {"messages": [{"role": "user", "content": "Write a long, detailed story about a lighthouse keeper."}],
            "max_tokens": 300, "temperature": 0}
    short = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 16, "temperature": 0}
    before = _metric(batch_server, "joined_total")
    chatting = StreamingChat(batch_server, long).start()
    reply = post(batch_server, "/v1/chat/completions", short).json()
    answered_during_chat = not chatting.finished.is_set()
    busy = [s["is_processing"] for s in httpx.get(batch_server.url + "/slots", timeout=10).json()]
    chatting.thread.join(300)
    assert answered_during_chat and _metric(batch_server, "joined_total") == before + 1
    assert reply["choices"][0]["message"]["content"] and reply["usage"]["completion_tokens"] <= 16
    assert busy.count(True) >= 1 and len(chatting.text) > 200


def test_a_long_prompt_that_joins_does_not_freeze_the_stream_it_joins(batch_server):
    """A chat with a long prompt joins a streaming chat: its prompt is evaluated in chunks within the
    shared steps, so the first chat's stream goes on while it is evaluated (evaluated at once, it would
    stand still until the joining chat's first token). The story decodes plainly: an earlier test asked
    it, and its replay drafted in the shared steps would end it before the joining chat's answer."""
    story = {"messages": [{"role": "user", "content": "Write a long, detailed story about a lighthouse keeper."}],
             "max_tokens": 400, "temperature": 0, "drafter": "none"}
    code = "".join(f"def helper_{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(40))  # ~700 tokens
    long = {"messages": [{"role": "user", "content": code + "Which helper returns 42 for x = 6?"}],
            "max_tokens": 4, "temperature": 0, "stream": True}
    before, chunks_before = _metric(batch_server, "joined_total"), _metric(batch_server, "prompt_chunks_total")
    chatting = StreamingChat(batch_server, story).start()
    sent_at = len(chatting.streamed)
    first_at = None
    with httpx.stream("POST", batch_server.url + "/v1/chat/completions", json=long, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and first_at is None:
                first_at = len(chatting.streamed)
    still_streaming = not chatting.finished.is_set()
    chatting.thread.join(300)
    assert _metric(batch_server, "joined_total") == before + 1 and still_streaming
    # Every chunk's step carried a token of the story. How many chunks depends on this machine's costs (a
    # step holds what fits in half a second, at least 32 tokens), but at least two: a step holds at most
    # a batch (512 tokens).
    chunks = _metric(batch_server, "prompt_chunks_total") - chunks_before + 1
    assert chunks >= 2 and first_at is not None and first_at - sent_at >= chunks - 1, (chunks, sent_at, first_at)


def test_infill_without_fim_tokens_is_refused_clearly(server):
    r = post(server, "/infill", {"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 400 and "Infill is not supported" in r.json()["error"]["message"]


def test_completion_stream_has_data_lines_and_no_done(server):
    with httpx.stream("POST", server.url + "/completion", json={"prompt": "Once upon a time", "n_predict": 8,
                                                                "stream": True}, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: {") for line in lines)
    final = json.loads(lines[-1][6:])
    assert final["stop"] is True and final["timings"]["predicted_n"] >= 1 and "[DONE]" not in "".join(lines)


# ----------------------------------------------------------------------------- Ollama (Continue)


def test_ollama_chat_streams_ndjson_lines_each_terminated(server):
    with httpx.stream("POST", server.url + "/api/chat", json={
            "model": server.served.name, "messages": [{"role": "user", "content": "Hello"}],
            "options": {"num_predict": 6, "temperature": 0}}, timeout=60) as r:
        raw = b"".join(r.iter_bytes())
    assert raw.endswith(b"\n")
    lines = [json.loads(x) for x in raw.decode().splitlines()]
    assert all("message" in x for x in lines) and lines[-1]["done"] is True and lines[-1]["eval_count"] >= 1
    assert "localspec" in lines[-1]


def test_ollama_tags_show_version_and_generate(server):
    tags = httpx.get(server.url + "/api/tags").json()
    name = tags["models"][0]["name"]
    assert name.endswith(":latest")
    show = post(server, "/api/show", {"name": name}).json()
    assert "num_ctx 512" in show["parameters"] and ".Suffix" not in show["template"]
    assert httpx.get(server.url + "/api/version").json()["version"]
    gen = post(server, "/api/generate", {"model": name, "prompt": "Why is the sky blue?", "stream": False,
                                         "options": {"num_predict": 5}}).json()
    assert gen["done"] is True and gen["response"] and gen["eval_count"] >= 1


def test_each_dialects_draft_bounds_reach_the_planner_and_the_answer_says_who_drafted(server):
    """llama.cpp's `speculative.n_max` / `n_min` and Ollama's `options.draft_num_predict` (0: off) bound
    a request's drafts; `localspec.by_drafter` says what each drafter proposed and the target kept."""
    prompt = "one two three four five six seven, one two three four five six seven, one two three four five six seven,"

    # A forced length (draft_len) makes every round offer a draft longer than the cap, whatever the
    # planner's costs and bound would choose on the machine that runs the test.
    def completion(**extra):
        body = {"prompt": prompt, "n_predict": 40, "temperature": 0, "drafter": "ngram", "draft_len": 6, **extra}
        reply = post(server, "/completion", body)
        assert reply.status_code == 200, reply.text
        return reply.json()

    free, capped = completion(), completion(**{"speculative.n_max": 2})
    assert free["content"] == capped["content"]
    assert len(free["localspec"]["acceptance_by_position"]) > 2  # (left alone, some draft is longer than 2)
    assert 0 < len(capped["localspec"]["acceptance_by_position"]) <= 2
    for answer in (free, capped):
        stats = answer["localspec"]
        assert stats["by_drafter"] == {"ngram": [stats["drafted"], stats["accepted"]]}
    name = httpx.get(server.url + "/api/tags").json()["models"][0]["name"]
    off = post(server, "/api/generate", {"model": name, "prompt": prompt, "stream": False, "raw": True,
                                         "options": {"num_predict": 40, "temperature": 0, "draft_num_predict": 0}})
    assert off.status_code == 200 and off.json()["localspec"]["drafted"] == 0
    assert off.json()["response"] == free["content"]
    bad = post(server, "/completion", {"prompt": prompt, "speculative.n_max": 2, "speculative.n_min": 3})
    assert bad.status_code == 400 and "shortest draft" in bad.json()["error"]["message"]
    assert post(server, "/completion", {"prompt": prompt, "speculative.n_max": "two"}).status_code == 400
    # Through the chat app's client (tui/remote.py) the Python API's bounds reach the server as llama.cpp's.
    from localspec.tui.remote import RemoteProvider

    remote = RemoteProvider(server.socket).load("")

    def chat_drafts(**bounds):
        rounds = remote.chat([{"role": "user", "content": f"Repeat exactly: {prompt}"}], max_tokens=40,
                             sampling=SamplingSettings(temperature=0.0), drafter="ngram", draft_len=6, **bounds)
        return [len(r.accepted) + len(r.rejected) for r in rounds if isinstance(r, Round)]

    try:
        free_drafts, capped_drafts = chat_drafts(), chat_drafts(draft_max=2)
    finally:
        remote.close()
    assert max(free_drafts) > 2 and max(capped_drafts) == 2, (free_drafts, capped_drafts)


def test_every_dialect_refuses_bad_settings_with_the_one_message(server):
    """GenerationParams checks a request's settings once: each dialect answers a bad one with its message."""
    from localspec.engine.params import GenerationParams
    from localspec.errors import LocalspecError

    def expected(**fields):
        with pytest.raises(LocalspecError) as refused:
            GenerationParams(**fields)
        return str(refused.value)

    name = httpx.get(server.url + "/api/tags").json()["models"][0]["name"]
    messages = [{"role": "user", "content": "Hi"}]
    cases = [({"drafter": "nope"}, expected(drafter="nope")),
             ({"stop": ["x"] * 65}, expected(stop=("x",) * 65)),
             ({"speculative.n_max": 2, "speculative.n_min": 3}, expected(draft_max=2, draft_min=3))]
    for fields, message in cases:
        replies = [post(server, "/v1/chat/completions", {"messages": messages, **fields}),
                   post(server, "/completion", {"prompt": "Hi", **fields}),
                   post(server, "/localspec/v1/generate", {"messages": messages, **fields}),
                   post(server, "/api/chat", {"model": name, "messages": messages, "stream": False,
                                              "options": fields})]  # (Ollama's settings are its options)
        for reply in replies:
            assert reply.status_code == 400, (fields, reply.text)
            error = reply.json().get("error")
            assert (error["message"] if isinstance(error, dict) else error) == message, (fields, reply.text)


# ----------------------------------------------------------------------------- native stream, metrics, socket


def test_native_event_stream_and_metrics_over_the_unix_socket(server):
    mode = stat.S_IMODE(os.stat(server.socket).st_mode)
    assert mode == 0o600
    transport = httpx.HTTPTransport(uds=str(server.socket))
    with httpx.Client(transport=transport, base_url="http://localhost", timeout=60) as client:
        assert client.get("/health").json() == {"status": "ok"}
        with client.stream("POST", "/localspec/v1/generate", json={
                "messages": [{"role": "user", "content": "List three colors, then list them again."}],
                "max_tokens": 24, "drafter": "ngram"}) as r:
            events = [json.loads(line) for line in r.iter_lines() if line]
        assert events[0]["type"] == "prefill" and events[-1]["type"] == "summary"
        rounds = [e for e in events if e["type"] == "round"]
        assert sum(len(e["accepted"]) + (e["token"] is not None) for e in rounds) == events[-1]["generated_tokens"]
        metrics = client.get("/metrics").text
    assert 'localspec_requests_total{model=' in metrics and "localspec_generated_tokens_total" in metrics


# ----------------------------------------------------------------------------- concurrency and disconnects


def test_concurrent_clients_all_complete(server):
    results = []

    def one(i):
        r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": f"Number {i}?"}],
                                                  "max_tokens": 6})
        results.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [200] * 4


def test_two_chats_at_once_each_draft_with_the_draft_model_in_shared_steps(smollm2_path):
    """Two chats asking for the draft model at the same moment: their rounds share steps and both
    draft with it there (the server's one step: a second request does not switch the draft model off),
    each keeps drafted tokens, and each answer is its answer alone."""
    questions = ["List three colors, then list them again.", "Count from one to ten in words."]

    def ask(server, question, into):
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": 32, "temperature": 0,
                "drafter": "model", "draft_len": 3}
        with httpx.stream("POST", server.url + "/localspec/v1/generate", json=body, timeout=120) as r:
            into[question] = [json.loads(line) for line in r.iter_lines() if line]

    with serving(smollm2_path, "smollm2", 2048, slots=2, draft=str(smollm2_path)) as server:
        alone: dict[str, list] = {}
        for question in questions:
            ask(server, question, alone)
        together: dict[str, list] = {}
        threads = [threading.Thread(target=ask, args=(server, q, together)) for q in questions]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for question in questions:
        summary = together[question][-1]
        assert summary["type"] == "summary" and summary["text"] == alone[question][-1]["text"]
        assert summary["drafted_by_drafter"].get("model", 0) > 0 and summary["accepted_by_drafter"].get("model", 0) > 0
        rounds = [e for e in together[question] if e["type"] == "round"]
        assert any(r["shared"] and r["drafter"] == "model" for r in rounds)


def test_a_client_that_disconnects_frees_the_engine_for_the_next(server):
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    # Greedy counting: the model would go on for all 400 tokens (a sampled story may end by itself).
    counting = ", ".join(str(i) for i in range(1, 30)) + ","
    body = json.dumps({"prompt": counting, "n_predict": 400, "temperature": 0, "stream": True}).encode()
    sock.sendall(b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert sock.recv(200).startswith(b"HTTP/1.1 200")
    sock.close()
    metrics = server.served.scheduler.metrics
    generated_before = metrics.generated_tokens
    r = post(server, "/completion", {"prompt": "Hi", "n_predict": 2})
    assert r.status_code == 200
    assert r.json()["tokens_predicted"] >= 1
    # The abandoned generation was cancelled (counted when its summary is), not run to 400 tokens.
    deadline = time.monotonic() + 20
    while metrics.cancelled < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metrics.cancelled >= 1
    assert metrics.generated_tokens - generated_before < 400


# ----------------------------------------------------------------------------- bad input and security


@pytest.mark.parametrize("path,body,needle", [
    ("/completion", b"{not json", "Malformed JSON"),
    ("/completion", {"prompt": "x", "temperature": "hot"}, "'temperature'"),
    ("/completion", {"n_predict": 4}, "'prompt' is required"),
    ("/completion", {"prompt": "x", "n_predict": -7}, "'n_predict'"),
    ("/infill", {"input_suffix": "x"}, "'input_prefix' is required"),
    ("/completion", {"prompt": "word " * 600}, "context"),
    ("/completion", [1, 2, 3], "JSON object"),
    ("/completion", {"prompt": "x", "stop": [f"s{i}" for i in range(100)]}, "at most 64 strings"),
    ("/completion", {"prompt": "x", "stop": "y" * 100_000}, "at most 500 characters"),
])
def test_llama_dialect_bad_input_gets_400_envelopes(server, path, body, needle):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and needle in err["message"], err


def test_openai_and_ollama_error_envelopes(server):
    r = post(server, "/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and "Unknown model 'gpt-4'" in r.json()["error"]["message"]
    r = post(server, "/v1/chat/completions", {"messages": []})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = post(server, "/api/chat", {"model": "llama3", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and "Unknown model" in r.json()["error"]
    r = post(server, "/api/generate", {"prompt": "x"})
    assert r.status_code == 400 and "'model' is required" in r.json()["error"]
    assert httpx.get(server.url + "/health").status_code == 200  # still serving


def test_foreign_host_and_origin_are_refused(server):
    r = httpx.get(server.url + "/health", headers={"Host": "evil.example.com"})
    assert r.status_code == 403 and "not local" in r.text
    r = httpx.post(server.url + "/completion", json={"prompt": "x", "n_predict": 1},
                   headers={"Origin": "https://evil.example.com"})
    assert r.status_code == 403
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}
    ok = httpx.get(server.url + "/health", headers={"Host": "localhost:1234"})
    assert ok.status_code == 200


def test_api_key_is_required_when_configured(smollm2_path, server):
    running = start_in_thread(server.served, api_key="s3cret")
    try:
        assert httpx.get(running.url + "/health").status_code == 200
        r = httpx.get(running.url + "/v1/models")
        assert r.status_code == 401
        r = httpx.get(running.url + "/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
    finally:
        running.stop()


# ----------------------------------------------------------------------------- chat --connect


@pytest.mark.anyio
async def test_chat_connect_streams_from_the_server_over_its_socket(server):
    from localspec.config import ChatSettings, UserConfig
    from localspec.tui.app import create_app
    from localspec.tui.remote import RemoteProvider

    app = create_app(provider=RemoteProvider(server.socket), config=UserConfig(chat=ChatSettings(max_tokens=16)))
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 30
        while app.engine is None:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        assert app.engine_id == server.served.name
        app.prompt.load_text("Say hello")
        await pilot.press("enter")
        while not app.history.messages(app.conversation.id)[1:] or app.generating:
            assert time.monotonic() < deadline + 60
            await pilot.pause(0.05)
        answer = app.history.messages(app.conversation.id)[-1]
        assert answer.status == "complete" and answer.stats["generated_tokens"] >= 1 and answer.content


def test_an_oversized_body_is_refused_before_it_is_read_and_the_server_keeps_answering(server):
    """A 30 MB body was tokenized before the context check refused it: the cap (settings.yaml's
    max_request_mb, 8 MB by default) answers 413 from the headers, or after reading at most the cap of a
    chunked body, and the next request is served."""
    big = b'{"prompt": "' + b"x" * (9 * 2**20) + b'", "n_predict": 4}'
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/completion", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "8 MB" in r.json()["error"]["message"]

        def chunks():
            for _ in range(12):
                yield b"x" * 2**20

        r = client.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "larger than this server accepts" in r.json()["error"]["message"]
        r = client.post("/completion", json={"prompt": "Hello", "n_predict": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["content"]
        chunked_ok = client.post("/completion", content=iter([b'{"prompt": "Hi", ', b'"n_predict": 2}']),
                                 headers={"Content-Type": "application/json"})
        assert chunked_ok.status_code == 200 and "content" in chunked_ok.json()


# ----------------------------------------------------------------------------- what tools send (issue: the rest of the API)


def test_the_documented_curl_examples_work_without_a_content_type(server):
    """Ollama's and llama.cpp's READMEs teach `curl URL -d '{...}'`: curl sends that as a form, and
    both servers read it as JSON whatever the header says."""
    import shutil
    import subprocess

    bodies = {"/api/generate": {"model": server.served.name, "prompt": "Why is the sky blue?", "stream": False,
                                "options": {"num_predict": 4}},
              "/completion": {"prompt": "Building a website can be done in 10 simple steps:", "n_predict": 4},
              "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}}
    for path, body in bodies.items():
        for headers in ({"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain"}, {}):
            r = httpx.post(server.url + path, content=json.dumps(body), headers=headers, timeout=120)
            assert r.status_code == 200, (path, headers, r.text)
        if shutil.which("curl"):  # verbatim, as the READMEs write it
            out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", server.url + path, "-d", json.dumps(body)],
                                 capture_output=True, text=True, timeout=120).stdout
            assert out.endswith("\n200"), (path, out)


@pytest.mark.parametrize("path, raw", [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 3}'),
    ("/completion", '{"prompt": "x\\udfffy", "n_predict": 3}'),
    ("/api/chat", '{"model": "localspec", "messages": [{"role": "user", "content": "\\ud83d"}], "stream": false, '
                  '"options": {"num_predict": 3}}'),
    ("/completion", '{"prompt": "x", "n_predict": 3, "grammar": "root ::= \\"a\\ud800\\" | \\"b\\""}'),
])
def test_a_lone_surrogate_in_the_text_is_read_as_a_replacement_character(server, path, raw):
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path, raw", [
    ("/v1/embeddings", '{"input": "hi", "model": "\\ud800"}'),
    ("/api/embed", '{"model": "\\ud800", "input": "hi"}'),
    ("/v1/chat/completions", '{"model": "a\\udfff", "messages": [{"role": "user", "content": "hi"}]}'),
    ("/v1/embeddings", '{"input": "hi", "encoding_format": "\\ud800"}'),
])
def test_a_lone_surrogate_echoed_in_an_error_is_written_as_its_escape(server, path, raw):
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code in (400, 404) and "\\ud" in r.text and r.json()["error"], r.text


def test_odd_but_valid_fields_never_give_a_500(server):
    seeded = post(server, "/completion", {"prompt": "Hello", "n_predict": 3, "seed": -1, "temperature": 0.8})
    assert seeded.status_code == 200, seeded.text  # -1: llama.cpp's "random", as /props advertises
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for choice in ({"function": "f"}, {"function": 3}, {"type": "function"}):
        r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                                                  "tool_choice": choice, "max_tokens": 3})
        assert r.status_code == 400 and "tool_choice" in r.json()["error"]["message"], r.text
    for calls in ("f", 7, ["f"], [{"function": "f"}], [{"function": 7}]):
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": calls},
                    {"role": "user", "content": "again"}]
        r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 3})
        assert r.status_code == 400 and "tool_calls" in r.json()["error"]["message"], (calls, r.text)


def test_token_ids_outside_the_vocabulary_are_refused(server):
    n_vocab = server.served.engine.target.n_vocab
    good = [1] + [100 + i % 50 for i in range(300)]
    for bad in (n_vocab, -1, 10**9):
        r = post(server, "/completion", {"prompt": good[:250] + [bad] + good[250:], "n_predict": 2})
        assert r.status_code == 400 and "outside this model's vocabulary" in r.json()["error"]["message"], r.text
    r = post(server, "/completion", {"prompt": good[:300], "n_predict": 2})
    assert r.status_code == 200, r.text


def test_health_answers_while_a_large_body_is_tokenized(server):
    """Tokenizing 7 MB of prompt takes seconds; it runs off the event loop, so /health (and every other
    request's response) is served meanwhile. The prompt then exceeds the context: a clear 400."""
    result = {}

    def big():
        result["response"] = httpx.post(server.url + "/completion", timeout=120, json={
            "prompt": "word salad, with punctuation! and 123 numbers\n" * 150_000, "n_predict": 4})
        result["done"] = time.monotonic()

    worker = threading.Thread(target=big)
    worker.start()
    time.sleep(0.8)  # the body is sent and being tokenized
    health = httpx.get(server.url + "/health", timeout=60)
    answered = time.monotonic()
    worker.join()
    assert health.status_code == 200 and answered < result["done"]
    assert result["response"].status_code == 400 and "context" in result["response"].text

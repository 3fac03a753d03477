"""Every dialect's response shapes on a scripted engine, in-process (fast; the real-model tests in
test_server.py drive uvicorn, real clients and a real GGUF)."""

from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from fakes import STEPS, ScriptedEngine
from localspec.server.app import create_server_app
from localspec.server.common import Served
from localspec.server.scheduler import Scheduler

ANSWER = "".join(acc + tok for acc, _rej, tok in STEPS)


def client_for(engine: ScriptedEngine | None = None) -> TestClient:
    engine = engine or ScriptedEngine()
    served = Served(engine=engine, scheduler=Scheduler(engine), name="scripted",
                    aliases=frozenset({"scripted", "localspec"}))
    return TestClient(create_server_app(served), base_url="http://localhost")


@pytest.fixture
def client():
    with client_for() as c:
        yield c
        c.app.state.served.scheduler.close()


def sse(text: str) -> list[str]:
    """The `data:` payloads of an event stream; every event ends with a blank line."""
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: "):] for e in events]


def ndjson(text: str) -> list[dict]:
    assert text.endswith("\n")  # Ollama's clients need the last line ended too
    return [json.loads(line) for line in text.split("\n")[:-1]]


# ----------------------------------------------------------------------------- llama.cpp


def test_llamacpp_completion_is_compact_json_with_timings(client):
    r = client.post("/completion", json={"prompt": "def", "n_predict": 64})
    assert r.status_code == 200 and re.search(rb'"content"\s*:"', r.content)  # what llama.vim matches
    body = r.json()
    assert body["content"] == ANSWER and body["stop_type"] == "eos" and body["stop"] is True
    assert body["tokens_predicted"] == body["timings"]["predicted_n"] > 0
    assert {"prompt_n", "prompt_ms", "predicted_per_second", "first_token_ms", "draft_n",
            "draft_n_accepted"} <= set(body["timings"])


def test_llamacpp_stream_sends_pieces_then_the_result_and_no_done(client):
    r = client.post("/completion", json={"prompt": "def", "stream": True})
    payloads = [json.loads(p) for p in sse(r.text)]
    assert "".join(p["content"] for p in payloads[:-1]) == ANSWER
    assert all(p["stop"] is False for p in payloads[:-1]) and payloads[-1]["stop"] is True
    assert "[DONE]" not in r.text


def test_llamacpp_response_fields_and_warm_up(client):
    warm = client.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 0,
                                        "response_fields": [""]})
    assert warm.status_code == 200 and warm.content == b"{}"
    flat = client.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "x"}],
                                        "response_fields": ["content", "timings/prompt_n", "no/such"]}).json()
    assert flat == {"content": ANSWER, "timings/prompt_n": 10}


def test_llamacpp_several_completions_come_as_an_array(client):
    body = client.post("/completion", json={"prompt": "def", "n_cmpl": 2}).json()
    assert isinstance(body, list) and len(body) == 2 and all(b["content"] == ANSWER for b in body)


def test_llamacpp_health_and_props(client):
    assert client.get("/health").json() == {"status": "ok"}
    props = client.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 4096 and props["total_slots"] == 1


# ----------------------------------------------------------------------------- OpenAI


def test_openai_chat_stream_role_content_finish_usage_done(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                                  "stream_options": {"include_usage": True}})
    payloads = sse(r.text)
    assert payloads[-1] == "[DONE]" and ": ping" not in r.text
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == ANSWER
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_openai_completion_reports_length_when_the_budget_ends_it(client):
    body = client.post("/v1/completions", json={"prompt": "def", "max_tokens": 2}).json()
    assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def test_openai_accepts_llamacpp_extra_fields_and_lists_the_model(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                  "cache_prompt": True, "samplers": ["top_k"], "id_slot": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
    assert client.get("/v1/models").json()["data"][0]["id"] == "scripted"


# ----------------------------------------------------------------------------- Ollama


def test_ollama_generate_streams_ndjson_and_ends_with_the_durations(client):
    lines = ndjson(client.post("/api/generate", json={"model": "scripted", "prompt": "hi"}).text)
    assert "".join(line["response"] for line in lines) == ANSWER
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["done_reason"] == "stop" and lines[-1]["eval_count"] > 0 and lines[-1]["total_duration"] > 0


def test_ollama_chat_and_show_and_tags(client):
    lines = ndjson(client.post("/api/chat", json={"model": "scripted:latest",
                                                  "messages": [{"role": "user", "content": "hi"}]}).text)
    assert "".join(line["message"]["content"] for line in lines) == ANSWER
    assert all(line["message"]["role"] == "assistant" for line in lines)
    show = client.post("/api/show", json={"name": "scripted"}).json()
    assert ".Suffix" in show["template"] and "insert" in show["capabilities"]  # FIM tokens: Continue's test
    assert client.get("/api/tags").json()["models"][0]["name"] == "scripted:latest"


# ----------------------------------------------------------------------------- localspec's own


def test_native_stream_carries_every_event_and_the_drafters():
    with client_for(ScriptedEngine(draft=False)) as client:
        lines = ndjson(client.post("/localspec/v1/generate", json={"prompt": "hi"}).text)
        assert [line["type"] for line in lines] == ["prefill"] + ["round"] * len(STEPS) + ["summary"]
        info = client.get("/localspec/v1/info").json()
        assert info["drafters"] == ["auto", "ngram", "history", "none"] and info["has_draft"] is False
        client.app.state.served.scheduler.close()


# ----------------------------------------------------------------------------- errors, in every dialect


@pytest.mark.parametrize("path, body, kind", [
    ("/completion", {"prompt": "x", "stream": True}, "sse"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True}, "sse"),
    ("/api/generate", {"model": "scripted", "prompt": "x"}, "ndjson"),
    ("/localspec/v1/generate", {"prompt": "x"}, "ndjson"),
])
def test_an_engine_failure_mid_stream_ends_the_stream_with_the_dialects_error(path, body, kind):
    with client_for(ScriptedEngine(fail_after=2)) as client:
        r = client.post(path, json=body)
        last = json.loads(sse(r.text)[-1]) if kind == "sse" else ndjson(r.text)[-1]
        message = last["error"]["message"] if isinstance(last.get("error"), dict) else \
            last.get("error") or last.get("message")
        assert "llama_decode returned -3" in message
        assert client.get("/health").status_code == 200  # still serving
        client.app.state.served.scheduler.close()


@pytest.mark.parametrize("path, body", [
    ("/completion", {"prompt": "x", "drafter": "model"}),
    ("/v1/completions", {"prompt": "x", "drafter": "model"}),
    ("/api/generate", {"model": "scripted", "prompt": "x", "options": {"drafter": "model"}}),
])
def test_an_unavailable_drafter_is_a_400_before_anything_streams(path, body):
    with client_for(ScriptedEngine(draft=False)) as client:
        r = client.post(path, json=body)
        assert r.status_code == 400 and "needs a draft model" in r.text
        client.app.state.served.scheduler.close()


def test_a_foreign_host_header_is_refused(client):
    r = client.post("/completion", json={"prompt": "x"}, headers={"host": "evil.example"})
    assert r.status_code == 403 and "not local" in r.text


# ----------------------------------------------------------------------------- llama.cpp's semantics


def feed_tokens(limits, pieces):
    from localspec.engine.events import Round

    out = ""
    for i, piece in enumerate(pieces):
        out += limits.feed(Round(index=i, drafter="none", accepted=(), rejected=(), token=7, token_kind="plain",
                                 accepted_text="", rejected_text="", token_text=piece, text=piece, draft_s=0.0,
                                 verify_s=0.0, pieces=(piece,)))
        if limits.hit:
            break
    return out


def test_the_time_limit_ends_a_completion_only_with_a_token_that_has_a_newline():
    """llama.cpp (server-context.cpp): once t_max_predict_ms has passed, the completion ends with the
    next token whose text contains a newline, that token included; never in the middle of a line."""
    from localspec.server.llamacpp import Limits

    now = [0.0]
    limits = Limits(t_max_predict_ms=250, clock=lambda: now[0])
    pieces = ["x = 1", "\n", "y", " = 2", "\n    ", "z"]
    out = ""
    for piece, t in zip(pieces, [0.0, 0.1, 0.3, 0.4, 0.5, 0.6]):
        now[0] = t
        out += feed_tokens(limits, [piece])
        if limits.hit:
            break
    assert out == "x = 1\ny = 2\n    " and limits.hit  # not "x = 1\ny": past the limit, but mid-line


def test_n_indent_cuts_the_first_line_indented_less_and_keeps_its_indentation():
    from localspec.server.llamacpp import Limits

    out = feed_tokens(Limits(n_indent=4), ["    a = 1", "\n", "    b", " = 2", "\n", "c", " = 3"])
    assert out == "    a = 1\n    b = 2\n"
    out = feed_tokens(Limits(n_indent=4), ["if x:", "\n", "    a", "\n", "  b"])
    assert out == "if x:\n    a\n  "  # llama.cpp erases from where the text starts, not the indentation


def test_limits_in_a_real_request_end_as_limit_and_are_not_counted_as_cancelled(client):
    body = client.post("/completion", json={"prompt": "def", "n_indent": 8}).json()
    assert body["content"] == "def add(a, b):\n    " and body["stop_type"] == "limit"
    assert "localspec_cancelled_total" in (metrics := client.get("/metrics").text)
    assert 'localspec_cancelled_total{model="scripted"} 0' in metrics


def test_tokens_cached_is_what_the_cache_holds_after_the_request(client):
    body = client.post("/completion", json={"prompt": "def"}).json()
    assert body["tokens_cached"] == body["tokens_evaluated"] + body["tokens_predicted"] - 1


def test_props_has_llama_cpp_shape_and_the_template_text(client):
    props = client.get("/props").json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 4096 and settings["params"]["temperature"] == 0.8
    assert props["chat_template"] == ScriptedEngine().chat_template and props["total_slots"] == 1


def test_stop_types_are_llama_cpps():
    from localspec.engine.events import Prefill, Tally
    from localspec.server.llamacpp import stop_type

    def summary(reason):
        return Tally().summary(text="", stop_reason=reason, prefill=Prefill(1, 1, 0, 0.0), wall_s=1.0,
                               baseline_tokens_per_s=1.0, drafter="auto")

    assert [stop_type(summary(r), False) for r in ("eog", "stop", "length", "context", "cancelled")] == \
        ["eos", "word", "limit", "limit", "none"]
    assert stop_type(summary("cancelled"), True) == "limit"


def test_slots_lists_every_slot_and_metrics_show_what_each_holds(client):
    slots = client.get("/slots").json()
    assert [s["id"] for s in slots] == [0] and {"n_ctx", "is_processing", "n_tokens_cached"} <= set(slots[0])
    assert 'localspec_slot_tokens{model="scripted",slot="0"} 0' in client.get("/metrics").text


def _wait_for(condition, what: str, seconds: float = 20.0) -> None:
    """Poll `condition` until it holds; a busy 2-core machine may take a while, a fixed sleep guesses."""
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_request_whose_client_left_while_it_waited_in_the_queue_is_never_run():
    """An editor abandons a completion the moment the user types on (llama.vim kills its curl); the
    request waiting behind the running one must not then take the engine (real uvicorn, scripted engine).
    This also holds the server's guard to a plain ASGI middleware: Starlette's BaseHTTPMiddleware hides
    a client's disconnect from `request.is_disconnected()`."""
    import threading

    import httpx

    from localspec.server.run import start_in_thread

    hold = threading.Event()
    engine = ScriptedEngine(hold=hold)
    served = Served(engine=engine, scheduler=Scheduler(engine), name="scripted", aliases=frozenset({"scripted"}))
    running = start_in_thread(served)
    try:
        first = threading.Thread(target=lambda: httpx.post(running.url + "/completion", json={"prompt": "a"},
                                                           timeout=30))
        first.start()
        _wait_for(lambda: engine.calls, "the first request to reach the engine")
        assert len(engine.calls) == 1  # the first request holds the engine
        with pytest.raises(httpx.TimeoutException):  # the second waits in the queue; its client gives up
            httpx.post(running.url + "/completion", json={"prompt": "b"}, timeout=0.5)
        queued = served.scheduler._jobs  # the jobs waiting behind the running one
        _wait_for(lambda: queued and all(job is not None and job.cancel.is_set() for job in list(queued)),
                  "the server to notice the second client left")
        hold.set()
        first.join(10)
        _wait_for(lambda: served.scheduler.waiting == 0, "the queue to drain")
        assert len(engine.calls) == 1, engine.calls  # the abandoned request never reached the engine
        assert httpx.post(running.url + "/completion", json={"prompt": "c"}, timeout=10).status_code == 200
        assert len(engine.calls) == 2
    finally:
        hold.set()
        running.stop()
        served.scheduler.close()


@pytest.mark.parametrize("samplers, chain", [
    (["top_k", "top_p", "infill"], ("top_k", "top_p", "infill")),   # llama.vim's completions
    ("kpi", ("top_k", "top_p", "infill")),                           # llama.cpp's letters
    (["dry", "min_p", "temperature"], ("min_p", "temperature")),     # steps the engine lacks are left out
    ([], ()),                                                        # an empty chain: no filters
])
def test_a_requests_sampler_chain_reaches_the_engine(samplers, chain):
    engine = ScriptedEngine()
    with client_for(engine) as c:
        r = c.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")\n", "n_predict": 4,
                                    "samplers": samplers, "top_k": 40, "top_p": 0.9})
        assert r.status_code == 200, r.text
        c.app.state.served.scheduler.close()
    assert engine.calls[-1]["sampling"].samplers == chain

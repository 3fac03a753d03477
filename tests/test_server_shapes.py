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
        assert info["drafters"] == ["auto", "ngram", "none"] and info["has_draft"] is False
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

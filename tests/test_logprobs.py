"""Log-probabilities through every dialect, from a real `localspec serve` on the real test model:
with drafting on they equal plain decoding's (the verify rows are the rows plain decoding has)."""

import json

import httpx
import numpy as np
import pytest

from localspec.engine.events import TokenLogprob
from localspec.engine.sampling import token_logprob
from servers import serving

pytestmark = pytest.mark.model

# An edit: the answer copies its input, so the n-gram drafter drafts and the target accepts.
EDIT = ("Repeat this code exactly, changing nothing:\n\ndef add_all(values):\n    total = 0\n"
        "    for value in values:\n        total = total + value\n    return total\n")
DRAFTED = {"drafter": "ngram", "draft_len": 4}
PLAIN = {"drafter": "none"}


def test_a_token_logprob_is_the_raw_logits_log_softmax():
    logits = np.array([2.0, -1.0, 0.5, 2.0, 3.0], dtype=np.float32)
    out = token_logprob(logits, 2, top=3)
    norm = np.log(np.exp(logits.astype(np.float64)).sum())
    assert out == TokenLogprob(2, pytest.approx(0.5 - norm), out.top)
    assert [t for t, _ in out.top] == [4, 0, 3]  # best first; a tie keeps the vocabulary's order
    assert [v for _, v in out.top] == pytest.approx([3.0 - norm, 2.0 - norm, 2.0 - norm])
    assert token_logprob(logits, 1).top == ()


@pytest.fixture(scope="module")
def server(smollm2_path):
    with serving(smollm2_path, "smollm2", 1024) as running:
        yield running


def _close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) > 0
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-3


def _openai_chat(client, stream: bool, fields: dict):
    args = dict(model="localspec", messages=[{"role": "user", "content": EDIT}], max_tokens=48, temperature=0,
                logprobs=True, top_logprobs=3, extra_body=fields)
    if not stream:
        reply = client.chat.completions.create(**args)
        return reply.choices[0].message.content, reply.choices[0].logprobs.content, reply.model_extra["localspec"]
    text, content, stats = "", [], None
    for chunk in client.chat.completions.create(stream=True, **args):
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        content += choice.logprobs.content if choice.logprobs else []
        stats = chunk.model_extra.get("localspec") or stats
    return text, content, stats


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_chat_logprobs_with_drafting_equal_plain_decodings(server, stream):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    text, drafted, stats = _openai_chat(client, stream, DRAFTED)
    plain_text, plain, plain_stats = _openai_chat(client, stream, PLAIN)
    assert stats["accepted"] > 0 and plain_stats["drafted"] == 0
    assert text == plain_text
    assert "".join(e.token for e in drafted) == text  # one entry per token, in order
    assert [e.token for e in drafted] == [e.token for e in plain]
    _close([e.logprob for e in drafted], [e.logprob for e in plain])
    for entry, other in zip(drafted, plain):
        assert len(entry.top_logprobs) == 3
        assert [t.token for t in entry.top_logprobs] == [t.token for t in other.top_logprobs]
        _close([t.logprob for t in entry.top_logprobs], [t.logprob for t in other.top_logprobs])
        assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-6 and entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_openai_sdk_legacy_completion_logprobs_streamed_and_not(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    args = dict(model="smollm2", prompt=EDIT, max_tokens=24, temperature=0, logprobs=2, extra_body=DRAFTED)
    whole = client.completions.create(**args).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **args)]
    streamed = [lp for c in chunks if c.logprobs for lp in c.logprobs.token_logprobs]
    offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
    assert "".join(whole.logprobs.tokens) == whole.text
    assert whole.logprobs.text_offset[0] == 0 and offsets == whole.logprobs.text_offset
    _close(streamed, whole.logprobs.token_logprobs)
    assert all(len(top) == 2 for top in whole.logprobs.top_logprobs)


def test_llama_cpp_n_probs_streamed_and_not_with_drafting_equal_plain(server):
    body = {"prompt": EDIT, "n_predict": 32, "temperature": 0, "n_probs": 2}
    drafted = httpx.post(server.url + "/completion", json={**body, **DRAFTED}, timeout=120).json()
    plain = httpx.post(server.url + "/completion", json={**body, **PLAIN}, timeout=120).json()
    assert drafted["localspec"]["accepted"] > 0 and drafted["content"] == plain["content"]
    probs, plain_probs = drafted["completion_probabilities"], plain["completion_probabilities"]
    assert [p["id"] for p in probs] == [p["id"] for p in plain_probs] and len(probs) == drafted["tokens_predicted"]
    _close([p["logprob"] for p in probs], [p["logprob"] for p in plain_probs])
    assert all(len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["logprob"] >= p["logprob"] - 1e-6 for p in probs)
    with httpx.stream("POST", server.url + "/completion", json={**body, **DRAFTED, "stream": True}, timeout=120) as r:
        lines = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    streamed = [p for line in lines for p in line.get("completion_probabilities", [])]
    assert [p["id"] for p in streamed] == [p["id"] for p in probs]
    _close([p["logprob"] for p in streamed], [p["logprob"] for p in probs])


def test_ollama_client_logprobs_streamed_and_not(server):
    import ollama

    client = ollama.Client(host=server.url)
    messages = [{"role": "user", "content": EDIT}]
    options = {"temperature": 0, "num_predict": 24, **DRAFTED}
    whole = client.chat(model="smollm2", messages=messages, options=options, logprobs=True, top_logprobs=2)
    parts = list(client.chat(model="smollm2", messages=messages, options=options, logprobs=True, top_logprobs=2,
                             stream=True))
    streamed = [lp for part in parts for lp in (part.logprobs or [])]
    assert "".join(lp.token for lp in whole.logprobs) == whole.message.content
    assert [lp.token for lp in streamed] == [lp.token for lp in whole.logprobs]
    _close([lp.logprob for lp in streamed], [lp.logprob for lp in whole.logprobs])
    assert all(len(lp.top_logprobs) == 2 for lp in whole.logprobs)
    generated = client.generate(model="smollm2", prompt=EDIT, options=options, logprobs=True)
    assert generated.logprobs and all(lp.top_logprobs == [] for lp in generated.logprobs)


@pytest.fixture(scope="module")
def kquant_server(qwen_coder_path):
    with serving(qwen_coder_path, "qwen", 1024) as running:
        yield running


def test_a_k_quant_targets_logprobs_with_drafting_are_plain_decodings(kquant_server):
    """On a Q4_K_M file llama.cpp's batched kernels (from 4 rows) sum in another order than its
    one-token ones: a request that asks for log-probabilities verifies at most 3 positions
    (speculative.EXACT_VERIFY_POSITIONS), so its drafted answer's numbers are still plain decoding's."""
    from openai import OpenAI

    client = OpenAI(base_url=kquant_server.url + "/v1", api_key="unused")
    text, drafted, stats = _openai_chat(client, False, DRAFTED)
    plain_text, plain, _ = _openai_chat(client, False, PLAIN)
    assert stats["accepted"] > 0 and max(i for i, rate in enumerate(stats["acceptance_by_position"]) if rate) <= 1
    assert text == plain_text
    _close([e.logprob for e in drafted], [e.logprob for e in plain])

"""The engine on the real llama.cpp with the real test model (SmolLM2-135M)."""

import threading

import numpy as np
import pytest

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.loader import load
from localspec.engine.backend import Model, ModelOptions
from localspec.engine.events import Prefill, Round, Summary, answer_tokens
from localspec.errors import ContextOverflowError, IncompatiblePairError

pytestmark = pytest.mark.model

# A 2-core AVX-512 CPU's verify costs by batch size, over one position's (docs/performance.md's table)
CPU_COSTS = {n: 0.03 * r for n, r in {1: 1.0, 2: 1.79, 3: 2.41, 4: 3.04, 6: 4.39, 8: 7.08, 12: 8.3, 16: 8.3,
                                      24: 12.05, 32: 13.55, 48: 18.69, 64: 22.92}.items()}

EDIT_PROMPT = (
    "Rename the variable `total` to `acc` in this function and change nothing else:\n\n"
    "def add_all(values):\n    total = 0\n    for value in values:\n        total = total + value\n"
    "    return total\n"
)


@pytest.fixture(scope="module")
def target(smollm2_path):
    model = Model(smollm2_path, ModelOptions(n_ctx=1024))
    yield model
    model.close()


@pytest.fixture(scope="module")
def weak_draft(smollm2_q2k_path):
    model = Model(smollm2_q2k_path, ModelOptions(n_ctx=1024))
    yield model
    model.close()


def _assert_every_token_is_the_target_argmax(model_path, prompt, out, tolerance=0.05, exact_share=0.95):
    """Re-run prompt + answer through a fresh context in one batch and compare position by position.

    llama.cpp's batched and single-token kernels are not bit-identical, so a near-tie may flip; the
    emitted token must then still be within `tolerance` of the best logit.
    """
    checker = Model(model_path, ModelOptions(n_ctx=1024))
    try:
        seq = list(prompt) + list(out)
        rows = checker.decode(seq, 0, list(range(len(prompt) - 1, len(seq) - 1)))
    finally:
        checker.close()
    exact = 0
    for row, tok in zip(rows, out):
        best = float(row.max())
        assert row[tok] >= best - tolerance, f"token {tok} logit {row[tok]} vs best {best}"
        exact += int(np.argmax(row) == tok)
    assert exact >= exact_share * len(out)


@pytest.mark.parametrize("drafter", ["ngram", "model", "auto"])
def test_greedy_tokens_are_the_targets_argmax(smollm2_path, target, weak_draft, drafter):
    engine = Engine(target, weak_draft, EngineOptions(drafter=drafter, draft_len=4))
    engine.reset()
    prompt = engine.chat_tokens([{"role": "user", "content": EDIT_PROMPT}])
    events = list(engine.generate(prompt, max_tokens=64))
    out = answer_tokens(events)
    s = events[-1]
    assert isinstance(s, Summary) and s.generated_tokens == len(out) > 10
    assert s.drafted > 0, "the drafter must have proposed something on an edit prompt"
    _assert_every_token_is_the_target_argmax(smollm2_path, prompt, out)
    rounds = [e for e in events if isinstance(e, Round)]
    assert s.accepted == sum(len(r.accepted) for r in rounds)
    assert s.drafted == sum(len(r.accepted) + len(r.rejected) for r in rounds)
    assert s.text == "".join(r.text for r in rounds)
    if drafter == "model":
        # The Q2_K requantization really disagrees with its Q4_1 original at times.
        assert 0.2 < s.acceptance_rate < 1.0
    assert s.baseline_tokens_per_s > 0 and s.speedup > 0


def test_a_regenerated_greedy_answer_is_replayed_whole_by_llama_cpp(target):
    """The first answer is decoded one token at a time, the regeneration verified in batches (other
    kernels, docs/findings.md): the replay of the recorded answer keeps it token for token. Priced
    by a CPU's verify costs, given (calibrated here, they follow whatever else the machine is doing, and
    so would the draft lengths)."""
    target.clear()  # (an engine calibrating would have emptied the cache the module's other engines left)
    engine = Engine(target, None, EngineOptions(drafter="auto", learn_costs=False), cost=CostModel(CPU_COSTS))
    engine.reset()
    prompt = engine.chat_tokens([{"role": "user", "content": "Describe a lighthouse at night in four sentences."}])
    first = answer_tokens(engine.generate(prompt, max_tokens=64, drafter="none"))
    again = list(engine.generate(prompt, max_tokens=64))
    assert answer_tokens(again) == first and len(first) > 30
    summary = again[-1]
    assert summary.accepted_by_drafter.get("history", 0) == summary.drafted == summary.accepted  # none rejected
    assert summary.rounds * 4 <= len(first)


def test_sampling_runs_with_a_real_draft(target, weak_draft):
    from localspec.engine.sampling import SamplingSettings

    engine = Engine(target, weak_draft, EngineOptions(drafter="model", draft_len=3))
    events = list(engine.generate("Once upon a time", max_tokens=40,
                                  sampling=SamplingSettings(temperature=0.7, seed=1)))
    again = list(engine.generate("Once upon a time", max_tokens=40,
                                 sampling=SamplingSettings(temperature=0.7, seed=1)))
    assert events[-1].generated_tokens == 40
    assert events[-1].text == again[-1].text  # a seed makes a sampled answer repeatable


def test_follow_up_turn_evaluates_only_the_new_tokens(target, weak_draft):
    engine = Engine(target, weak_draft, EngineOptions(drafter="auto"))
    engine.reset()
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colors."}]
    first = list(engine.chat(messages, max_tokens=24))
    assert isinstance(first[0], Prefill) and first[0].cached == 0
    messages += [{"role": "assistant", "content": first[-1].text}, {"role": "user", "content": "And two more?"}]
    prompt2 = engine.chat_tokens(messages)
    new_tokens = len(engine.chat_tokens([{"role": "user", "content": "And two more?"}]))
    second = list(engine.chat(messages, max_tokens=8))
    prefill = second[0]
    assert prefill.prompt_tokens == len(prompt2)
    # Only the tail changed: the new user turn (its template wrapping included) and the end of the
    # previous answer, never the conversation before it.
    assert prefill.evaluated <= new_tokens + 8
    assert prefill.cached >= first[0].prompt_tokens


def test_cache_reuse_moves_a_cached_run_in_llama_cpp_and_the_answer_is_the_fresh_one(smollm2_path, target):
    """A prompt whose middle dropped out (an editor's window slid): the cached text after the gap is
    shifted in llama.cpp's KV cache (its K-shift), not evaluated again, and the greedy answer is the one
    a fresh cache gives, up to the shift's rounding: keys rotated in the f16 cache are not the keys
    computed at their new positions (the logits move by up to 1.4-2.6 at some vocabulary entry, in
    AVX2 and AVX-512 builds alike), so near ties may go the other way, while every token stays close
    to the fresh evaluation's best (0.6 at most measured) and most are its argmax."""
    vocab = target.vocab
    head = vocab.tokenize("def add(a, b):\n    return a + b\n\n", add_special=True)
    gap = vocab.tokenize("def sub(a, b):\n    return a - b\n\n", add_special=False)
    tail = vocab.tokenize("def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n    return", add_special=False)
    assert target.can_shift
    engine = Engine(target, None, EngineOptions(drafter="none", cache_reuse=8))
    engine.reset()
    list(engine.generate(head + gap + tail, max_tokens=4))
    prompt = head + tail
    events = list(engine.generate(prompt, max_tokens=12))
    assert events[0].cached == len(prompt) - 1 and events[0].evaluated == 1
    _assert_every_token_is_the_target_argmax(smollm2_path, prompt, answer_tokens(events), tolerance=1.0,
                                             exact_share=0.7)


def test_cancel_mid_answer_then_the_next_call_works(target):
    engine = Engine(target, None, EngineOptions(drafter="ngram"))
    cancel = threading.Event()
    events = []
    for event in engine.generate("Count from one to fifty:", max_tokens=200, cancel=cancel):
        events.append(event)
        if isinstance(event, Round) and event.index == 3:
            cancel.set()
    assert events[-1].stop_reason == "cancelled"
    fresh = list(engine.generate("Count from one to five:", max_tokens=10))
    assert fresh[-1].generated_tokens == 10


def test_prompt_longer_than_the_context_is_a_clear_error(target):
    engine = Engine(target, None, EngineOptions(drafter="none"))
    with pytest.raises(ContextOverflowError, match="context window holds 1024"):
        engine.generate("word " * 3000, max_tokens=5)
    assert list(engine.generate("Hello", max_tokens=3))[-1].generated_tokens == 3


def test_load_refuses_an_incompatible_draft(smollm2_path, tmp_path):
    from ggufs import write_vocab_only

    other = write_vocab_only(smollm2_path, tmp_path / "other.gguf", rename_token=(999, "nope"))
    with pytest.raises(IncompatiblePairError, match="token 999"):
        load(str(smollm2_path), draft=str(other), drafter="model", n_ctx=256)


def test_draft_with_a_smaller_context_stops_drafting_instead_of_failing(smollm2_path, target):
    small = Model(smollm2_path, ModelOptions(n_ctx=256))
    try:
        assert small.n_ctx < target.n_ctx
        engine = Engine(target, small, EngineOptions(drafter="model", draft_len=3))
        events = list(engine.generate("word " * 300, max_tokens=12))
        assert events[-1].generated_tokens == 12
        assert events[-1].drafted == 0  # the prompt alone overflows the draft's context
    finally:
        small.close()


def test_a_decode_that_fails_after_its_first_chunk_leaves_the_cache_as_it_was(smollm2_path):
    """llama.cpp refuses a batch with an invalid token id after the batches before it went in: the
    sequence forgets them, so the cache holds what KvSequence says and the next request works."""
    from localspec.engine.kv import KvSequence
    from localspec.errors import LocalspecError

    model = Model(smollm2_path, ModelOptions(n_ctx=256, n_batch=32))
    try:
        kv = KvSequence(model)
        kv.extend([1, 100, 101])
        with pytest.raises(LocalspecError):
            kv.extend([200 + i for i in range(40)] + [model.n_vocab + 5])  # the bad id in the second batch
        assert kv.tokens == [1, 100, 101]
        logits = kv.extend([102], [0])[0]
        fresh = Model(smollm2_path, ModelOptions(n_ctx=256, n_batch=32))
        try:
            np.testing.assert_allclose(logits, fresh.decode([1, 100, 101, 102], 0, [3])[0], atol=1e-3)
        finally:
            fresh.close()
    finally:
        model.close()

"""Exactness of the speculative loop on a deterministic in-process model."""

import threading
from collections import Counter

import numpy as np
import pytest

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.drafters import Draft, Drafter, Offer
from localspec.engine.events import Prefill, Round, Summary
from localspec.engine.events import answer_tokens as _tokens
from localspec.engine.sampling import SamplingSettings
from localspec.errors import LocalspecError
from toy import CpuScript, RecurrentToy, TWO_TOKEN_TOY, ToyBlock, ToyHead, ToyModel, exact_two_tokens, step_until_done, submit_one

COST = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}  # verification almost free per extra position


def _engine(draft=True, drafter="auto", draft_len=None, noise=1.5, seed=3, cost=COST, draft_cost=0.01):
    target = ToyModel(seed=seed)
    draft_model = ToyModel(seed=seed, noise_seed=seed + 100, noise=noise) if draft else None
    # Costs are given, not learned: the toy's real microsecond timings would say nothing useful.
    return Engine(target, draft_model, EngineOptions(drafter=drafter, draft_len=draft_len, learn_costs=False),
                  cost=CostModel(dict(cost)), draft_cost_s=draft_cost)


def _plain(prompt, n, seed=3, model=None):
    model = model or ToyModel(seed=seed)
    ctx = list(prompt)
    model.decode(ctx[:-1], 0, [])
    out = []
    for _ in range(n):
        logits = model.decode([ctx[-1]], len(ctx) - 1, [0])[0]
        tok = int(np.argmax(logits))
        if tok == 1:
            break
        ctx.append(tok)
        out.append(tok)
    return out


PROMPTS = [[0, 5, 9, 11], [0, 7], [0, 20, 21, 22, 23, 20, 21, 22], [0, 4, 4, 4, 4], [0, 30, 2, 3, 17]]


@pytest.mark.parametrize("drafter, draft_len", [("model", 1), ("model", 3), ("model", 6), ("ngram", 2),
                                                ("ngram", 5), ("auto", None), ("model", None), ("auto", 4)])
def test_greedy_speculative_equals_plain_token_for_token(drafter, draft_len):
    engine = _engine(drafter=drafter, draft_len=draft_len)
    for prompt in PROMPTS:
        events = list(engine.generate(prompt, max_tokens=60))
        assert _tokens(events) == _plain(prompt, 60)
        summary = events[-1]
        assert isinstance(summary, Summary)
        assert summary.generated_tokens == len(_tokens(events))


@pytest.mark.parametrize("drafter, draft_len", [("model", 3), ("ngram", 4), ("none", None)])
def test_log_probabilities_of_a_drafted_answer_are_plain_decodings(drafter, draft_len):
    """Every emitted token's log-probability comes from the verify row before it: the row plain
    decoding computes at that position, drafted or not."""
    from localspec.engine.sampling import softmax

    prompt = [0, 20, 21, 22, 23, 20, 21, 22]
    events = list(_engine(drafter=drafter, draft_len=draft_len).generate(
        prompt, max_tokens=40, sampling=SamplingSettings(logprobs=2)))
    rounds = [e for e in events if isinstance(e, Round)]
    tokens = _tokens(events)
    logprobs = [lp for r in rounds for lp in r.logprobs]
    assert [lp.token for lp in logprobs] == tokens == _plain(prompt, 40)
    if drafter != "none":
        assert events[-1].accepted > 0
    plain = ToyModel(seed=3)
    context = list(prompt)
    plain.decode(context[:-1], 0, [])
    for token, lp in zip(tokens, logprobs):
        row = plain.decode([context[-1]], len(context) - 1, [0])[0]
        p = softmax(row)
        assert lp.logprob == pytest.approx(float(np.log(p[token])), abs=1e-9)
        assert [t for t, _ in lp.top] == list(np.argsort(-row, kind="stable")[:2])
        assert lp.top[0][1] >= lp.top[1][1] and lp.top[0][1] >= lp.logprob - 1e-12
        context.append(token)
    assert all(not r.logprobs for r in _engine().generate(prompt, max_tokens=8) if isinstance(r, Round))


def test_a_client_that_leaves_during_a_long_prompt_stops_its_evaluation_between_chunks():
    from localspec.engine.parallel import PROMPT_CHUNK as PREFILL_CHUNK

    cancel = threading.Event()

    class Leaving(ToyModel):
        def decode(self, tokens, start, logits_for, seq=0):
            if len(tokens) == PREFILL_CHUNK:
                cancel.set()  # the client leaves while the first chunk is evaluated
            return super().decode(tokens, start, logits_for, seq)

    target = Leaving(seed=3, n_ctx=2048)
    engine = Engine(target, None, EngineOptions(drafter="none", learn_costs=False), cost=CostModel(dict(COST)))
    prompt = [0] + [5 + i % 40 for i in range(1500)]
    events = list(engine.generate(prompt, max_tokens=8, cancel=cancel))
    assert isinstance(events[0], Prefill) and events[0].evaluated == PREFILL_CHUNK
    assert target.calls == [(0, PREFILL_CHUNK)]
    assert events[-1].stop_reason == "cancelled" and events[-1].generated_tokens == 0
    again = list(engine.generate(prompt, max_tokens=20))  # the slot held a consistent prefix: reused
    assert again[0].cached == PREFILL_CHUNK
    assert _tokens(again) == _plain(prompt, 20, model=Leaving(seed=3, n_ctx=2048))


def test_rounds_add_up_to_the_summary():
    engine = _engine(drafter="model", draft_len=4)
    events = list(engine.generate([0, 5, 9, 11], max_tokens=80))
    rounds = [e for e in events if isinstance(e, Round)]
    s = events[-1]
    assert isinstance(events[0], Prefill) and events[0].prompt_tokens == 4
    assert s.drafted == sum(r.drafted for r in rounds) > 0
    assert s.accepted == sum(len(r.accepted) for r in rounds)
    assert 0 < s.acceptance_rate < 1  # the noisy draft is right sometimes, wrong sometimes
    assert s.text == "".join(r.text for r in rounds)
    assert s.drafted_by_position[0] >= s.drafted_by_position[-1]
    assert s.acceptance_by_position[0] == pytest.approx(
        sum(1 for r in rounds if r.accepted) / sum(1 for r in rounds if r.drafted))


def test_kv_after_speculation_is_exactly_what_plain_decoding_leaves():
    engine = _engine(drafter="model", draft_len=5)
    prompt = [0, 5, 9, 11]
    events = list(engine.generate(prompt, max_tokens=30))
    out = _tokens(events)
    # The cache holds exactly the tokens a plain greedy run would have evaluated: the answer (and,
    # when max_tokens cut a round short, the target-verified tokens after it), nothing rejected.
    held = engine.target.tokens
    assert held[: len(prompt) + len(out) - 1] == prompt + out[:-1]
    assert held == prompt + _plain(prompt, len(held) - len(prompt))
    assert engine.kv.tokens == held


def test_no_position_is_evaluated_twice_needlessly():
    engine = _engine(drafter="model", draft_len=3, noise=0.0)  # a perfect draft
    prompt = [0, 5, 9, 11]
    events = list(engine.generate(prompt, max_tokens=40))
    n = len(_tokens(events))
    # Perfect draft: each round verifies pending + 3 and keeps all. Target positions evaluated:
    # the prompt once, plus one batch per round, none of it repeated.
    rounds = [e for e in events if isinstance(e, Round) and e.drafted]
    assert all(len(r.rejected) == 0 for r in rounds)
    assert engine.target.evaluated == len(prompt) - 1 + sum(1 + r.drafted for r in rounds)
    # The draft model never evaluates a position twice either: its cache only grows.
    starts = [start for start, _n in engine.draft.calls]
    assert starts == sorted(starts)
    assert n == 40


@pytest.mark.parametrize("draft_len", [1, 2, 5])
def test_a_recurrent_target_drafts_within_its_rollback_and_answers_as_plain(draft_len):
    """A target whose state rolls back at most 2 positions (a hybrid model's snapshots): drafts are cut to
    2, every answer equals plain decoding's, and a follow-up that parts from the cache inside the answer
    goes back to the prompt's checkpoint, not to the first token."""
    target = RecurrentToy(seed=3, max_rollback=2)
    engine = Engine(target, ToyModel(seed=3, noise_seed=103, noise=1.5),
                    EngineOptions(drafter="model", draft_len=draft_len, learn_costs=False),
                    cost=CostModel(dict(COST)), draft_cost_s=0.01)
    for prompt in PROMPTS:
        events = list(engine.generate(prompt, max_tokens=40))
        assert _tokens(events) == _plain(prompt, 40)
        assert max(e.drafted for e in events if isinstance(e, Round)) == min(draft_len, 2)
        assert sum(len(e.rejected) for e in events if isinstance(e, Round)) > 0
    prompt = [0, 5, 9, 11, 12, 13, 14, 15]
    out = _tokens(engine.generate(prompt, max_tokens=20))
    calls = len(target.calls)
    edited = prompt + out[:5] + [(out[5] + 1) % target.n_vocab]
    events = list(engine.generate(edited, max_tokens=5))
    assert _tokens(events) == _plain(edited, 5)
    # evaluated again from the prompt's checkpoint (all but its last token), not from the first token
    assert target.calls[calls] == (len(prompt) - 1, 1 + 5)


def test_follow_up_evaluates_only_the_new_suffix():
    engine = _engine(drafter="model", draft_len=3)
    first = [0, 5, 9, 11]
    out = _tokens(engine.generate(first, max_tokens=20))
    second = first + out + [12, 13, 14]
    prefill = next(iter(engine.generate(second, max_tokens=5)))
    assert isinstance(prefill, Prefill)
    assert prefill.cached == len(first) + len(out) - 1
    assert prefill.evaluated == 4  # the pending last answer token + three new ones


def test_sampling_reproduces_the_target_distribution():
    """Two-token continuations at temperature 1: speculative with a deliberately wrong draft vs exact p."""
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    prompt = [0, 5, 6]
    toy = TWO_TOKEN_TOY
    exact = exact_two_tokens(prompt, **toy)

    engine = Engine(ToyModel(**toy), ToyModel(**toy, noise_seed=9, noise=3.0),
                    EngineOptions(drafter="model", draft_len=3, learn_costs=False),
                    cost=CostModel(dict(COST)), draft_cost_s=0.0)
    engine.drafter("model").p_min = 0.0
    trials = 10_000
    counts = Counter()
    accepted = rejected = 0
    for seed in range(trials):
        events = list(engine.generate(prompt, max_tokens=2, sampling=settings.with_(seed=seed)))
        counts[tuple(_tokens(events)[:2])] += 1
        accepted += events[-1].accepted
        rejected += events[-1].drafted - events[-1].accepted
    assert accepted > 0 and rejected > 0  # the draft is both right and wrong, so both paths are exercised
    tv = 0.5 * sum(abs(counts.get(k, 0) / trials - v) for k, v in exact.items())
    # Sampling noise alone gives about 0.03 here; a wrong acceptance rule gives several times more.
    assert tv < 0.06, tv


def _mtp_engine(toy: dict, noise: float, max_steps: int | None = None) -> Engine:
    target = ToyModel(**toy)
    target.mtp = ToyHead(target, ToyModel(**toy, noise_seed=11, noise=noise), max_steps=max_steps)
    engine = Engine(target, None, EngineOptions(drafter="mtp", learn_costs=False, history_drafts=False),
                    cost=CostModel(dict(COST)), draft_cost_s=0.0)
    engine.drafter("mtp").p_min = 0.0
    return engine


def _greedy_rounds_as_plain(engine: Engine) -> list[Round]:
    """The rounds of greedy answers to one prompt at draft lengths 1, 3, 7 and adaptive, each answer
    checked equal to plain decoding's; some drafts were kept and some thrown away."""
    prompt = [0, 5, 9, 11]
    plain = _plain(prompt, 40)
    rounds: list[Round] = []
    for draft_len in (1, 3, 7, None):
        events = list(engine.generate(prompt, max_tokens=40, draft_len=draft_len))
        assert _tokens(events) == plain, draft_len
        rounds += [e for e in events if isinstance(e, Round)]
    assert sum(len(r.accepted) for r in rounds) > 0 and sum(len(r.rejected) for r in rounds) > 0
    return rounds


def test_mtp_drafts_keep_greedy_answers_equal_to_plain_decoding():
    engine = _mtp_engine(dict(seed=3), noise=1.5)
    assert all(r.drafter in ("mtp", "none") for r in _greedy_rounds_as_plain(engine))
    head = engine.target.mtp
    assert head.steps > 0 and len(head.forgotten) > 0  # each draft's positions dropped again


def test_chained_heads_draft_no_further_than_their_heads():
    """Heads that llama.cpp chains (one per draft token) cap every draft, fixed lengths too; the toy head
    asserts no step runs past them."""
    engine = _mtp_engine(dict(seed=3), noise=1.5, max_steps=2)
    assert engine.drafter("mtp").max_len == 2
    rounds = _greedy_rounds_as_plain(engine)
    assert max(r.drafted for r in rounds) == 2


def _two_tokens_sampled(engine: Engine, trials: int = 10_000) -> tuple[int, int, float]:
    """Two-token continuations of [0, 5, 6] at temperature 1 with 3-token drafts, one per seed: the draft
    tokens kept and thrown away, and the total variation from the exact distribution."""
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    prompt = [0, 5, 6]
    exact = exact_two_tokens(prompt, **TWO_TOKEN_TOY)
    counts: Counter = Counter()
    accepted = rejected = 0
    for seed in range(trials):
        events = list(engine.generate(prompt, max_tokens=2, sampling=settings.with_(seed=seed), draft_len=3))
        counts[tuple(_tokens(events)[:2])] += 1
        accepted += events[-1].accepted
        rejected += events[-1].drafted - events[-1].accepted
    return accepted, rejected, 0.5 * sum(abs(counts.get(k, 0) / trials - v) for k, v in exact.items())


def test_sampling_with_mtp_drafts_reproduces_the_target_distribution():
    engine = _mtp_engine(TWO_TOKEN_TOY, noise=3.0)
    accepted, rejected, tv = _two_tokens_sampled(engine)
    assert accepted > 0 and rejected > 0
    assert tv < 0.06, tv  # as the draft model's test: noise alone about 0.03


def _block_engine(toy: dict, noise: float) -> tuple[Engine, ToyBlock]:
    target = ToyModel(**toy)
    block = ToyBlock(target, ToyModel(**toy, noise_seed=13, noise=noise))
    engine = Engine(target, None, EngineOptions(drafter="dflash", learn_costs=False, history_drafts=False),
                    cost=CostModel(dict(COST)), draft_cost_s=0.0, dflash=block)
    engine.drafter("dflash").p_min = 0.0
    return engine, block


def test_block_drafts_keep_greedy_answers_equal_to_plain_decoding():
    engine, block = _block_engine(dict(seed=3), noise=1.5)
    _greedy_rounds_as_plain(engine)
    # the block is as long whatever the draft keeps of it: 3 masks, or the longer fixed length asked for
    assert {n for _pos, n in block.passes} == {3, 7}


def test_sampling_with_block_drafts_reproduces_the_target_distribution():
    engine, _block = _block_engine(TWO_TOKEN_TOY, noise=3.0)
    accepted, rejected, tv = _two_tokens_sampled(engine)
    assert accepted > 0 and rejected > 0
    assert tv < 0.06, tv  # as the draft model's test: noise alone about 0.03


def test_cancellation_between_rounds_keeps_the_session_consistent():
    engine = _engine(drafter="model", draft_len=2)
    cancel = threading.Event()
    events = []
    for event in engine.generate([0, 5, 9, 11], max_tokens=200, cancel=cancel):
        events.append(event)
        if isinstance(event, Round) and event.index == 2:
            cancel.set()
    assert events[-1].stop_reason == "cancelled"
    assert len([e for e in events if isinstance(e, Round)]) == 3
    assert _tokens(engine.generate([0, 5, 9, 11], max_tokens=30)) == _plain([0, 5, 9, 11], 30)


def test_adaptive_length_drafts_nothing_when_drafting_cannot_pay():
    # Verification costs grow linearly (no batching benefit) and the draft model is slow and wrong.
    engine = _engine(drafter="model", noise=50.0, cost={1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}, draft_cost=0.5)
    events = list(engine.generate([0, 5, 9, 11], max_tokens=60))
    rounds = [e for e in events if isinstance(e, Round)]
    # Not even probes: with these costs a draft could not pay even if it were nearly always right.
    assert all(r.drafter == "none" for r in rounds)
    assert _tokens(events) == _plain([0, 5, 9, 11], 60)


def test_a_draft_model_judged_bad_is_still_probed_now_and_then():
    # Cheap verification and a perfect, cheap draft model whose record says it is always wrong.
    engine = _engine(drafter="model", noise=0.0, draft_cost=0.001)
    engine.drafter("model").p_min = 0.0
    acceptance = engine.drafter("model").acceptance
    acceptance.tried = [4000.0] * 8
    acceptance.kept = [0.0] * 8
    rounds = [e for e in engine.generate([0, 5, 9, 11], max_tokens=200) if isinstance(e, Round)]
    probes = [i for i, r in enumerate(rounds) if r.drafter == "model"]
    assert probes[0] >= engine.drafting.probing.every - 1 and all(len(rounds[i].accepted) == 1 for i in probes)
    assert probes[2] - probes[1] > probes[1] - probes[0]       # each probe doubles the wait for the next
    learnt = engine.drafter("model").acceptance  # the request's record, kept when it ended
    assert learnt is not acceptance and learnt.kept[0] > 0  # and what they found counts


def test_a_draft_model_that_cannot_pay_costs_nothing():
    """No prefill, no catch-up: the draft model's cache is never touched when drafting cannot pay."""
    engine = _engine(drafter="auto", noise=50.0, cost={1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}, draft_cost=0.5)
    events = list(engine.generate([0, 5, 9, 11, 13, 17], max_tokens=40))
    assert engine.draft.evaluated == 0 and engine.draft.calls == []
    assert _tokens(events) == _plain([0, 5, 9, 11, 13, 17], 40)


def test_a_draft_model_expected_to_pay_is_ready_before_the_first_round():
    engine = _engine(drafter="auto", noise=0.0, draft_cost=0.001)
    prompt = [0, 5, 9, 11, 13, 17]
    events = engine.generate(prompt, max_tokens=10)
    assert isinstance(next(events), Prefill)
    assert engine.draft.tokens == prompt  # prefilled with the prompt, counted as prompt time
    list(events)


def test_a_lazy_draft_catches_up_only_when_the_rest_of_the_answer_repays_it():
    engine = _engine(drafter="model", noise=0.0, draft_cost=0.05)
    planner = engine.planner_for("model", None, budget=1)
    context = list(range(4, 44)) * 10  # 400 tokens the draft model has not seen
    rate = 3.0 / engine.cost.verify(1)
    turn = planner.turn("model")
    assert turn.behind(context) == len(context)
    assert not turn.catch_up_pays(context, rate, planner.plan)
    planner.remaining = lambda: 10_000
    assert turn.catch_up_pays(context, rate, planner.plan)


def test_the_longest_drafts_are_lengths_the_planner_can_choose():
    """Lengths are chosen where the verify batch (k + 1 positions) was calibrated: the limits must be such lengths."""
    from localspec.engine.measuring import CALIBRATION_SIZES
    from localspec.engine.drafters import CopyDrafter, HistoryDrafter, ModelDrafter

    for drafter in (CopyDrafter, HistoryDrafter, ModelDrafter):
        assert drafter.max_len + 1 in CALIBRATION_SIZES


def test_each_request_prices_copies_from_the_priors_again():
    """What copies did in one request (an edit copies its input; a story does not) says little about
    the next: each request's copies start from the priors, so a bad request cannot lock the lookup
    out, and a request running beside it keeps its own record."""
    engine = _engine(draft=False, drafter="ngram")
    first = engine.planner_for("ngram", None, prompt=[0, 20, 21, 22, 23, 24, 25])
    context = [0, 20, 21, 22, 23, 24, 25, 20, 21, 22, 23]  # the answer copies its prompt, 4 tokens so far
    draft = first.draft(context, 8, None)
    assert draft.tokens  # a copy of 24, 25, 20, 21...
    first.observe(draft, 0, 0.01, len(draft.tokens) + 1, 99)
    assert any(sum(copies.tried) > 0 for copies in first.turn("ngram").acceptance.values())
    second = engine.planner_for("ngram", None, prompt=[0, 1])
    assert all(sum(copies.tried) == 0 for copies in second.turn("ngram").acceptance.values())
    assert any(sum(copies.tried) > 0 for copies in first.turn("ngram").acceptance.values())


def test_adaptive_length_drafts_long_when_the_draft_is_right_and_cheap():
    engine = _engine(drafter="model", noise=0.0, draft_cost=0.001)
    engine.drafter("model").p_min = 0.0
    events = list(engine.generate([0, 5, 9, 11], max_tokens=60))
    s = events[-1]
    assert s.acceptance_rate == 1.0
    assert s.rounds < 20 and s.mean_accepted_per_round > 3


def test_stop_strings_and_eog_and_utf8_across_tokens():
    engine = _engine(draft=False, drafter="none")
    full = _plain([0, 5, 9, 11], 60)
    text = "".join(f"w{t} " if t > 3 else "" for t in full)
    stop_word = f"w{full[5]} "
    events = list(engine.generate([0, 5, 9, 11], max_tokens=60, stop=[stop_word]))
    s = events[-1]
    assert s.stop_reason == "stop"
    assert s.text == text[: text.index(stop_word)]
    assert "".join(e.text for e in events if isinstance(e, Round)) == s.text

    from localspec.engine.session import TextStream
    stream = TextStream(stop=["END"])
    assert stream.feed("é".encode()[:1]) == ("", "")
    assert stream.feed("é".encode()[1:] + b"ab EN") == ("éab EN", "éab ")
    assert stream.feed(b"D tail") == ("D tail", "")
    assert stream.text == "éab " and stream.stopped


def test_prompt_longer_than_the_context_is_refused_before_decoding():
    from localspec.errors import ContextOverflowError

    engine = _engine()
    with pytest.raises(ContextOverflowError, match="context window"):
        engine.generate(list(range(4, 40)) * 20, max_tokens=5)
    assert engine.target.evaluated == 0
    assert _tokens(engine.generate([0, 5], max_tokens=5)) == _plain([0, 5], 5)


def test_generation_stops_cleanly_when_the_context_fills():
    engine = Engine(ToyModel(seed=3, n_ctx=40, eos_bias=-50), None, EngineOptions(drafter="ngram", learn_costs=False),
                    cost=CostModel(dict(COST)))
    s = list(engine.generate([0, 5, 9], max_tokens=500))[-1]
    assert s.stop_reason == "context"
    assert s.generated_tokens == 40 - 3 + 1  # every free position filled, the last token pending


def test_ngram_lookup_realigns_with_its_source_after_an_edit():
    from localspec.engine.drafters import NgramDrafter
    from localspec.engine.sampling import Sampler

    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    other = [30, 13, 99, 98]  # an unrelated, later occurrence of token 13
    prompt = source + other
    ngram = NgramDrafter()
    sampler = Sampler(SamplingSettings())
    first = ngram.propose(prompt + [10, 11], 4, sampler)
    assert first.tokens == [12, 13, 14, 15] and not first.note.continuing
    ngram.observe(first, accepted=1)            # the answer copied 12, then edited 13 into 50
    # The answer now ends "... 12 50 13": 13 occurs twice before; the copy continues at the source.
    after = ngram.propose(prompt + [10, 11, 12, 50, 13], 3, sampler)
    assert after.tokens == [14, 15, 16] and after.note.continuing


def test_ngram_index_kept_up_to_date_finds_what_a_fresh_index_finds():
    """The lookup indexes the engine's growing context incrementally; a copy of the context each
    round (indexed from scratch) must get the same proposals, ages and renames."""
    import random

    from localspec.engine.drafters import NgramDrafter

    rng = random.Random(7)
    for _trial in range(200):
        vocab = rng.choice([3, 6, 20])
        context = [rng.randrange(vocab) for _ in range(rng.randrange(2, 40))]
        growing, fresh = NgramDrafter(), NgramDrafter()
        for d in (growing, fresh):
            d.reset(prompt_len=len(context) // 2)
        for _round in range(25):
            a, b = growing.propose(context, 6), fresh.propose(list(context), 6)
            assert (a.tokens, a.evidence, a.note) == (b.tokens, b.evidence, b.note)
            assert growing.replacements == fresh.replacements
            if a.tokens:
                kept, token = rng.randrange(len(a.tokens) + 1), rng.randrange(vocab)
                growing.observe(a, kept, token)
                fresh.observe(b, kept, token)
                context.extend(a.tokens[:kept])
                context.append(token)
            else:
                context.append(rng.randrange(vocab))


def test_ngram_copy_resumes_past_a_substituted_token():
    from localspec.engine.drafters import NgramDrafter
    from localspec.engine.sampling import Sampler

    source = [10, 11, 12, 13, 14, 15, 16, 17]
    ngram = NgramDrafter()
    sampler = Sampler(SamplingSettings())
    first = ngram.propose(source + [10, 11], 4, sampler)
    assert first.tokens == [12, 13, 14, 15]
    ngram.observe(first, accepted=1)  # kept 12; the target wrote 77 where the source has 13
    resumed = ngram.propose(source + [10, 11, 12, 77], 3, sampler)
    assert resumed.tokens == [14, 15, 16] and resumed.note.continuing and resumed.evidence == 0


def test_ngram_copy_learns_a_rename_and_applies_it_later():
    from localspec.engine.drafters import NgramDrafter
    from localspec.engine.sampling import Sampler

    source = [10, 11, 13, 14, 15, 13, 16, 13, 17, 18]   # the answer renames every 13 to 77
    source += list(range(40, 60))                       # the rest of the prompt
    ngram = NgramDrafter()
    sampler = Sampler(SamplingSettings())
    first = ngram.propose(source + [10], 4, sampler)
    assert first.tokens == [11, 13, 14, 15]
    ngram.observe(first, accepted=1, token=77)          # kept 11; the target wrote 77 for 13
    resumed = ngram.propose(source + [10, 11, 77], 4, sampler)
    assert resumed.tokens == [14, 15, 13, 16]           # one edit is not a rename yet
    ngram.observe(resumed, accepted=2, token=77)        # the copy went on past the edit, and 13 -> 77 again
    assert ngram.replacements == {}                     # (77 might be the start of an insertion)
    later = ngram.propose(source + [10, 11, 77, 14, 15, 77, 16], 4, sampler)
    assert ngram.replacements == {13: 77}               # one token later the copy agrees past it: a rename
    assert later.tokens == [77, 17, 18, 40]             # applied ahead of time
    ngram.observe(later, accepted=0, token=13)          # here the answer kept 13 after all
    assert ngram.replacements == {}


def test_greedy_engine_output_is_unchanged_by_learned_renames():
    """Whatever the drafter guesses, greedy output is the target's: the toy target with and without drafts."""
    prompt = [0] + [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7] * 3
    target = ToyModel(seed=11)
    plain = _tokens(Engine(target, None, EngineOptions(drafter="none"), cost=CostModel(dict(COST)))
                          .generate(prompt, max_tokens=60))
    target2 = ToyModel(seed=11)
    spec = _tokens(Engine(target2, None, EngineOptions(drafter="ngram", draft_len=4), cost=CostModel(dict(COST)))
                         .generate(prompt, max_tokens=60))
    assert spec == plain


def test_one_slow_measurement_cannot_price_a_batch_size_out_for_good():
    cost = CostModel({1: 1.0, 2: 1.5, 3: 5.0, 4: 2.0, 8: 3.0})  # 3 was measured while the machine was busy
    assert cost.verify(3) == 2.0 and cost.verify(2) == 1.5 and cost.verify(6) == 2.5
    assert [cost.verify(n) for n in range(1, 9)] == sorted(cost.verify(n) for n in range(1, 9))
    cost.observe(4, 60.0)  # a stall during a real round moves the estimate a little, not to 60
    assert cost.verify(4) < 2.5


def test_a_slower_machine_moves_every_batch_size_alike():
    """Rounds that all run 30% over the calibration (a busy machine, a stale cached calibration) raise
    every size by the same factor: sizes the planner avoids do not keep old figures and look cheap."""
    cost = CostModel({1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0, 16: 5.0})
    for _ in range(200):
        cost.observe(4, 2.6)
    assert cost.verify(4) == pytest.approx(2.6, rel=0.01)
    assert cost.verify(1) == pytest.approx(1.3, rel=0.01) and cost.verify(16) == pytest.approx(6.5, rel=0.01)
    assert cost.plain_tokens_per_s == pytest.approx(1 / 1.3, rel=0.01)



def test_plain_decoding_lately_is_the_latest_plain_decodes_mean_but_the_slowest():
    """What the loss bound values drafting's time at (CostModel.plain_lately): the learnt price until three
    plain decodes were seen, then their mean without the slowest one (a lone stall); other batch sizes
    do not count, and only the latest PLAIN_KEEP do."""
    from localspec.engine.costs import PLAIN_KEEP

    cost = CostModel({1: 1.0, 4: 2.0})
    cost.observe(1, 3.0)
    cost.observe(4, 9.0)
    cost.observe(1, 3.0)
    assert cost.plain_lately() == pytest.approx(cost.verify(1))
    cost.observe(1, 30.0)
    assert cost.plain_lately() == pytest.approx(3.0)
    for _ in range(PLAIN_KEEP):
        cost.observe(1, 2.0)
    assert cost.plain_lately() == pytest.approx(2.0)

def test_draft_lengths_are_chosen_among_measured_batch_sizes():
    from localspec.engine.adaptive import best_length

    # Between 4 and 8 the interpolated price would make 5 positions look like a bargain; it was not measured.
    cost = CostModel({1: 1.0, 2: 1.5, 4: 1.6, 8: 2.5})
    k, _rate = best_length([0.99] * 6, cost, 0.0)
    assert k == 3
    k, _rate = best_length([0.99] * 7, cost, 0.0)
    assert k == 7


def test_copies_are_priced_by_age():
    from localspec.engine.adaptive import CopyAcceptance

    copies = CopyAcceptance(priors=(0.2, 0.2, 0.4, 0.5, 0.6, 0.7, 0.75, 0.9))
    assert copies.rates(1, 4) == [0.2, 0.4, 0.5, 0.6]        # each drafted token is one token older
    assert copies.rate(40) == copies.rate(10) == 0.9 and copies.rate(4) == 0.6
    copies.observe(age=2, drafted=4, accepted=2)             # tokens at ages 2 and 3 kept, age 4 rejected
    assert copies.tried[2:5] == [1.0, 1.0, 1.0] and copies.kept[2:5] == [1.0, 1.0, 0.0]
    assert copies.rate(2) > 0.4 and copies.rate(4) < 0.6 and copies.samples(4) == 1.0


def test_a_copy_is_as_old_as_its_agreement_with_the_source():
    from localspec.engine.drafters import NgramDrafter

    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19] + list(range(40, 50))
    ngram = NgramDrafter()
    ngram.reset(prompt_len=len(source))
    draft = ngram.propose(source + [13, 14, 15], 4, None)
    assert draft.tokens == [16, 17, 18, 19] and draft.note.age == 3 and draft.note.from_prompt
    # Eight tokens back the answer agrees with the source even beyond the 6-gram the lookup matches on.
    draft = ngram.propose(source + [10, 11, 12, 13, 14, 15, 16, 17], 2, None)
    assert draft.tokens == [18, 19] and draft.note.age == 8
    # Only what the answer wrote counts: a follow-up's prompt ends with the template's header for the
    # answer, which also stands before the previous answer in it, so an answer's first copy of that
    # answer agrees with it over the header alone (it was priced as five tokens old and drafted 15 long,
    # keeping 3-5 of them on held-out follow-ups).
    header = [7, 8, 9]
    previous = header + [30, 31, 32, 33, 34, 35]
    ngram.reset(prompt_len=len(previous + [60, 61] + header))
    first = ngram.propose(previous + [60, 61] + header, 4, None)
    assert first.tokens == [30, 31, 32, 33] and first.note.age == 0
    assert ngram.propose(previous + [60, 61] + header + [30, 31], 2, None).note.age == 2
    # Copies of the answer itself are told apart from copies of the prompt.
    ngram.reset(prompt_len=3)
    assert not ngram.propose(source + [13, 14, 15], 4, None).note.from_prompt


def test_a_rename_made_while_nothing_was_drafted_is_learned_from_the_alignment():
    from localspec.engine.drafters import NgramDrafter

    source = [10, 11, 12, 13, 14, 15, 16, 17, 13, 18, 19] + list(range(40, 50))  # 13 is renamed 77 below
    ngram = NgramDrafter()
    ngram.reset(prompt_len=len(source))
    draft = ngram.propose(source + [10, 11, 12, 77, 14, 15], 6, None)
    assert ngram.replacements == {13: 77}
    assert draft.tokens == [16, 17, 77, 18, 19, 40]          # the rename is applied ahead
    assert draft.note.age == 6                               # and the age counts through it
    # A single differing token with no agreement after it is an edit under way, not a rename.
    other = NgramDrafter()
    other.reset(prompt_len=len(source))
    other.propose(source + [10, 11, 12, 13, 14, 99], 4, None)
    assert other.replacements == {}


def test_a_token_added_after_a_source_token_is_learned_as_an_insertion():
    """A name given a suffix (`month` -> `month` `_current`): the answer adds a token after the source's;
    learned from the alignment, the copy goes on past it, adds it after each later occurrence, and
    counts its age through it."""
    from localspec.engine.drafters import NgramDrafter

    source = [10, 11, 12, 13, 14, 15, 16, 17, 13, 18, 19] + list(range(40, 50))  # 77 is added after 13 below
    ngram = NgramDrafter()
    ngram.reset(prompt_len=len(source))
    draft = ngram.propose(source + [10, 11, 12, 13, 77, 14, 15], 6, None)
    assert ngram.insertions == {13: 77} and ngram.replacements == {}
    assert draft.tokens == [16, 17, 13, 77, 18, 19]          # added again after the next 13
    assert draft.note.age == 7                               # the age counts through the added token
    # Right after the answer wrote it, the copy goes on from the source as if it had not.
    after = ngram.propose(source + [10, 11, 12, 13, 77, 14, 15, 16, 17, 13, 77], 3, None)
    assert after.tokens == [18, 19, 40]
    # A single added token with one agreeing token after it is an edit under way, not an insertion...
    other = NgramDrafter()
    other.reset(prompt_len=len(source))
    other.propose(source + [10, 11, 12, 13, 77, 14], 4, None)
    assert other.insertions == {}


def test_an_insertion_confirmed_by_a_rejection_is_learned_one_token_later_and_forgotten_when_wrong():
    from localspec.engine.drafters import NgramDrafter

    source = [10, 11, 12, 13, 14, 15, 16, 13, 17, 18] + list(range(40, 50))
    ngram = NgramDrafter()
    ngram.reset(prompt_len=len(source))
    first = ngram.propose(source + [10, 11], 4, None)
    assert first.tokens == [12, 13, 14, 15]
    ngram.observe(first, accepted=2, token=77)               # kept 12 13; the target added 77 before 14
    resumed = ngram.propose(source + [10, 11, 12, 13, 77, 14], 4, None)
    assert ngram.insertions == {13: 77}                      # the rejection said where: one token after is enough
    assert resumed.tokens == [15, 16, 13, 77]
    ngram.observe(resumed, accepted=3, token=17)             # after this 13 the answer added nothing
    assert ngram.insertions == {}


def test_a_source_token_written_as_two_is_learned_and_written_so_at_later_occurrences():
    """`print` -> `logging` `.info`: the answer writes two tokens where the source has one, with agreement
    on both sides; learned as a rename and an insertion after it, so later copies write both, the copy
    counts its age through them, and right after the answer wrote the first the copy offers the second."""
    from localspec.engine.drafters import NgramDrafter

    source = [10, 11, 12, 13, 14, 15, 16, 17, 13, 18, 19] + list(range(40, 50))  # 13 is written 77 78 below
    ngram = NgramDrafter()
    ngram.reset(prompt_len=len(source))
    draft = ngram.propose(source + [10, 11, 12, 77, 78, 14, 15], 6, None)
    assert ngram.replacements == {13: 77} and ngram.insertions == {13: 78}
    assert draft.tokens == [16, 17, 77, 78, 18, 19]          # both written at the next 13
    assert draft.note.age == 7                               # the age counts through the two tokens
    # Where the answer has just written the first of them, the copy goes on with the second.
    ngram.observe(draft, accepted=2, token=77)
    after = ngram.propose(source + [10, 11, 12, 77, 78, 14, 15, 16, 17, 77], 3, None)
    assert after.tokens == [78, 18, 19]
    # Two differing tokens with one agreeing token after them are an edit under way.
    other = NgramDrafter()
    other.reset(prompt_len=len(source))
    other.propose(source + [10, 11, 12, 77, 78, 14], 4, None)
    assert other.replacements == {} and other.insertions == {}


def test_an_insertion_is_not_added_where_the_source_already_has_it():
    from localspec.engine.drafters import NgramDrafter

    source = [10, 11, 12, 13, 14, 15, 16, 13, 77, 17, 18] + list(range(40, 50))
    ngram = NgramDrafter()
    ngram.reset(prompt_len=len(source))
    draft = ngram.propose(source + [10, 11, 12, 13, 77, 14, 15], 5, None)
    assert ngram.insertions == {13: 77}
    assert draft.tokens == [16, 13, 77, 17, 18]


def test_a_copy_is_priced_by_what_copies_of_its_age_did():
    from localspec.engine.drafters import CopyDrafter
    from localspec.engine.planner import Drafting

    cost = CostModel({1: 1.0, 2: 1.9, 4: 3.2, 8: 5.0, 16: 6.0})  # the shape of a CPU with AVX-512
    source = list(range(100, 140))
    drafting = Drafting(cost, [CopyDrafter()], learn_costs=False, loss_bound=False)  # (the prices alone)
    planner = drafting.planner(source, "ngram")
    young = planner.draft(source + [100, 101, 102], room=100, sampler=None)
    assert young.tokens == []                                 # age 3: kept 75% then 85%..., not worth a batch
    planner = drafting.planner(source, "ngram")
    old = planner.draft(source + list(range(100, 112)), room=100, sampler=None)
    assert old.note.age == 12 and len(old.tokens) == 15
    # Where young copies have been holding in this request, a young copy is drafted long at once
    # (no cap by its age: an edit's copy resumes after each edit point).
    for _ in range(6):
        planner.turn("ngram").acceptance[True].observe(3, 15, 15)
    resumed = planner.draft(source + [100, 101, 102], room=100, sampler=None)
    assert resumed.note.age == 3 and len(resumed.tokens) == 15
    # One break of an old copy does not price copies out for the rest of the answer (its prior weighs
    # 16 copied tokens, adaptive.COPY_PRIOR_STRENGTHS); young copies that keep failing are priced out.
    planner = drafting.planner(source, "ngram")
    planner.turn("ngram").acceptance[True].observe(12, 15, 2)
    assert len(planner.draft(source + list(range(100, 112)), room=100, sampler=None).tokens) == 15
    flat = Drafting(CostModel({1: 1.0, 2: 1.8, 4: 2.1, 8: 3.2, 16: 3.4}),  # RPC workers' shape
                    [CopyDrafter()], learn_costs=False, loss_bound=False).planner(source, "ngram")
    assert len(flat.draft(source + [100, 101, 102], room=100, sampler=None).tokens) == 15
    for _ in range(3):
        flat.turn("ngram").acceptance[True].observe(3, 15, 0)
    assert flat.draft(source + [100, 101, 102], room=100, sampler=None).tokens == []


def test_an_old_copy_drafts_at_a_requests_first_chance_on_a_steep_avx2_shape():
    """A copy 10 or more tokens old is priced by a prior measured over many requests, so it needs the
    margin of a measured rate, not of a guess: on this shape (an AVX2 build on a 2-core EPYC, 2026-12-03) a margin
    for no evidence priced every copy out, no request ever drafted, and no record could ever grow."""
    from localspec.engine.drafters import CopyDrafter
    from localspec.engine.planner import Drafting

    steep = CostModel({1: 1.0, 2: 1.70, 3: 2.45, 4: 3.04, 6: 4.59, 8: 8.82, 12: 10.0, 16: 10.84})
    source = list(range(100, 140))
    drafting = Drafting(steep, [CopyDrafter()], learn_costs=False)
    old = drafting.planner(source, "ngram").draft(source + list(range(100, 112)), room=100, sampler=None)
    assert old.note.age == 12 and 1 <= len(old.tokens) <= 5    # short: long batches cost 9-11x one here
    resumed = drafting.planner(source, "ngram").draft(source + list(range(100, 106)), room=100, sampler=None)
    assert resumed.tokens == []                                # age 6: may be a copy resumed after an edit


def test_a_copy_the_answers_code_opens_with_is_priced_as_an_old_one():
    """An edit's answer writes its code out again from its first line: a copy of the prompt begun at the
    answer's first code token (right after its opening fence line) is priced as a copy CODE_OPENING_AGE
    old, and drafted at once (within the loss bound); the same young copy after any other first line
    is not, nor where the drafter cannot spell tokens."""
    from localspec.engine.drafters import CopyDrafter
    from localspec.engine.drafters.respelling import Respelling
    from localspec.engine.planner import Drafting

    steep = CostModel({1: 1.0, 2: 1.70, 3: 2.45, 4: 3.04, 6: 4.59, 8: 8.82, 12: 10.0, 16: 10.84})
    pieces = {5: b"```", 6: b"python", 7: b"\n", 8: b"Here", 9: b" is"}
    prompt = [50, 51, 52, 7] + list(range(100, 140))          # an instruction, then the code
    spelling = Respelling(lambda t: pieces.get(t, b" t%d" % t), lambda text: [])
    drafting = Drafting(steep, [CopyDrafter(respelling=spelling)], learn_costs=False)
    opened = drafting.planner(prompt, "ngram").draft(prompt + [5, 6, 7, 100], room=100, sampler=None)
    assert opened.note.age == 2 and opened.tokens == [101]    # one token: all the bound allows at first
    elsewhere = drafting.planner(prompt, "ngram").draft(prompt + [8, 9, 7, 100], room=100, sampler=None)
    assert elsewhere.tokens == []                             # (the same copy, two tokens old)
    unspelt = Drafting(steep, [CopyDrafter()], learn_costs=False).planner(prompt, "ngram")
    assert unspelt.draft(prompt + [5, 6, 7, 100], room=100, sampler=None).tokens == []


def test_answers_open_the_way_other_conversations_answers_opened():
    from localspec.engine.drafters import OpeningDrafter

    openings = OpeningDrafter(length=4, support=2)

    def propose(prompt, answer_so_far=()):
        return openings.propose([*prompt, *answer_so_far], 8, OpeningDrafter.conversation(prompt), len(prompt))

    for prompt, answer in (([0, 5], [7, 8, 9, 10]), ([0, 6], [7, 8, 9, 11]), ([0, 7], [3, 3, 3, 3])):
        openings.remember(prompt, answer)
    draft, rates = propose([0, 9, 9])
    assert draft.tokens == [7, 8, 9] and draft.note.opening                # what two conversations agree on
    assert rates == [3 / 5, 3 / 4, 3 / 4]                             # 2 of 3 answers, then 2 of 2
    assert propose([0, 9, 9], [7])[0].tokens == [8, 9]
    assert propose([0, 9, 9], [7, 8, 9])[0].tokens == []   # they part here
    assert propose([0, 9, 9], [4])[0].tokens == []         # no other answer opened so
    # Answers to the same conversation never count: a regenerated answer (or a benchmark's plain
    # run of the same prompt) must not feed the next one.
    openings.remember([0, 1, 1], [4, 4, 4, 4])
    openings.remember([0, 1, 1], [4, 4, 4, 4])
    assert propose([0, 1, 1])[0].tokens == [7, 8, 9]
    # Two answers in a row that opened otherwise: the session changed subject, the old opening is dropped.
    openings.remember([0, 2, 2], [5, 5, 5, 5])
    assert propose([0, 3, 3])[0].tokens == []


def test_the_engine_drafts_a_shared_opening_and_output_is_unchanged():
    # The toy's next token depends on the last two tokens only: these prompts get the same answer.
    engine = _engine(draft=False, drafter="ngram")
    for prompt in ([0, 7, 5, 9], [0, 8, 5, 9]):
        list(engine.generate(prompt, max_tokens=12))
    events = list(engine.generate([0, 6, 5, 9], max_tokens=12))
    first = next(e for e in events if isinstance(e, Round))
    assert first.drafter == "ngram" and len(first.accepted) >= 2
    assert _tokens(events) == _plain([0, 6, 5, 9], 12)


def test_requests_go_to_the_slot_with_their_prefix_and_a_warm_up_does_not_evict_it():
    """Two slots: a completion's cache survives an unrelated request in between (an editor's cache
    warming), and output is the same as with one slot."""
    target = ToyModel(seed=3, n_seq=2)
    engine = Engine(target, None, EngineOptions(drafter="ngram", learn_costs=False), cost=CostModel(dict(COST)))
    completion = [0, 5, 9, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 6]
    first = list(engine.generate(completion, max_tokens=6))
    assert engine.kv.seq == 0
    warm_up = [0] + list(range(20, 34))  # only the first token in common: under a tenth
    list(engine.generate(warm_up, max_tokens=1))
    assert engine.kv.seq == 1 and target.seqs[0][:len(completion) - 1] == completion[:-1]  # slot 0 kept
    again = completion + [7, 8]
    events = list(engine.generate(again, max_tokens=6))
    prefill = events[0]
    assert isinstance(prefill, Prefill) and engine.kv.seq == 0 and prefill.cached >= len(completion) - 1
    assert _tokens(events) == _plain(again, 6) and _tokens(first) == _plain(completion, 6)
    third = [0] + list(range(4, 18))[::-1]  # nothing else in common: the least recently used slot (the warm-up's)
    list(engine.generate(third, max_tokens=1))
    assert engine.kv.seq == 1 and target.seqs[0][:len(again) - 1] == again[:-1]


def test_a_new_chat_does_not_evict_the_editors_cache_nor_a_completion_the_chats():
    """Without a prefix worth keeping a request takes a slot holding its own kind of prompt (fill in the
    middle, or not) before the least recently used one of the other kind."""
    target = ToyModel(seed=3, n_seq=2)
    target.vocab.fim_mid = 3  # (the toy's vocabulary has no infill tokens otherwise)
    engine = Engine(target, None, EngineOptions(drafter="none", learn_costs=False), cost=CostModel(dict(COST)))
    infill = [0, *range(20, 31), 3]  # (12 tokens: the shared first token is under a tenth of each prompt)
    list(engine.generate(infill, max_tokens=2))
    assert engine.kv.seq == 0
    list(engine.generate([0, *range(31, 43)], max_tokens=2))  # a chat: the empty slot
    assert engine.kv.seq == 1
    list(engine.generate([0, *range(43, 47), *range(4, 12)], max_tokens=2))  # a new chat: the chat's slot...
    assert engine.kv.seq == 1 and target.seqs[0][:len(infill) - 1] == infill[:-1]  # ...not the older infill's
    list(engine.generate([0, *range(12, 20), 46, 45, 3], max_tokens=2))  # another file's completion: the editor's
    assert engine.kv.seq == 0 and target.seqs[1][:5] == [0, 43, 44, 45, 46]


def test_cache_reuse_keeps_a_run_that_moved_and_output_is_unchanged():
    """An editor's prompt is a window of the file: lines drop out of it (the ring of extra chunks turns
    over, the window slides), so cached text moves towards the start. With cache reuse a cached run of
    at least `cache_reuse` tokens that the prompt continues with is moved in the cache instead of
    evaluated again (llama-server's --cache-reuse); the answer is the one a fresh cache gives (the toy's
    next token depends on the last two tokens only, so here the moved entries are exact)."""
    before, dropped, after = [0, 5, 9, 11, 13], [17, 18, 19], list(range(20, 44))
    engine = Engine(ToyModel(seed=3), None, EngineOptions(drafter="none", learn_costs=False, cache_reuse=8),
                    cost=CostModel(dict(COST)))
    list(engine.generate(before + dropped + after, max_tokens=5))
    prompt = before + after
    events = list(engine.generate(prompt, max_tokens=30))
    prefill = events[0]
    assert prefill.cached == len(prompt) - 1 and prefill.evaluated == 1  # only the pending last token
    assert engine.kv.tokens[:len(prompt) - 1] == prompt[:-1]  # the cache holds the prompt in order
    assert _tokens(events) == _plain(prompt, 30)
    # A run shorter than the minimum is evaluated again; so is everything without cache reuse.
    for minimum in (40, 0):
        other = Engine(ToyModel(seed=3), None, EngineOptions(drafter="none", learn_costs=False, cache_reuse=minimum),
                       cost=CostModel(dict(COST)))
        list(other.generate(before + dropped + after, max_tokens=5))
        assert next(iter(other.generate(prompt, max_tokens=1))).cached == len(before)


def test_verify_costs_are_measured_again_for_another_llama_cpp_build(tmp_path, monkeypatch):
    """A rebuilt llama.cpp (AVX2 -> AVX-512 kernels) halves batch costs: a calibration cached under the
    old build would price drafts by the old shape."""
    from localspec.engine.calibration import calibrated_costs
    from localspec.engine.backend import ModelOptions

    class Timed:
        n_vocab, n_ctx, max_rollback = 100, 256, None
        options = ModelOptions()

        def __init__(self, path, build):
            self.path, self.build, self.decodes = path, build, 0

        def decode(self, tokens, start, logits_for):
            self.decodes += 1
            clock[0] += 0.01 * len(tokens)

        def truncate(self, n_keep):
            return n_keep

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    clock = [0.0]
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript(threads=ModelOptions().threads()))
    monkeypatch.setattr("localspec.engine.calibration.perf_counter", lambda: clock[0])
    first = Timed(gguf, "avx2")
    calibrated_costs(first)
    again = Timed(gguf, "avx2")
    calibrated_costs(again)
    rebuilt = Timed(gguf, "avx512")
    costs = calibrated_costs(rebuilt)
    assert first.decodes > 0 and again.decodes == 0          # the same build: from the cache
    assert rebuilt.decodes > 0 and 64 in costs                # another build: measured again, up to 64
    # Flash attention changes how a verify batch's cost grows (docs/findings.md, "Flash attention"): off (the
    # `flash_attention: off` setting) is measured again.
    no_flash = Timed(gguf, "avx2")
    no_flash.options = ModelOptions(flash_attn=False)
    calibrated_costs(no_flash)
    assert no_flash.decodes > 0


def test_a_slow_spell_at_calibration_does_not_distort_the_cost_shape():
    """Right after a load (RPC workers still warming up) decoding can run slow for a while: a size
    measured only then would look dearer than it is against the others, and drafts would be chosen by
    a wrong shape. Each repeat passes over every size, so every size gets a settled measurement."""
    from localspec.engine.measuring import measure_costs

    settled = {1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0}

    class Warming:
        n_vocab, n_ctx, max_rollback = 100, 256, None

        def __init__(self):
            self.now = 0.0

        def decode(self, tokens, start, logits_for):
            n = len(tokens) if logits_for else 0
            if n in settled:
                self.now += settled[n] * (3.0 if self.now < 10.0 else 1.0)  # the first seconds: 3x slower

        def truncate(self, n_keep):
            return n_keep

    model = Warming()
    assert measure_costs(model, sizes=tuple(settled), repeats=3, clock=lambda: model.now) == settled


def test_a_draft_models_catch_up_is_priced_by_its_own_measured_prefill():
    """With the target on RPC workers a verify batch is cheap per position and a draft token cheap
    against a target token, so a catch-up estimated from them looked nearly free and probes caught the
    draft up on whole chats. The draft model's own prefill, measured at load, prices it."""
    from localspec.engine.drafters import ModelDrafter
    from localspec.engine.drafters.base import Plan

    rpc = CostModel({1: 0.056, 2: 0.09, 4: 0.11, 8: 0.166, 16: 0.185, 64: 0.45})  # through two workers at 5 ms
    context = list(range(4, 44))  # 40 tokens the draft model has not seen
    plan = Plan(cost=rpc, budget=128)
    estimated = ModelDrafter(ToyModel(), per_token_s=0.014).begin([], plan)
    measured = ModelDrafter(ToyModel(), per_token_s=0.014, prefill_s=0.006).begin([], plan)
    assert estimated.probe(context, plan) is not None     # 40 x 1.8 ms estimated: within the probe's share
    assert measured.probe(context, plan) is None          # 40 x 6 ms measured: not
    assert measured.probe(context[-2:], plan) is not None  # a draft nearly in step is still probed


def _two_slot_engine(drafter="auto", draft_len=None):
    target = ToyModel(seed=3, n_seq=2)
    draft = ToyModel(seed=3, noise_seed=103, noise=1.5)
    engine = Engine(target, draft, EngineOptions(drafter=drafter, draft_len=draft_len, learn_costs=False),
                    cost=CostModel(dict(COST)), draft_cost_s=0.01)
    return engine, target, draft


@pytest.mark.parametrize("drafter, draft_len", [("auto", None), ("model", 4), ("ngram", 3)])
def test_an_urgent_request_stepped_alone_between_rounds_leaves_the_waiting_generation_exact(drafter, draft_len):
    """An editor's completion submitted between two rounds of a chat's answer and stepped alone to its
    end (the server's scheduler does this): on the other slot, with its own planner. Both answers are
    their solo answers, the waiting generation's slot and the draft model's cache are untouched
    meanwhile, and no position of either sequence is evaluated twice (the toy asserts every decode
    starts where its sequence ends)."""
    engine, target, draft = _two_slot_engine(drafter, draft_len)
    chat = [0, 5, 9, 11, 13, 5, 9]
    completions = [[0, 20, 21, 22, 23, 20, 21], [0, 4, 4, 4, 4], [0, 30, 2, 3, 17, 30, 2]]
    events, interjected = [], []
    main = engine.generate(chat, max_tokens=60)
    for event in main:
        events.append(event)
        rounds = sum(isinstance(e, Round) for e in events)
        if isinstance(event, Round) and rounds in (1, 3, 4) and completions:
            held, draft_held = list(target.seqs[0]), list(draft.seqs[0])
            prompt, answer = completions.pop(0), []
            step_until_done(engine, [submit_one(engine, prompt, answer.append, max_tokens=12, urgent=True)])
            assert _tokens(answer) == _plain(prompt, 12)
            assert isinstance(answer[0], Prefill) and answer[0].prompt_tokens == len(prompt)
            assert target.seqs[0] == held and draft.seqs[0] == draft_held
            interjected.append(answer)
    assert not completions and len(interjected) == 3
    assert _tokens(events) == _plain(chat, 60)
    assert isinstance(events[-1], Summary) and events[-1].generated_tokens == len(_plain(chat, 60))
    # The engine is free again, and the interjections' slot kept the last completion's cache.
    again = list(engine.generate([0, 30, 2, 3, 17, 30, 2, 9], max_tokens=4))
    assert again[0].cached >= 6 and _tokens(again) == _plain([0, 30, 2, 3, 17, 30, 2, 9], 4)


def test_requests_planning_side_by_side_draft_as_each_would_alone():
    """Each request plans with its own planner and its drafters' own turns (copies followed, their
    acceptance so far): two answers whose rounds alternate on two slots draft exactly what each drafts
    alone, round for round, and each answer is its plain answer."""
    from localspec.engine.sampling import Sampler
    from localspec.engine.speculative import speculative_round

    prompts = [[0, 20, 21, 22, 23, 20, 21, 22, 23, 20], [0, 30, 2, 3, 17, 30, 2, 3]]

    def run(order):
        engine, _target, _draft = _two_slot_engine("ngram")
        lanes = []
        for prompt in prompts:
            kv, kept = engine.slots.place(prompt)
            kv.extend(prompt[kept:-1])
            lanes.append((kv, list(prompt), engine.planner_for("ngram", None, 40, prompt=prompt),
                          Sampler(SamplingSettings()), []))
        for i in order:
            kv, context, planner, sampler, drafts = lanes[i]
            step = speculative_round(kv, context, planner, sampler)
            drafts.append((step.draft.tokens, step.accepted))
        return [(context[len(p):], drafts) for (_kv, context, _pl, _s, drafts), p in zip(lanes, prompts)]

    alone = [run([0] * 12)[0], run([1] * 12)[1]]
    together = run([0, 1] * 12)
    assert together == alone
    assert all(any(tokens for tokens, _kept in drafts) for _answer, drafts in together)  # both copied
    for (answer, _drafts), prompt in zip(together, prompts):
        assert answer == _plain(prompt, len(answer))


def test_a_request_from_any_thread_joins_the_steps_of_one_engine_thread_given_a_free_slot():
    engine, _target, _draft = _two_slot_engine()
    main = engine.generate([0, 5, 9, 11], max_tokens=30)
    next(main)  # the Prefill: the generation waits between rounds
    inner_events: list = []
    inner = submit_one(engine, [0, 7, 8], inner_events.append, max_tokens=8, urgent=True)
    engine.step(only=[inner])
    with pytest.raises(LocalspecError, match="No KV slot"):
        submit_one(engine, [0, 6], lambda _e: None, max_tokens=3)  # both slots are taken
    refused: list[Exception] = []
    other = threading.Thread(target=lambda: _refused(lambda: next(engine.generate([0, 6], max_tokens=2)), refused))
    other.start()
    other.join()
    assert refused and "No KV slot" in str(refused[0])  # whichever thread asks
    engine.abort(inner)  # abandoned mid-answer (the editor moved on): the generation goes on
    rest = [next(main)]  # (the step that ends it)
    assert inner_events[-1].stop_reason == "cancelled" and engine.free_slots() == 1
    answers: dict[str, list[int]] = {}
    other = threading.Thread(target=lambda: answers.update(other=_tokens(list(engine.generate([0, 6], max_tokens=12)))))
    other.start()  # another thread's reader: its request joins the same steps
    rest += list(main)
    other.join()
    assert _tokens(rest) == _plain([0, 5, 9, 11], 30)
    assert answers["other"] == _plain([0, 6], 12)
    assert engine.free_slots() == 2
    one_slot = Engine(ToyModel(seed=3), None, EngineOptions(drafter="ngram", learn_costs=False),
                      cost=CostModel(dict(COST)))
    assert not one_slot.concurrent and engine.concurrent


def test_every_step_runs_on_the_engines_one_thread_whoever_asks():
    """Readers in two threads, a direct `step` and a `submit` from a third: the core is stepped and
    added to on the driver's thread only, never the caller's."""
    engine, _target, _draft = _two_slot_engine()
    threads: list[str] = []
    core_step, core_add = engine.core.step, engine.core.add

    def step(only=None):
        threads.append(threading.current_thread().name)
        return core_step(only)

    def add(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return core_add(*args, **kwargs)

    engine.core.step, engine.core.add = step, add  # type: ignore[method-assign]
    answers: dict[str, list[int]] = {}
    other = threading.Thread(target=lambda: answers.update(other=_tokens(list(engine.generate([0, 6], max_tokens=10)))))
    other.start()
    answers["main"] = _tokens(list(engine.generate([0, 5, 9, 11], max_tokens=10)))
    other.join()
    events: list = []
    submit_one(engine, [0, 7, 8], events.append, max_tokens=4)
    while engine.step():
        pass
    assert answers == {"other": _plain([0, 6], 10), "main": _plain([0, 5, 9, 11], 10)}
    assert _tokens(events) == _plain([0, 7, 8], 4)
    assert threads and set(threads) == {"localspec-engine"}
    assert threading.current_thread().name != "localspec-engine"


def _refused(call, into: list) -> None:
    try:
        call()
    except LocalspecError as exc:
        into.append(exc)


def test_each_request_drafts_in_its_own_draft_model_sequence():
    """Two conversations alternating (a chat, an editor): each request drafts in the draft model's
    sequence that holds most of its prompt, so a conversation's next request evaluates only what is new
    there, where one shared sequence evaluates the whole conversation again. Answers stay exact."""
    first, other = [0, 5, 9, 11, 13, 5, 9, 11, 13], [0, 30, 2, 3, 17, 30, 2, 3]

    def third_request_cost(draft_seqs):
        target = ToyModel(seed=3, n_seq=2)
        draft = ToyModel(seed=3, noise_seed=103, noise=0.0, n_seq=draft_seqs)
        engine = Engine(target, draft, EngineOptions(drafter="model", learn_costs=False),
                        cost=CostModel(dict(COST)), draft_cost_s=0.001)
        engine.drafter("model").p_min = 0.0
        answer = _tokens(list(engine.generate(first, max_tokens=30)))
        assert _tokens(list(engine.generate(other, max_tokens=30))) == _plain(other, 30)
        follow_up = first + answer + [7, 8]
        before = draft.evaluated
        assert _tokens(list(engine.generate(follow_up, max_tokens=10))) == _plain(follow_up, 10)
        return draft.evaluated - before, len(follow_up)

    own, length = third_request_cost(draft_seqs=2)
    shared, _ = third_request_cost(draft_seqs=1)
    assert shared >= length                  # the whole conversation evaluated again
    assert own <= shared - length + 4        # only what is new since its last request (and its drafts)


def test_only_a_request_that_drafted_with_the_draft_model_changes_its_record():
    """Requests decoded beside a chat that never draft with the draft model (they share steps, or copy
    instead) must not overwrite what the requests that did draft learnt about it."""
    engine = _engine(drafter="model", noise=0.0, draft_cost=0.001)
    record = engine.drafter("model").acceptance
    list(engine.generate([0, 5, 9, 11], max_tokens=10, drafter="ngram"))
    assert engine.drafter("model").acceptance is record
    list(engine.generate([0, 5, 9, 11], max_tokens=10))  # a perfect, cheap draft model: it drafts
    assert engine.drafter("model").acceptance is not record


def _submitted(engine, prompt, params):
    events = []
    engine.submit(prompt, params, lambda item: events.append(item if isinstance(item, Exception) else item[1]))
    while engine.step():
        pass
    return events


def test_a_requests_longest_and_shortest_draft_bound_every_round():
    """llama.cpp's speculative.n_max / n_min and Ollama's draft_num_predict, as GenerationParams carries
    them: no round drafts more than the longest, none fewer than the shortest (but nothing), and the
    answer is plain decoding's."""
    from localspec.engine.params import GenerationParams

    engine = _engine(drafter="auto")
    for prompt in PROMPTS:
        for longest, shortest in ((2, 0), (6, 3)):
            events = _submitted(engine, prompt, GenerationParams.one(max_tokens=60, draft_max=longest,
                                                                     draft_min=shortest))
            drafted = [len(r.accepted) + len(r.rejected) for r in events if isinstance(r, Round)]
            assert _tokens(events) == _plain(prompt, 60)
            assert all(n == 0 or shortest <= n <= longest for n in drafted), drafted
    assert any(n > 2 for n in drafted)  # (unbounded but by 6, drafts there are longer than the first bound)
    with pytest.raises(LocalspecError, match="shortest draft asked for"):
        engine.submit(PROMPTS[0], GenerationParams.one(draft_max=2, draft_min=3), lambda item: None)
    # The Python API's keywords are the same bounds; a longest draft of 0 is plain decoding.
    for longest in (2, 0):
        events = list(engine.generate(PROMPTS[0], max_tokens=60, draft_max=longest))
        assert _tokens(events) == _plain(PROMPTS[0], 60)
        deepest = max(len(r.accepted) + len(r.rejected) for r in events if isinstance(r, Round))
        assert 0 < deepest <= 2 if longest else deepest == 0
        assert (events[-1].drafter == "none") == (longest == 0)
    with pytest.raises(LocalspecError, match="shortest draft asked for"):
        next(iter(engine.generate(PROMPTS[0], draft_max=2, draft_min=3)))


@pytest.mark.parametrize("fields, message", [
    ({"max_tokens": 0}, "max_tokens must be at least 1."),
    ({"drafter": "nope"}, "Unknown drafter 'nope'; choose one of auto, "),
    ({"draft_len": "long"}, "draft_len must be a number of tokens, none, or 'default' (got 'long')."),
    ({"draft_len": -1}, "draft_len must be a number of tokens"),
    ({"draft_min": -1}, "Draft bounds are numbers of tokens (got -1 to None)."),
    ({"draft_max": 2, "draft_min": 3}, "The shortest draft asked for (3) is longer than the longest (2)."),
    ({"stop": ("x",) * 65}, "stop takes at most 64 strings"),
    ({"stop": ("x" * 501,)}, "stop takes at most 64 strings of at most 500 characters (got 1, the longest 501)."),
    ({"samplings": ()}, "Ask for at least one completion."),
])
def test_a_requests_settings_are_checked_once_where_they_are_made(fields, message):
    """GenerationParams refuses what no engine could run, with the message every front door answers."""
    from localspec.engine.params import GenerationParams

    with pytest.raises(LocalspecError) as refused:
        GenerationParams(**fields)
    assert str(refused.value).startswith(message)


def test_settings_are_kept_as_asked_but_for_what_means_nothing():
    from localspec.engine.params import GenerationParams

    params = GenerationParams(stop=["", "\n\n"], draft_max=0, drafter="model")
    assert params.stop == ("\n\n",)                        # an empty stop string would end every answer at once
    assert (params.drafter, params.draft_max) == ("none", None)  # a longest draft of 0: Ollama's "off"
    assert GenerationParams(drafter="model", draft_max=3).drafter == "model"


STEEP = {1: 1.0, 2: 1.9, 3: 2.4, 4: 3.0, 6: 4.6, 8: 7.2, 12: 7.6, 16: 8.1}  # a CPU where verifying is steep


class BrokenCopies(Drafter):
    """A copy source the planner believes in (fifteen tokens, each all but certain) that is wrong from its
    first token every time: the worst a lookup can be."""

    name = "ngram"

    def offer(self, context, room, plan):
        tokens = [999] * min(15, room)
        return Offer(len(tokens), 1e9, Draft(tokens=tokens, source=self.name), [0.99] * len(tokens))


@pytest.mark.parametrize("bounded", [True, False])
def test_copies_that_always_break_cost_at_most_the_bound_over_plain(bounded):
    """Bounded (engine/loss_bound.py), an answer whose every draft is wrong takes at most LOSS_SHARE of its
    plain time over plain decoding plus START_TOKENS plain tokens at a steep CPU's verify costs; without
    the bound the same bets cost several times plain."""
    from localspec.engine.loss_bound import LOSS_SHARE, START_TOKENS, LossBound

    cost = CostModel(dict(STEEP))
    engine = Engine(ToyModel(n_vocab=1000, seed=6), None, EngineOptions(drafter="auto", learn_costs=False), cost=cost)
    engine.drafting.drafters = [BrokenCopies()]
    engine.drafting.loss_bound = bounded
    events = list(engine.generate([0, 5, 9, 11], max_tokens=150))
    rounds = [e for e in events if isinstance(e, Round)]
    assert _tokens(events) == _plain([0, 5, 9, 11], 150, model=ToyModel(n_vocab=1000, seed=6))
    assert sum(1 for r in rounds if r.rejected) > 1  # it bet, and lost, more than once
    priced_s = sum(cost.verify(1 + len(r.accepted) + len(r.rejected)) for r in rounds)
    plain_s = len(_tokens(events)) * cost.verify(1)
    assert (priced_s <= (1 + LOSS_SHARE) * plain_s + START_TOKENS * cost.verify(1)) == bounded
    if bounded:  # its first bet, before anything broke: as long as START_TOKENS allows
        assert next(len(r.rejected) for r in rounds if r.rejected) == LossBound().longest(cost, 15, cost.verify(1)) > 0
    else:
        assert priced_s > 3 * plain_s


@pytest.mark.parametrize("learn_costs", [True, False])
def test_drafts_dearer_than_priced_stay_within_the_bound_in_real_time(monkeypatch, learn_costs):
    """A machine where verifying a draft takes half as long again as the calibration priced it (one
    position as priced): learning from real rounds, the bound counts the rounds' real time, so copies that
    always break cost at most the bound over plain in real time (give or take the last bet); trusting the
    prices (a replay, `learn_costs` off), the same bets overrun the bound by the prices' error."""
    from types import SimpleNamespace

    from localspec.engine.loss_bound import LOSS_SHARE, START_TOKENS

    priced = CostModel(dict(STEEP))
    real = CostModel({n: (1.0 if n == 1 else 1.5 * s) for n, s in STEEP.items()})
    clock = [0.0]
    monkeypatch.setattr("localspec.engine.speculative.time", SimpleNamespace(perf_counter=lambda: clock[0]))
    model = ToyModel(n_vocab=1000, seed=6)
    decode = model.decode

    def timed(tokens, start, logits_for, seq=0):
        clock[0] += real.verify(len(tokens))
        return decode(tokens, start, logits_for, seq=seq)

    model.decode = timed
    options = EngineOptions(drafter="auto", learn_costs=learn_costs)
    engine = Engine(model, None, options, cost=priced)
    engine.drafting.drafters = [BrokenCopies()]
    events = list(engine.generate([0, 5, 9, 11], max_tokens=150))
    rounds = [e for e in events if isinstance(e, Round)]
    assert _tokens(events) == _plain([0, 5, 9, 11], 150, model=ToyModel(n_vocab=1000, seed=6))
    real_s = sum(real.verify(1 + r.drafted) for r in rounds)
    plain_s = len(_tokens(events)) * real.verify(1)
    last_bet = max(real.verify(1 + r.drafted) - real.verify(1) for r in rounds)
    within = real_s <= (1 + LOSS_SHARE) * plain_s + START_TOKENS * priced.verify(1) + last_bet
    assert within == learn_costs
    assert sum(1 for r in rounds if r.rejected) > 1  # it bet, and lost, more than once


class HeldCopies(Drafter):
    """A copy source that is right every time: the next fifteen tokens of the plain answer."""

    name = "ngram"

    def __init__(self, prompt, answer):
        self.prompt_len, self.answer = len(prompt), answer

    def offer(self, context, room, plan):
        at = len(context) - self.prompt_len
        tokens = self.answer[at:at + min(15, room)]
        return Offer(len(tokens), 1e9, Draft(tokens=tokens, source=self.name), [0.99] * len(tokens)) if tokens else None


def _drafted_on_a_clock(monkeypatch, seconds_of):
    """Tokens drafted (all kept) by copies that always hold, the verifies timed by `seconds_of(round,
    positions)` on a clock of their own, costs learnt from them; priced by STEEP."""
    from types import SimpleNamespace

    prompt = [0, 5, 9, 11]
    answer = _plain(prompt, 150, model=ToyModel(n_vocab=1000, seed=6))
    clock, verifies = [0.0], [0]
    monkeypatch.setattr("localspec.engine.speculative.time", SimpleNamespace(perf_counter=lambda: clock[0]))
    model = ToyModel(n_vocab=1000, seed=6)
    decode = model.decode

    def timed(tokens, start, logits_for, seq=0):
        if logits_for:  # (a verify, not the prompt)
            verifies[0] += 1
            clock[0] += seconds_of(verifies[0], len(tokens))
        return decode(tokens, start, logits_for, seq=seq)

    model.decode = timed
    engine = Engine(model, None, EngineOptions(drafter="auto", learn_costs=True), cost=CostModel(dict(STEEP)))
    engine.drafting.drafters = [HeldCopies(prompt, answer)]
    events = list(engine.generate(prompt, max_tokens=150))
    assert _tokens(events) == answer
    return sum(len(r.accepted) for r in events if isinstance(r, Round))


def test_a_machine_slowed_for_every_round_alike_drafts_as_a_quiet_one(monkeypatch):
    """The bound counts a round's loss against what plain tokens took lately (engine/loss_bound.py): a
    machine three times slower than its calibration for every batch alike (another program's load) is
    slower for plain decoding too, so copies that always hold draft as much as on a quiet machine, and
    one stall (a round taking thirty times its price) does not spend the request's room."""
    priced = CostModel(dict(STEEP))
    quiet = _drafted_on_a_clock(monkeypatch, lambda i, n: priced.verify(n))
    slowed = _drafted_on_a_clock(monkeypatch, lambda i, n: 3 * priced.verify(n))
    stalled = _drafted_on_a_clock(monkeypatch, lambda i, n: (30 if i == 8 else 1) * priced.verify(n))
    assert quiet > 100
    assert slowed >= 0.9 * quiet and stalled >= 0.9 * quiet, (quiet, slowed, stalled)

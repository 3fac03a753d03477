"""Constrained decoding in the speculative loop, on the toy model with a DFA grammar: forbidden drafts
end before they are verified, the grammar's state follows only what rounds keep, greedy output with
drafting equals greedy output without, and sampling keeps the exact constrained distribution."""

import json
from collections import Counter

import numpy as np
import pytest

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.constraint import best_allowed, top_k_allowed
from localspec.engine.drafters import Draft
from localspec.engine.events import answer_tokens
from localspec.engine.sampling import SamplingSettings
from localspec.engine.speculative import within_grammar
from localspec.errors import LocalspecError
from toy import TWO_TOKEN_TOY, ToyGrammar, ToyModel, ToyVocab

COST = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}
FORBIDDEN = set(range(4, 24))  # tokens the "no small ids" grammar never allows


def no_small_ids(n_vocab: int = 48, may_end: bool = True) -> str:
    """One state, every token from 24 up allowed, and (`may_end`) the end of the text."""
    return json.dumps({"start": 0, "edges": {"0": {str(t): 0 for t in range(24, n_vocab)}},
                       "final": [0] if may_end else []})


def alternating(n_vocab: int = 48, length: int = 12) -> str:
    """Even tokens at even positions, odd ones at odd positions, ending after exactly `length` tokens."""
    edges = {str(i): {str(t): i + 1 for t in range(4, n_vocab) if t % 2 == i % 2} for i in range(length)}
    return json.dumps({"start": 0, "edges": edges, "final": [length]})


class Recording(ToyModel):
    """The toy that remembers every token it was asked to evaluate."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.decoded: list[int] = []

    def decode(self, tokens, start, logits_for, seq=0):
        self.decoded += list(tokens)
        return super().decode(tokens, start, logits_for, seq)


def _engine(drafter, target=None, draft_len=None, seed=3, noise=2.0, **toy):
    target = target or ToyModel(seed=seed, **toy)
    draft = ToyModel(seed=seed, noise_seed=seed + 100, noise=noise, **toy) if drafter == "model" else None
    return Engine(target, draft, EngineOptions(drafter=drafter, draft_len=draft_len, learn_costs=False,
                                               history_drafts=False),
                  cost=CostModel(dict(COST)), draft_cost_s=0.0)


def test_a_draft_is_cut_before_the_first_token_the_grammar_forbids():
    grammar = ToyVocab(48).grammar(no_small_ids())
    draft = Draft(tokens=[30, 31, 5, 40], q=np.full((4, 48), 1 / 48))
    cut, rows, q_next = within_grammar(draft, grammar)
    assert cut.tokens == [30, 31] and cut.q is not None and cut.q.shape == (2, 48)
    assert len(rows) == 3 and rows[0] is grammar and q_next is not None and q_next.shape == (48,)
    whole, rows, q_next = within_grammar(Draft(tokens=[30, 40]), grammar)
    assert whole.tokens == [30, 40] and len(rows) == 3 and q_next is None


def test_the_greedy_choice_and_top_k_read_only_allowed_tokens():
    grammar = ToyVocab(48).grammar(no_small_ids(may_end=False))
    logits = np.arange(48, dtype=np.float32)[::-1].copy()  # token 0 best, 47 worst
    assert best_allowed(logits, grammar) == 24
    kept = top_k_allowed(logits, grammar, 3)
    assert list(np.flatnonzero(np.isfinite(kept))) == [24, 25, 26]
    assert set(np.flatnonzero(np.isfinite(top_k_allowed(logits, grammar, 0)))) == set(range(24, 48))
    ending = ToyVocab(48).grammar(no_small_ids())
    assert best_allowed(logits, ending) == 1  # the end of the text (eos, id 1) is allowed and scores higher


@pytest.mark.parametrize("drafter,draft_len", [("model", 4), ("ngram", None), ("auto", None)])
def test_forbidden_drafts_never_reach_the_target_and_the_answer_follows_the_grammar(drafter, draft_len):
    target = Recording(seed=3)
    engine = _engine(drafter, target=target, draft_len=draft_len)
    prompt = [0, 30, 31, 5, 6, 30, 31, 5, 6, 30]
    events = list(engine.generate(prompt, max_tokens=40, sampling=SamplingSettings(grammar=no_small_ids())))
    answer = answer_tokens(events)
    assert answer and not FORBIDDEN & set(answer)
    assert not FORBIDDEN & set(target.decoded[len(prompt) - 1:])  # after the prompt: never even evaluated
    if drafter == "model":
        assert events[-1].drafted > 0


@pytest.mark.parametrize("drafter,draft_len", [("model", 3), ("model", 6), ("ngram", None), ("auto", None)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_with_drafting_equals_greedy_without_under_a_grammar(drafter, draft_len, seed):
    prompt = [0, 6, 9, 6, 9, 6, 9, 6]
    settings = SamplingSettings(grammar=alternating())
    plain = answer_tokens(list(_engine("none", seed=seed).generate(prompt, max_tokens=30, sampling=settings)))
    spec = answer_tokens(list(_engine(drafter, seed=seed, draft_len=draft_len).generate(prompt, max_tokens=30,
                                                                                        sampling=settings)))
    assert spec == plain
    assert len(plain) == 12 and all(t % 2 == i % 2 for i, t in enumerate(plain))  # the grammar's whole text, then eos


def test_the_grammar_state_follows_only_what_each_round_keeps():
    """Rejected drafts leave the request's grammar state where the kept tokens put it: after the answer
    the state is the DFA's run over exactly the answer (a wrong rollback would trip ToyGrammar.accept)."""
    engine = _engine("model", draft_len=5, noise=1.0)
    engine.drafter("model").p_min = 0.0  # draft all 5 however unsure: more rejections to roll back
    grammar = ToyVocab(48).grammar(alternating(length=20))
    seen = []
    original = engine.target.vocab.grammar
    engine.target.vocab.grammar = lambda text, trigger=None: seen.append(grammar) or grammar  # type: ignore[method-assign]
    events = list(engine.generate([0, 6, 9], max_tokens=30, sampling=SamplingSettings(grammar="{}")))
    engine.target.vocab.grammar = original  # type: ignore[method-assign]
    answer = answer_tokens(events)
    assert seen and len(answer) == 20 and grammar.state == 20 and grammar.closed
    assert events[-1].drafted > events[-1].accepted > 0  # some drafts were rejected along the way
    assert grammar.forks[0] >= events[-1].drafted


def test_sampling_under_a_grammar_keeps_the_exact_constrained_distribution(monkeypatch):
    """Two tokens at temperature 1 with a grammar that forbids half the vocabulary: speculative sampling
    with a wrong draft model against the masked distribution computed directly. The draft model often
    goes on with a forbidden token (cut, and that row resampled from the residual: `q_next`)."""
    from localspec.engine import speculative

    cuts = []

    def counting(draft, constraint):
        out = speculative_within_grammar(draft, constraint)
        cuts.append(out[2] is not None)
        return out

    speculative_within_grammar = speculative.within_grammar
    monkeypatch.setattr(speculative, "within_grammar", counting)
    n = TWO_TOKEN_TOY["n_vocab"]
    spec = json.dumps({"start": 0, "edges": {"0": {"2": 1, "4": 1, "5": 1, "7": 1}, "1": {"3": 2, "5": 2, "6": 2}},
                       "final": [2]})
    prompt = [0, 5, 6]
    target = ToyModel(**TWO_TOKEN_TOY)

    def masked_softmax(logits, allowed):
        x = np.where(np.isin(np.arange(n), allowed), logits, -np.inf)
        e = np.exp(x - x.max())
        return e / e.sum()

    first = masked_softmax(target.logits_at(prompt), [2, 4, 5, 7])
    exact = {(a, b): first[a] * masked_softmax(target.logits_at(prompt + [a]), [3, 5, 6])[b]
             for a in (2, 4, 5, 7) for b in (3, 5, 6)}
    engine = Engine(ToyModel(**TWO_TOKEN_TOY), ToyModel(**TWO_TOKEN_TOY, noise_seed=9, noise=3.0),
                    EngineOptions(drafter="model", draft_len=3, learn_costs=False, history_drafts=False),
                    cost=CostModel(dict(COST)), draft_cost_s=0.0)
    engine.drafter("model").p_min = 0.0
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, grammar=spec)
    trials, counts = 6000, Counter()
    for seed in range(trials):
        events = list(engine.generate(prompt, max_tokens=2, sampling=settings.with_(seed=seed)))
        counts[tuple(answer_tokens(events)[:2])] += 1
    assert set(counts) <= set(exact) and sum(cuts) > 500
    tv = 0.5 * sum(abs(counts.get(k, 0) / trials - v) for k, v in exact.items())
    assert tv < 0.06, tv  # sampling noise alone: ~0.03 at 6,000 trials


def test_a_grammar_that_does_not_parse_is_refused_before_the_request_runs():
    engine = _engine("none")
    with pytest.raises(json.JSONDecodeError):
        engine.generate([0, 5], max_tokens=4, sampling=SamplingSettings(grammar="not json"))
    assert engine.target.calls == []  # nothing was evaluated


def test_a_grammar_that_allows_nothing_ends_with_a_clear_error():
    engine = _engine("none")
    dead = json.dumps({"start": 0, "edges": {"0": {}}, "final": []})
    with pytest.raises(LocalspecError, match="allows no token"):
        list(engine.generate([0, 5], max_tokens=4, sampling=SamplingSettings(grammar=dead)))
    assert isinstance(ToyVocab(48).grammar(dead), ToyGrammar)


@pytest.mark.parametrize("with_q_next", [True, False])
def test_a_draft_cut_at_a_forbidden_token_is_resampled_from_the_residual(with_q_next):
    """One position: the draft model draws from q, which puts half its mass on a token the grammar
    forbids (p = 0 there). Cutting the draft there and sampling the row from max(0, p - q) keeps p
    exactly; sampling it from p instead (no `q_next`) does not, which is why the rule exists."""
    from localspec.engine.sampling import accept_sampled

    p = np.array([0.0, 0.5, 0.3, 0.2])
    q = np.array([0.5, 0.1, 0.1, 0.3])
    rng = np.random.default_rng(0)
    draw = lambda probs: int(rng.choice(4, p=probs / probs.sum()))  # noqa: E731
    grammar = ToyGrammar({0: {1: 0, 2: 0, 3: 0}}, {0}, 0, eos=99)
    counts = np.zeros(4)
    trials = 40_000
    for _ in range(trials):
        proposed = Draft(tokens=[draw(q)], q=q[None, :])
        draft, rows, q_next = within_grammar(proposed, grammar)
        p_rows = np.stack([p] * (len(draft.tokens) + 1))
        accepted, token = accept_sampled(draft.tokens, p_rows, draft.q, rng.random, draw,
                                         q_next if with_q_next else None)
        counts[draft.tokens[0] if accepted else token] += 1  # the first token of the answer
    tv = 0.5 * np.abs(counts / trials - p).sum()
    assert (tv < 0.01) if with_q_next else (tv > 0.05), tv  # without: ~0.1 off


@pytest.mark.parametrize("drafter", ["ngram", "auto", "model"])
def test_a_lazy_grammar_constrains_from_its_trigger_on(drafter):
    """tool_choice auto's grammar: any tokens until the trigger token, then the DFA (which reads the
    trigger first); greedy output the same with and without drafting."""
    trigger = "x"  # the toy's token 4 + ord('x') % 44 = 36, an even token: the alternating DFA's first
    (token,) = ToyVocab(48).tokenize(trigger, add_special=False)
    settings = SamplingSettings(grammar=alternating(), grammar_trigger=trigger)
    answers = []
    for variant in ("none", drafter):
        target = Recording(seed=2)
        target.a[:, token] += 3.0  # the trigger comes soon, but not at once
        target.vocab.token_bytes = lambda t: b"x" if t == token else b"w"  # type: ignore[method-assign]  (one token)
        answers.append(answer_tokens(list(_engine(variant, target=target, draft_len=3 if variant == "model" else None)
                                          .generate([0, 6, 9, 6, 9], max_tokens=40, sampling=settings))))
    plain, spec = answers
    assert spec == plain
    at = plain.index(token)
    assert any(t % 2 != i % 2 for i, t in enumerate(plain[:at]))  # before the trigger: what the DFA forbids
    assert len(plain[at:]) == 12 and all(t % 2 == i % 2 for i, t in enumerate(plain[at:]))  # from it: the DFA, then the end

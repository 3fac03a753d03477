"""What the tests of drafters that read the target's hidden states share: the script that records
llama.cpp's own drafts (tests/fixtures/mtp_reference.py), its recordings (tests/data/KIND_reference.json), the
round-for-round comparison with them, and the sampled end-to-end check."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from localspec.engine.backend import Model, ModelOptions, system_info
from localspec.engine.events import Round, answer_tokens
from localspec.engine.sampling import Sampler, SamplingSettings

SCRIPTS = Path(__file__).parent / "fixtures"


def _script():
    spec = importlib.util.spec_from_file_location("mtp_reference", SCRIPTS / "mtp_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()


def recorded(kind: str) -> dict:
    return json.loads((Path(__file__).parent / "data" / f"{kind}_reference.json").read_text())


def drafts_of(events) -> tuple[list[list[int]], list[int]]:
    """Each drafted round's tokens, and how many of them the target kept."""
    rounds = [e for e in events if isinstance(e, Round) and e.drafted]
    return [list(r.accepted + r.rejected) for r in rounds], [len(r.accepted) for r in rounds]


def assert_drafts_match(events, reference: dict, min_rounds: int) -> tuple[list[int], int]:
    """Our drafts against llama.cpp's, in every round before the reference's budget first cut a draft
    (after it, the two answers' ends differ); returns our accepted counts and that round count. On the
    kernels that recorded the reference: every draft and every accepted count. On others: the target's
    states differ in their last bits, which a random head amplifies at near ties, so most rounds
    (docs/engine.md, "Heads that draft from the target's states", says how many agreed on AVX2)."""
    drafts, accepted = drafts_of(events)
    n = next(i for i, v in enumerate(reference["verified"] + [0]) if v != reference["n_max"])
    assert n >= min_rounds
    if reference["cpu"] == system_info():
        assert drafts[:n] == reference["drafts"][:n]
        assert accepted[:n] == reference["accepted"][:n]
    else:
        assert sum(a == b for a, b in zip(drafts[:n], reference["drafts"][:n])) >= 0.7 * n
    return accepted, n


def assert_greedy_answers_equal_plain(engine, drafter: str, reference_prompt: str) -> None:
    """Greedy answers with `drafter` at draft lengths 1, 3 and 8, and with `auto`, equal plain decoding's;
    and at the reference's prompt its drafts are kept, and not all of them."""
    prompt = "Write a story about a cat. Once upon a time"
    plain = answer_tokens(engine.generate(prompt, max_tokens=40, drafter="none"))
    for name, draft_len in ((drafter, 1), (drafter, 3), (drafter, 8), ("auto", "default")):
        events = list(engine.generate(prompt, max_tokens=40, drafter=name, draft_len=draft_len))
        assert answer_tokens(events) == plain, (name, draft_len)
    drafts, accepted = drafts_of(engine.generate(reference_prompt, max_tokens=40, drafter=drafter, draft_len=3))
    assert sum(accepted) > 0 and sum(map(len, drafts)) > sum(accepted)


def assert_sampling_keeps_the_targets_distribution(engine, target_path: Path, prompt, drafter: str,
                                                   trials: int = 2000) -> None:
    """Two-token continuations sampled with `drafter` drafting (temperature 1, top-k 3: nine outcomes)
    against the exact distribution from plain decodes of a second load of the target file; the drafts
    must be both kept and thrown away, so both branches of the acceptance rule run. Sampling noise alone
    gives a total variation of about 0.02-0.03 here; the rule without its residual, 0.10-0.18."""
    settings = SamplingSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    if isinstance(prompt, str):
        prompt = engine.target.vocab.tokenize(prompt, add_special=True)
    sampler = Sampler(settings)
    exact_model = Model(target_path, ModelOptions(n_ctx=256, mtp=False))
    try:
        def after(tokens: list[int]) -> np.ndarray:
            exact_model.clear()
            return sampler.probs(exact_model.decode(tokens, 0, [len(tokens) - 1])[0], tokens)

        first = after(list(prompt))
        exact = {(int(a), int(b)): first[a] * p for a in np.flatnonzero(first)
                 for b, p in enumerate(after([*prompt, int(a)])) if p > 0}
    finally:
        exact_model.close()
    counts: Counter = Counter()
    kept = thrown = 0
    for seed in range(trials):
        events = list(engine.generate(list(prompt), max_tokens=2, sampling=settings.with_(seed=seed), drafter=drafter,
                                      draft_len=2))
        counts[tuple(answer_tokens(events)[:2])] += 1
        kept += events[-1].accepted
        thrown += events[-1].drafted - events[-1].accepted
    assert kept > 100 and thrown > 100, (kept, thrown)
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / trials - v) for k, v in exact.items())
    assert tv < 0.05, tv


def assert_two_at_once_draft_as_alone(engine, questions: tuple[str, str], drafter: str, draft_len: int = 3,
                                      round_for_round: bool = True) -> None:
    """Two requests decoded in the same steps (an engine of two slots) each draft with `drafter` there:
    its state follows both sequences through the shared decodes and one step drafts for both, and each
    answer is its answer alone. `round_for_round`: each request's drafts are also what it drafts alone
    (a head whose every choice is a near-tie, a random EAGLE-3 or assistant file, flips some where the
    target's states come from a batch of another shape)."""
    from toy import submit_one

    prompts = [engine.vocab.tokenize(q) for q in questions]
    alone = [list(engine.generate(p, max_tokens=24, drafter=drafter, draft_len=draft_len)) for p in prompts]
    together: list[list] = [[], []]
    for prompt, events in zip(prompts, together):
        submit_one(engine, prompt, events.append, max_tokens=24, drafter=drafter, draft_len=draft_len)
    while engine.step():
        pass
    for solo, shared in zip(alone, together):
        assert answer_tokens(shared) == answer_tokens(solo)
        drafts = [[list(e.accepted + e.rejected) for e in events if isinstance(e, Round) and e.drafted]
                  for events in (solo, shared)]
        assert len(drafts[1]) > 3 and (drafts[1] == drafts[0] or not round_for_round)
        assert any(e.shared for e in shared if isinstance(e, Round) and e.drafted)  # drafted in shared steps

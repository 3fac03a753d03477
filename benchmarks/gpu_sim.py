"""Speculative decoding on a GPU, simulated: rounds priced at a GPU's recorded verify costs, steady and
right after a change of batch shape, for localspec's planner and llama-server's fixed policies.

Acceptance does not depend on the hardware (greedy answers are the target's whatever it runs on), so
which draft tokens a round keeps comes from what was measured elsewhere: a head's published acceptance
by position, or a recording of real answers with the draft model's guesses (`replay_planner.py record`
then `record-draft`). What a round costs comes from a GPU: `GpuClock` replays ggml-cuda's rule (a
decode whose graph changed runs uncaptured; the shape is steady again after WARM_VERIFIES equal ones)
at the costs an H200 measured (docs/gpu.md; `COSTS`). localspec's side runs the engine's own planner
(Drafting, Planner, the drafters' pricing, CostModel's shapes, padding as `speculative.padded` does);
llama-server's policies are its defaults read from common/speculative.cpp: `draft-mtp` drafts n_max = 3
every round (p_min 0), `-md --draft-max 16` drafts 16 with the draft model every round, `ngram-mod`
drafts 48-64 tokens where its 24-token hash matches and nothing otherwise.

    python benchmarks/gpu_sim.py                                  # MTP heads at published acceptance
    python benchmarks/gpu_sim.py --recorded answers.json         # and the default pair's recorded answers

Each "prompt" of the MTP part is an answer of --tokens tokens whose head keeps each position with the
published profile scaled to that prompt's first-position rate (spread from --lowest to 0.95: prose to
code). An estimate of engines, not a measured speed; `benchmarks/gpu/check.sh` measures on a lent GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass, field

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.bench.estimate import QWEN35_MTP
from localspec.engine.costs import CostModel
from localspec.engine.drafters import CopyDrafter, OpeningDrafter
from localspec.engine.drafters.base import Draft
from localspec.engine.drafters.heads import HeadDrafter, HeadTurn
from localspec.engine.sampling import SamplingSettings, Sampler
from localspec.engine.planner import Drafting
from common import median_interval
from replay_trees import kept_of, truth_of

# Recorded on an H200 (docs/findings.md, 2026-12-04, the Qwen3.5-4B-shaped Q4_K_M with its MTP head
# following), milliseconds. `changed`: `mtp_costs.py` run 2, each size right after another size and a
# rollback. `steady` 1: one position in a stream. Steady larger sizes were not measured: taken as the
# changed cost less the change's cost at one position (a captured graph saves kernel launches, which
# depend on the graph's nodes, not on the batch). `mild`: the change as `recurrent_costs.py
# --after-rollback` saw it (the 1st-3rd one-position decodes after a 4-batch: 2.0-3.3 ms over the
# stream), every size alike. Past 32 positions a batch costs 32's per position (CostModel).
STEADY_ONE_MS = 3.75
CHANGED_MS = {1: 10.8, 2: 11.5, 4: 12.0, 8: 13.0, 16: 16.2, 32: 19.4}
MILD_CHANGE_MS = 2.65
HEAD_STEP_MS = 0.58   # an MTP head step per draft token (0.55-0.66 measured)
# A draft model's step against the target's token on that GPU: SmolLM2-135M decoded a token in 1.52 ms
# where the 4B-shaped file took 3.7 (docs/gpu.md): small models are launch-bound there.
DRAFT_RATIO = 0.4


def cost_sets() -> dict[str, tuple[dict[int, float], dict[int, float]]]:
    """Each name's (steady, changed) tables in seconds."""
    penalty = CHANGED_MS[1] - STEADY_ONE_MS
    steady = {n: (ms - penalty if n > 1 else STEADY_ONE_MS) / 1e3 for n, ms in CHANGED_MS.items()}
    return {"recorded": (steady, {n: ms / 1e3 for n, ms in CHANGED_MS.items()}),
            "mild": (steady, {n: s + MILD_CHANGE_MS / 1e3 for n, s in steady.items()})}


@dataclass
class GpuClock:
    """Seconds of each target decode by ggml-cuda's rule (`CostModel.expected`: steady once WARM_VERIFIES
    decodes in a row had its shape, at the changed cost otherwise), from a CostModel that never learns."""

    table: CostModel

    def decode(self, n: int) -> float:
        seconds = self.table.expected(n)
        self.table.decoded(n)
        return seconds


@dataclass
class Answer:
    """One simulated answer: how many draft tokens a chain started at each position would have kept,
    and the draft model's chain (its guesses agree with the answer that far)."""

    keepable: list[int]
    suite: str = "mtp"
    ident: str = ""
    prompt: list[int] = field(default_factory=list)
    truth: list[int] = field(default_factory=list)


def mtp_answers(count: int, tokens: int, lowest: float, seed: int = 0, flat: float | None = None) -> list[Answer]:
    """Answers whose head keeps position i of a chain with the published conditional rate, scaled to
    each answer's own first-position rate (evenly from `lowest` to 0.95); past the published positions,
    the last rate. `flat`: every position of every answer kept with that chance instead."""
    rng = random.Random(seed)
    published = QWEN35_MTP.chained()
    answers = []
    for a in range(count):
        first = flat if flat is not None else lowest + (0.95 - lowest) * a / max(count - 1, 1)
        rates = [first] if flat is not None else [min(r * first / published[0], 0.99) for r in published]
        kept_from = []
        for _ in range(tokens):
            n = 0
            while n < 16 and rng.random() < rates[min(n, len(rates) - 1)]:
                n += 1
            kept_from.append(n)
        # A chain started at p+1 agrees with the one started at p past its first token: keep them consistent.
        keepable = [0] * tokens
        for p in range(tokens - 1, -1, -1):
            keepable[p] = min(kept_from[p], tokens - p - 1)
        answers.append(Answer(keepable, suite=f"mtp flat {flat:.2f}" if flat is not None else "mtp published",
                              ident=f"answer {a}" if flat is not None else f"first {first:.2f}"))
    return answers


class SimHeadTurn(HeadTurn):
    """The engine's head turn (its pricing, acceptance and probes), drafting placeholders: what a round
    keeps is the simulation's."""

    def _following(self, context) -> bool:
        return True

    def draft(self, context, length, sampler) -> Draft:
        per_token_s = self.drafter.cost.per_token_s  # (what a live draft measures, as the engine's drafts carry it)
        return Draft(tokens=[0] * length, source=self.drafter.name, note=per_token_s, seconds=length * per_token_s)


class SimHead(HeadDrafter):
    def __init__(self, per_token_s: float, name: str = "mtp", max_len: int = 3):
        super().__init__(None, per_token_s=per_token_s, learn_costs=False, name=name)
        self.max_len = max_len

    def begin(self, prompt, plan) -> SimHeadTurn:
        turn = super().begin(prompt, plan)
        return SimHeadTurn(self, turn.acceptance)


def run_localspec(answer: Answer, steady: dict, changed: dict, drafters: list, mode: str, step_s: float,
                  loss_bound: bool = True) -> float:
    """Seconds for the answer with the engine's planner; each round verified at `CostModel.shape_for`'s
    size, as the engine pads it."""
    cost = CostModel(dict(steady), changed_s=dict(changed))
    clock = GpuClock(CostModel(dict(steady), changed_s=dict(changed)))  # (the truth: never learns)
    drafting = Drafting(cost, drafters, learn_costs=True, loss_bound=loss_bound)
    planner = drafting.planner(answer.prompt, mode, budget=len(answer.keepable))
    sampler = Sampler(SamplingSettings(temperature=0))
    context, seconds, at = list(answer.prompt) or [0], 0.0, 0
    planner.prefill(context)
    while at < len(answer.keepable):
        planner.remaining = lambda: len(answer.keepable) - at
        draft = planner.draft(context, 64, sampler)
        k = len(draft.tokens)
        kept = min(k, answer.keepable[at]) if draft.source != "ngram" else kept_of(draft.tokens, answer.truth, at)
        size = cost.shape_for(k + 1)
        verify_s = clock.decode(size)
        seconds += verify_s + (k * step_s if draft.source in ("mtp", "model") else 0.0)
        token = answer.truth[at + kept] if answer.truth and at + kept < len(answer.truth) else 0
        planner.observe(draft, kept, verify_s, size, token)
        step = answer.truth[at:at + kept + 1] if answer.truth else [0] * (kept + 1)
        context.extend(step)
        at += kept + 1
    planner.finish(answer.truth or context[1:])  # (what every drafter learns from an answer, as live)
    return seconds


def run_fixed(answer: Answer, steady: dict, changed: dict, k: int, step_s: float) -> float:
    """Seconds for the answer drafting k tokens every round (llama-server's draft-mtp and -md)."""
    clock = GpuClock(CostModel(dict(steady), changed_s=dict(changed)))
    seconds, at = 0.0, 0
    while at < len(answer.keepable):
        seconds += k * step_s + clock.decode(k + 1)
        at += min(k, answer.keepable[at]) + 1
    return seconds


def run_ngram_mod(answer: Answer, steady: dict, changed: dict, n_match: int = 24, n_max: int = 64,
                  n_min: int = 48) -> float:
    """Seconds for the answer with llama-server's ngram-mod: each n_match-token window maps to the token
    after its latest occurrence (added in chunks of 32); a draft chains lookups up to n_max, and is
    dropped when shorter than n_min."""
    clock = GpuClock(CostModel(dict(steady), changed_s=dict(changed)))
    text = list(answer.prompt)
    table: dict[tuple, int] = {}
    added = 0

    def add_up_to(end: int) -> None:
        nonlocal added
        for i in range(added, end - n_match):
            table[tuple(text[i:i + n_match])] = text[i + n_match]
        added = max(added, end - n_match)

    add_up_to(len(text))
    seconds, at = 0.0, 0
    while at < len(answer.truth):
        if added + 32 < len(text):
            add_up_to(len(text))
        draft = []
        if len(text) >= n_match:  # the window ends with the pending token, as llama.cpp's id_last
            probe = text[-n_match:]
            while len(draft) < n_max and (t := table.get(tuple(probe[-n_match:]))) is not None:
                draft.append(t)
                probe.append(t)
            if len(draft) < n_min:
                draft = []
        kept = kept_of(draft, answer.truth, at)
        seconds += clock.decode(len(draft) + 1)
        text.extend(answer.truth[at:at + kept + 1])
        at += kept + 1
    return seconds


def recorded_answers(path: str) -> tuple[list[Answer], dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not all("draft_guesses" in item for item in data["answers"]):
        raise SystemExit(f"{path} has no draft model guesses: run replay_planner.py record-draft on it first")
    answers = []
    for item in data["answers"]:
        truth = truth_of(data, item)
        guesses = item["draft_guesses"]
        keepable = []
        for at in range(len(truth)):
            n = 0
            while at + n < len(truth) and n < 64 and guesses[at + n][0] == truth[at + n]:
                n += 1
            keepable.append(n)
        answers.append(Answer(keepable, suite=item["suite"], ident=item["id"], prompt=item["prompt"], truth=truth))
    return answers, data


def report(label: str, answers: list[Answer], speedups: list[float], floor: float = 0.97) -> None:
    by_suite: dict[str, list[tuple[str, float]]] = {}
    for answer, s in zip(answers, speedups):
        by_suite.setdefault(answer.suite, []).append((answer.ident, s))
    for suite, pairs in by_suite.items():
        values = [s for _i, s in pairs]
        low, high = median_interval(values)
        worst_id, worst = min(pairs, key=lambda p: p[1])
        below = sum(v < floor for v in values)
        print(f"  {label:24} {suite:14} median {statistics.median(values):.2f}x ({low:.2f}-{high:.2f})  "
              f"worst {worst:.2f}x ({worst_id})  {below} of {len(values)} below {floor:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recorded", default=None, help="a replay_planner.py recording with record-draft's guesses")
    parser.add_argument("--prompts", type=int, default=60, help="simulated MTP answers")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per simulated MTP answer")
    parser.add_argument("--lowest", type=float, default=0.3, help="the lowest first-position acceptance simulated")
    parser.add_argument("--flat", type=float, default=0.75, help="also every position kept with this chance")
    parser.add_argument("--draft-ratio", type=float, default=DRAFT_RATIO,
                        help="a draft model token against the target's on the GPU")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N recorded answers")
    args = parser.parse_args()
    for name, (steady, changed) in cost_sets().items():
        one = steady[1]
        print(f"{name} costs, ms: steady " + " ".join(f"{n}:{s * 1e3:.1f}" for n, s in steady.items())
              + " | after a change " + " ".join(f"{n}:{s * 1e3:.1f}" for n, s in changed.items()))
        head_s = HEAD_STEP_MS / 1e3
        for answers in (mtp_answers(args.prompts, args.tokens, args.lowest, flat=args.flat),
                        mtp_answers(args.prompts, args.tokens, args.lowest)):
            random.Random(1).shuffle(answers)  # (served in no order of acceptance)
            plain = [run_fixed(a, steady, changed, 0, 0.0) for a in answers]  # (its first decodes warm up too)
            head = [SimHead(head_s)]  # one engine's drafter: what it learns carries from request to request
            runs = {
                "localspec mtp": [run_localspec(a, steady, changed, head, "mtp", head_s) for a in answers],
                "llama-server draft-mtp 3": [run_fixed(a, steady, changed, 3, head_s) for a in answers],
            }
            for label, seconds in runs.items():
                report(label, answers, [p / s for p, s in zip(plain, seconds)])
        if args.recorded:
            recorded, data = recorded_answers(args.recorded)
            recorded = recorded[:args.limit]
            control = set(data["control"])
            step_s = one * args.draft_ratio
            plain = [run_fixed(a, steady, changed, 0, 0.0) for a in recorded]
            drafters = [CopyDrafter(control.__contains__, OpeningDrafter()), SimHead(step_s, "model", max_len=16)]
            runs = {
                "localspec auto": [run_localspec(a, steady, changed, drafters, "auto", step_s) for a in recorded],
                "llama-server -md 16": [run_fixed(a, steady, changed, 16, step_s) for a in recorded],
                "llama-server ngram-mod": [run_ngram_mod(a, steady, changed) for a in recorded],
            }
            for label, seconds in runs.items():
                report(label, recorded, [p / s for p, s in zip(plain, seconds)])
        sys.stdout.flush()


if __name__ == "__main__":
    main()

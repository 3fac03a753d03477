"""Choosing each round's draft length from measured costs and running acceptance.

Expected tokens from a draft of k with conditional acceptance a_1..a_k (a_i = P(position i kept |
position i-1 kept)) is 1 + sum_j prod_{i<=j} a_i: the accepted run plus the target's own token. Its
price is the drafting time plus one verification of k+1 positions. The length with the best ratio
wins, and k = 0 (plain decoding) wins whenever drafting does not pay.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from localspec.engine.costs import CostModel

# A candidate tree fills verify positions that cost at most this much more than its chain's alone: the
# staircase of verify costs (12 positions at 8's price on some CPUs, up to 32-64 nearly free on a GPU)
# makes them free, and a leaf can only add tokens (benchmarks/replay_trees.py replays trees at these costs).
TREE_SLACK = 0.1


def free_positions(cost: CostModel, positions: int, slack: float = TREE_SLACK) -> int:
    """The most verify positions (calibrated sizes only) costing at most `slack` more than `positions`."""
    limit = cost.verify(positions) * (1 + slack)
    return max([n for n in cost.verify_s if n >= positions and cost.verify(n) <= limit], default=positions)


def step_cost(cost: CostModel, lengths: Sequence[int]) -> float:
    """Seconds of one decode holding parts of these lengths, one per sequence. Each sequence has KV cells
    of its own, and llama.cpp then splits a batch into micro-batches taking as many tokens from every
    sequence in them: each distinct length adds a pass over the sequences that reach it (1 + 1 + 16 is
    verify(3) for 3 x 1, then verify(15)); a pass over s sequences x p positions costs about what one
    sequence of s * p does."""
    parts = sorted(n for n in lengths if n > 0)
    total, done = 0.0, 0
    for i, n in enumerate(parts):
        if n > done:
            total += cost.verify((len(parts) - i) * (n - done))
            done = n
    return total


def steps_saved_s(cost: CostModel, ahead: Sequence[float], queued: bool = False) -> float:
    """Seconds of later steps saved when sequences decoded together (one token each a step) get
    `ahead[i]` tokens further now. With none waiting for a slot, a sequence x tokens ahead leaves the
    steps x steps sooner, and the steps it leaves cost what they cost without it (step_cost of the
    others), so one sequence alone ahead saves x * (verify(n) - verify(n - 1)) and all of them ahead
    alike save x whole steps; levels in between add up like step_cost's passes. With requests
    `queued` for a slot, every slot stays full until the queue drains (a sequence that ends sooner
    lets the next request in sooner): the work left is fixed, n tokens a step, so any sequence's token
    ahead saves 1/n of a full step, verify(n) / n (on a GPU, where a token beside others adds nearly
    nothing to a step, that is most of a token; on a CPU about what it adds)."""
    if queued and ahead:
        return sum(max(x, 0.0) for x in ahead) * cost.verify(len(ahead)) / len(ahead)
    total, done = 0.0, 0.0
    for i, x in enumerate(sorted(ahead)):
        if x > done:
            behind = cost.verify(i) if i else 0.0  # the sequences ahead by less than x
            total += (x - done) * (cost.verify(len(ahead)) - behind)
            done = x
    return total


# A shared step drafts only where the later steps its drafts are expected to save exceed the seconds
# they add to it by this much: the copies' chances are estimates (what shared drafts kept is learnt as
# Promises.trust).
SHARED_MARGIN = 0.3


def shared_lengths(cost: CostModel, chances: Sequence[Sequence[float]], chunks: Sequence[int] = (),
                   room: int = 1 << 30, margin: float = SHARED_MARGIN, trust: float = 1.0,
                   queued: bool = False, drafting_s: Callable[[Sequence[int]], float] = lambda ks: 0.0) -> list[int]:
    """How many tokens of each sequence's proposal one shared decode verifies, beside one pending token
    each and the prompts' `chunks`: drafts of one length share a pass (`step_cost`), so the step
    chooses one length L for every proposal (each capped by its own length), the one that saves the
    most seconds: the later steps its expected kept tokens save (`steps_saved_s`) beyond `1 + margin`
    times the seconds the drafts add to this step; then it drops the proposals that lower that.
    Priced so, a draft in a step of several sequences is worth what its sequence adds to a step, not
    a step's worth: the other sequences decode as many steps whatever it drafts. `chances`: each
    sequence's proposal (empty: nothing to draft); the draft tokens they promise count `trust` each
    (`Promises.trust`). At most `room` draft tokens in all; `queued`: requests wait for a slot
    (`steps_saved_s`). `drafting_s`: the seconds drafting these lengths takes (nothing for lookups)."""
    plain_s = step_cost(cost, [1] * len(chances) + list(chunks))

    def saving(ks: list[int]) -> float:
        if sum(ks) > room:
            return -math.inf
        ahead = [trust * (expected_tokens(list(c[:k])) - 1) for c, k in zip(chances, ks)]
        added_s = step_cost(cost, [1 + k for k in ks] + list(chunks)) - plain_s + drafting_s(ks)
        return steps_saved_s(cost, ahead, queued) - (1 + margin) * added_s

    plain = [0] * len(chances)
    best, most = plain, 0.0
    for length in sorted({n - 1 for n in cost.verify_s if n > 1}):
        ks = [min(length, len(c)) for c in chances]
        if ks != best and (saved := saving(ks)) > most:
            best, most = ks, saved
    for i, k in enumerate(best):
        if k and (saved := saving(fewer := [*best[:i], 0, *best[i + 1:]])) > most:
            best, most = fewer, saved
    return best


@dataclass
class Promises:
    """Draft tokens shared steps kept against the tokens their chances promised, decayed by draft:
    `trust` is what a promised token is worth when the next shared step is priced. The chances come
    from each request's lookups as priced for rounds alone, and the proposal a step verifies is the
    one promising most among several, so they may overstate; a lookup whose chances are wrong is then
    verified for a few steps, not for every one. Starts trusting the chances (`prior` tokens
    kept of as many promised); never above 1. A shared step that offered drafts and verified none
    (`passed`) forgets a little too, so trust lost in one stretch of text comes back in later ones:
    held only by drafts, one answer's broken copies would keep every later shared step from drafting."""

    promised: float = 0.0
    kept: float = 0.0
    prior: float = 8.0
    decay: float = 0.95
    idle_decay: float = 0.98  # per shared step passed: ~100 steps (a few answers of four) restore most trust

    @property
    def trust(self) -> float:
        return min((self.kept + self.prior) / (self.promised + self.prior), 1.0)

    def observe(self, promised: float, kept: int) -> None:
        self.promised = self.promised * self.decay + promised
        self.kept = self.kept * self.decay + kept

    def passed(self) -> None:
        self.promised *= self.idle_decay
        self.kept *= self.idle_decay


@dataclass
class DrafterCost:
    """Seconds per drafted token (0 for lookup drafters), learned as drafting happens."""

    per_token_s: float = 0.0
    alpha: float = 0.1

    def observe(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0:
            per_token = seconds / n_tokens
            if self.per_token_s > 0:
                per_token = min(per_token, 2.0 * self.per_token_s)  # a stall is not the drafter's cost
            self.per_token_s += self.alpha * (per_token - self.per_token_s)


@dataclass
class Acceptance:
    """Decayed counts of tries and accepts per draft position, with a Beta prior per position."""

    prior_mean: float = 0.6
    prior_strength: float = 2.0
    decay: float = 0.97
    tried: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)

    def rates(self, k: int) -> list[float]:
        out = []
        for i in range(k):
            tried = self.tried[i] if i < len(self.tried) else 0.0
            kept = self.kept[i] if i < len(self.kept) else 0.0
            # Deeper positions inherit a slightly lower prior than the one before them.
            prior = self.prior_mean * (0.97 ** i)
            out.append((kept + prior * self.prior_strength) / (tried + self.prior_strength))
        return out

    def observe(self, drafted: int, accepted: int) -> None:
        self.tried = [t * self.decay for t in self.tried]
        self.kept = [k * self.decay for k in self.kept]
        while len(self.tried) < drafted:
            self.tried.append(0.0)
            self.kept.append(0.0)
        for i in range(min(drafted, accepted + 1)):
            self.tried[i] += 1.0
            self.kept[i] += 1.0 if i < accepted else 0.0

    @property
    def samples(self) -> float:
        return self.tried[0] if self.tried else 0.0


# Copies by age (how many tokens before it already agree with its source): the lower edge of each age
# class, and the prior chance that the next copied token is kept, apart for copies of the prompt (the
# text an edit rewrites) and of the answer itself (mostly coincidental repeats). Age 0 is a copy resumed
# right after a token the target replaced; ages from 10 on share one class (one break far into a copy
# must not price the rest of it out). Measured with the default pair: docs/tuning.md, "Copy priors";
# benchmarks/replay_planner.py replays a change on recorded answers.
AGE_CLASSES = (0, 1, 2, 3, 4, 5, 7, 10)
PROMPT_COPY_PRIORS = (0.2, 0.3, 0.65, 0.75, 0.85, 0.9, 0.9, 0.96)
ANSWER_COPY_PRIORS = (0.2, 0.2, 0.35, 0.5, 0.55, 0.6, 0.65, 0.8)
# How many copied tokens each class's prior weighs: 16 for copies 5 or more tokens old (measured over
# many requests, and an edit's copies break where the edit is, so one break says little about the next
# copy), 2 for younger ones (whether a fresh match holds depends on the request, so their record must
# move their price within a few drafts). docs/tuning.md, "Prior weights".
COPY_PRIOR_STRENGTHS = tuple(16.0 if age >= 5 else 2.0 for age in AGE_CLASSES)
# From this age a copy's prior (a prompt's copy this old is nearly always kept) is as good as a
# measured rate for the margin a draft must promise (`CopyAcceptance.evidence`).
MEASURED_FROM_AGE = 10


# Copies of an earlier request (the "history" drafter) by age: there the age counts the prompt too, so a
# regenerated answer starts at the largest class. Two more classes above 10: text that agrees with an
# earlier request over 32 tokens or more is being retold (a regeneration at temperature 0 keeps every
# token), where a copy within one request agreeing that long still meets its edit points.
HISTORY_AGE_CLASSES = (0, 1, 2, 3, 4, 5, 7, 10, 16, 32)
HISTORY_COPY_PRIORS = (0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)


@dataclass
class CopyAcceptance:
    """Decayed counts of tries and accepts of copied tokens by the copy's age, with a Beta prior each.

    Position i of a copy drafted at age a is a copied token at age a + i: the same table answers for
    every draft position, so a long copy's later tokens are priced from what copies of that age did,
    not from a position this request has never drafted that far. `classes`: the lower edge of each
    age class, one prior each, weighing `prior_strength` tried tokens (one weight for all classes, or
    one per class).
    """

    priors: tuple[float, ...] = ANSWER_COPY_PRIORS
    prior_strength: float | tuple[float, ...] = 2.0
    decay: float = 0.97
    classes: tuple[int, ...] = AGE_CLASSES
    tried: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert len(self.priors) == len(self.classes)
        strength = self.prior_strength
        self._strengths = tuple(strength) if isinstance(strength, tuple) else (strength,) * len(self.classes)
        assert len(self._strengths) == len(self.classes)
        if not self.tried:
            self.forget()

    def _class(self, age: int) -> int:
        return bisect.bisect_right(self.classes, age) - 1

    def rate(self, age: int) -> float:
        c = self._class(age)
        weight = self._strengths[c]
        return (self.kept[c] + self.priors[c] * weight) / (self.tried[c] + weight)

    def rates(self, age: int, k: int) -> list[float]:
        return [self.rate(age + i) for i in range(k)]

    def observe(self, age: int, drafted: int, accepted: int) -> None:
        self.tried = [t * self.decay for t in self.tried]
        self.kept = [k * self.decay for k in self.kept]
        for i in range(min(drafted, accepted + 1)):
            c = self._class(age + i)
            self.tried[c] += 1.0
            self.kept[c] += 1.0 if i < accepted else 0.0

    def samples(self, age: int) -> float:
        return self.tried[self._class(age)]

    def evidence(self, age: int) -> float:
        """Copied tokens the price of this age rests on, for `margin_for`: its record, and from
        `MEASURED_FROM_AGE` on its prior's weight too. Counted as nothing there, no copy paid the
        margin of a guess where verifying is dear and none was ever drafted; counted for younger copies
        (resumed after an edit point), it drafts them too long (docs/tuning.md, "Margins")."""
        c = self._class(age)
        return self.tried[c] + (self._strengths[c] if self.classes[c] >= MEASURED_FROM_AGE else 0.0)

    def forget(self) -> None:
        self.tried = [0.0] * len(self.classes)
        self.kept = [0.0] * len(self.classes)


def expected_tokens(rates: list[float]) -> float:
    """Tokens a round yields drafting tokens kept with these conditional chances: the accepted run plus
    the target's own token."""
    total, run = 1.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


def speedup_bound(alpha: float, verify: Callable[[int], float], draft_per_token_s: float, max_len: int = 16) -> float:
    """The best speedup over plain decoding that a drafter whose every token is kept with chance
    `alpha` allows under these costs, over all draft lengths up to `max_len` (copies come in long runs
    and can beat it: their later tokens are kept more often than their first)."""
    best = 1.0
    for k in range(1, max_len + 1):
        best = max(best, expected_tokens([alpha] * k) * verify(1) / (verify(k + 1) + k * draft_per_token_s))
    return best


def margin_for(samples: float) -> float:
    """How much over plain decoding a draft must promise: more while its acceptance rests on a prior
    and a few samples (a wrong draft costs a whole verification), 2% once well measured."""
    return 0.02 + 0.25 / (1.0 + samples)


def best_length(rates: list[float], cost: CostModel, draft_per_token_s: float,
                margin: float = 0.02, draft_fixed_s: float = 0.0, one_off: bool = False) -> tuple[int, float]:
    """(k, expected tokens per second) maximizing throughput over k = 0..len(rates); k = 0 (plain
    decoding) unless the best draft promises `margin` over it. A draft of k tokens costs
    `draft_fixed_s + k * draft_per_token_s` (a block drafter's pass costs the same for any k).

    Only lengths whose verify batch (k + 1 positions) was measured are chosen: between measured sizes
    the cost is not smooth (on a CPU a batch can cost more than a larger one), so an
    interpolated price can be far off in either direction. Verifies are priced as this round would pay
    (`CostModel.price`): where a change of batch shape costs, keeping the shape held is cheaper, plain
    decoding included, and a draft that fills the held shape's positions costs no more than a shorter one.
    `one_off`: a lookup's draft, which does not go on round after round as a model's does, leaves the
    shape held for one round and pays the way back (`CostModel.detour`)."""
    plain = 1.0 / cost.price(1)
    best_k, best_rate = 0, plain
    expected, run = 1.0, 1.0  # expected_tokens(rates[:k]), summed as k grows
    for k, a in enumerate(rates, start=1):
        run *= a
        expected += run
        if k + 1 not in cost.verify_s:
            continue
        verify = cost.detour(k + 1) if one_off else cost.price(k + 1)
        rate = expected / (draft_fixed_s + k * draft_per_token_s + verify)
        if rate > best_rate:
            best_k, best_rate = k, rate
    if best_rate < plain * (1 + margin):
        return 0, plain
    return best_k, best_rate

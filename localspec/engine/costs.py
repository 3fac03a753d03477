"""What verifying a batch costs the target: the calibrated tables (steady, and right after a change of
batch shape where that costs more), the shape the last verifies had, and a speed factor learnt from real
rounds. Every draft is priced with one of these (engine/adaptive.py); docs/engine.md, "Batch shapes"."""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass, field


# A verify costs its steady price once this many verifies in a row had its batch shape: ggml's CUDA
# backend runs a changed graph uncaptured, captures it on the next equal call and replays it after
# (ggml_backend_cuda_graph_compute; measured: docs/gpu.md, "CUDA graphs want one batch shape").
WARM_VERIFIES = 3
# A change of shape is priced as paid over the rounds the new shape will be held for: this many before
# any change was seen, then what the shapes were held for (decayed by SETTLE_ALPHA a change), at least
# as long as the shape held now. Priced whole on its first round, no draft would leave plain decoding's
# shape; not at all, drafts would change shape every round and pay the warm-up every time.
SETTLE_ROUNDS = 16
SETTLE_ALPHA = 0.2
# A stall (another program taking the cores, a page fault) is not what a batch costs: a round counts as
# at most this many times, and at least its inverse times, what it was expected to take.
STALL_RATIO = 2.0
# What plain decoding takes lately: the mean of this many latest one-position verifies, once there are
# PLAIN_SAMPLES of them.
PLAIN_KEEP = 32
PLAIN_SAMPLES = 3


@dataclass
class CostModel:
    """Seconds to verify a batch of n positions on the target: the calibrated cost of each batch size,
    times a speed factor learned from real rounds.

    The rule: the calibration gives the shape (how much dearer 4 positions are than 1), which is what
    draft lengths are chosen by; real rounds move one factor for every size alike, because the
    machine's speed drifts (another process, thermal limits, a cached calibration from a quieter hour)
    for all sizes at once. Per-size learning would let the sizes in use drift while unused ones kept
    stale figures and looked cheap (tests/test_engine_toy.py: a slower machine moves every size alike).
    """

    verify_s: dict[int, float]  # the calibration; real rounds move `scale`, never these
    alpha: float = 0.05  # weight of a new observation in the speed factor
    scale: float = 1.0
    # Each size right after the batch shape changed, where that costs more than the steady `verify_s`
    # (a GPU replaying captured graphs); None where a change costs nothing (a CPU).
    changed_s: dict[int, float] | None = None
    shape: int = 0  # positions of the last verify decoded, and how many verifies in a row had them
    held: int = 0
    settle: float = 0.0  # verifies a shape is held for once changed to, decayed (SETTLE_ROUNDS before any)
    plain_s: deque[float] = field(default_factory=lambda: deque(maxlen=PLAIN_KEEP))  # latest 1-position verifies

    def __post_init__(self) -> None:
        self._table = self._monotone(self.verify_s)  # derived once: verify() is on the hot path
        self._changed = None if self.changed_s is None else self._monotone(
            {n: max(s, self.verify_s.get(n, s)) for n, s in self.changed_s.items()})

    @staticmethod
    def _monotone(costs: dict[int, float]) -> dict[int, float]:
        """Never cheaper for a larger batch, never dearer for a smaller one: one slow calibration sample
        cannot make a batch size look dearer than larger ones."""
        table: dict[int, float] = {}
        lowest = math.inf
        for m in sorted(costs, reverse=True):
            lowest = min(lowest, costs[m])
            table[m] = lowest
        return table

    def verify(self, n: int) -> float:
        """Steady: interpolated over the calibrated table, times the learned speed factor."""
        return self.scale * self._interpolate(n, self._table)

    def changed(self, n: int) -> float:
        """A verify of n positions right after the batch shape changed (`verify` where that costs nothing)."""
        if self._changed is None:
            return self.verify(n)
        return self.scale * self._interpolate(n, self._changed)

    def shape_for(self, n: int) -> int:
        """The batch size to verify n positions at: n, or the shape held now where padding up to it is
        cheaper than changing (a pad position is evaluated and dropped, never read)."""
        if self._changed is None or self.shape <= n or self._switching(n) <= self.verify(self.shape):
            return n
        return self.shape

    def price(self, n: int) -> float:
        """What verifying n positions costs, as drafts are priced: steady at the shape held (padded up to
        it, `shape_for`); at another shape, steady plus its share of the warm-up (`_switching`)."""
        if self._changed is None:
            return self.verify(n)
        m = self.shape_for(n)
        return self.verify(m) if m == self.shape else self._switching(m)

    def detour(self, n: int) -> float:
        """What verifying n positions costs for one round only (a lookup's copy, which ends): steady at
        the shape held (padded up to it); at another shape, the changed cost and the way back (the shape
        held warms up again over WARM_VERIFIES verifies)."""
        if self._changed is None:
            return self.verify(n)
        m = self.shape_for(n)
        if m == self.shape:
            return self.verify(m)
        back = WARM_VERIFIES * (self.changed(self.shape) - self.verify(self.shape)) if self.shape else 0.0
        return self.changed(m) + back

    def _switching(self, n: int) -> float:
        """A verify at a new shape: its steady cost, plus the warm-up's extra (WARM_VERIFIES verifies at
        the changed cost) spread over the SETTLE_ROUNDS rounds a shape is expected to be kept for."""
        settle = max(self.settle or SETTLE_ROUNDS, self.held)  # (a shape held long is held long again)
        return self.verify(n) + (self.changed(n) - self.verify(n)) * min(WARM_VERIFIES / settle, 1.0)

    def expected(self, n: int) -> float:
        """What a verify of n positions is expected to take, knowing the shapes before it: steady once
        WARM_VERIFIES verifies in a row had its shape, as after a change otherwise."""
        steady = n == self.shape and self.held >= WARM_VERIFIES
        return self.verify(n) if steady or self._changed is None else self.changed(n)

    def detour_factor(self) -> float:
        """What a one-token probe from plain decoding costs against what it costs where shapes cost
        nothing: its verify of 2, plus leaving the one-position shape and coming back to it
        (WARM_VERIFIES verifies at the changed cost each way), over verify(2) - verify(1). Probes
        wait this many times longer, so they cost the same share of an answer (1 on a CPU)."""
        if self._changed is None:
            return 1.0
        extra = self.verify(2) - self.verify(1)
        warm_ups = WARM_VERIFIES * (self.changed(2) - self.verify(2) + self.changed(1) - self.verify(1))
        return (extra + warm_ups) / max(extra, 1e-3 * self.verify(1))

    def decoded(self, n: int) -> None:
        """A verify of n positions was decoded (after `observe`, which prices it by the shapes before)."""
        if n != self.shape and self.held:
            self.settle = self.held if not self.settle else self.settle + SETTLE_ALPHA * (self.held - self.settle)
        self.held = self.held + 1 if n == self.shape else 1
        self.shape = n

    @staticmethod
    def _interpolate(n: int, table: dict[int, float]) -> float:
        if n in table:  # every length a draft is chosen at (best_length): no sorting on the hot path
            return table[n]
        sizes = sorted(table)
        if n <= sizes[0]:
            return table[sizes[0]] * n / sizes[0]
        if n >= sizes[-1]:
            return table[sizes[-1]] * n / sizes[-1]  # past the largest size measured: no cheaper per position
        i = bisect.bisect_left(sizes, n)
        a, b = sizes[i - 1], sizes[i]
        t = (n - a) / (b - a)
        return table[a] * (1 - t) + table[b] * t

    def recalibrate(self, verify_s: dict[int, float], scale: float = 1.0,
                    changed_s: dict[int, float] | None = None) -> None:
        """A new calibration (engine.calibration.Calibrator.remeasure) replaces the tables in place:
        every drafter prices with this object."""
        self.verify_s = dict(verify_s)
        self.changed_s = None if changed_s is None else dict(changed_s)
        self.scale = scale
        self.__post_init__()

    def counted(self, n: int, seconds: float) -> float:
        """A verify of n positions that took `seconds`, as costs count it: within STALL_RATIO of what it
        was expected to take (`expected`, knowing the shapes before it)."""
        expected = self.expected(n)
        return min(max(seconds, expected / STALL_RATIO), expected * STALL_RATIO)

    def observe(self, n: int, seconds: float) -> float:
        """A verify of n positions took `seconds`: the speed factor moves by at most a few percent (a stall
        counts as STALL_RATIO). Returns the seconds it counted (`counted`)."""
        if n == 1:
            self.plain_s.append(seconds)
        counted = self.counted(n, seconds)
        self.scale *= (counted / self.expected(n)) ** self.alpha
        return counted

    def plain_lately(self) -> float:
        """What one plain token took lately: the mean of the latest one-position verifies but the
        slowest, stalls and all (another program's load slows plain decoding as it slows any batch; one
        stall does not say what plain decoding costs), or `verify(1)` before PLAIN_SAMPLES of them."""
        if len(self.plain_s) < PLAIN_SAMPLES:
            return self.verify(1)
        return statistics.fmean(sorted(self.plain_s)[:-1])

    @property
    def plain_tokens_per_s(self) -> float:
        return 1.0 / self.verify(1)

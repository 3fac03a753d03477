"""The speedup every front door shows, by one rule.

A round that drafted nothing is a plain round: its own time is what plain decoding took. A round that
drafted is priced at what plain decoding would have taken for the tokens it emitted: the median of this
process's recent plain rounds on this target at a comparable context length (the same power-of-two
bucket, or a neighbouring one when that has too few), or, where none were measured yet, the
calibration's one-token cost, and then the figure says it is an estimate.

    speedup = plain-equivalent time / time taken

So an answer that drafted nothing shows 1.00x whatever the calibration says, and a calibration taken
on a busy machine cannot inflate the figure once plain rounds were measured. The planner asks for a
few plain rounds where a bucket has none and drafting promises little (`PlainRounds.wanted`).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

MIN_SAMPLES = 3       # plain rounds that make a bucket's cost measured
KEEP = 32             # recent plain rounds kept per bucket
MAX_AGE_S = 600.0     # older plain rounds no longer say what plain decoding costs now


def bucket(context_len: int) -> int:
    """Context lengths within a factor of two share a bucket (64-127, 128-255, ...; below 64 is one)."""
    return max(context_len, 64).bit_length()


@dataclass
class PlainRounds:
    """Measured plain rounds of one target in this process: seconds per round by context bucket."""

    clock: Callable[[], float] = time.monotonic
    _samples: dict[int, deque[tuple[float, float]]] = field(default_factory=dict)  # bucket -> (when, seconds)

    def record(self, context_len: int, seconds: float) -> None:
        self._samples.setdefault(bucket(context_len), deque(maxlen=KEEP)).append((self.clock(), seconds))

    def _recent(self, b: int) -> list[float]:
        oldest = self.clock() - MAX_AGE_S
        return [s for when, s in self._samples.get(b, ()) if when >= oldest]

    def per_token_s(self, context_len: int) -> float | None:
        """What one plain token costs at this context length, measured; None when not measured enough."""
        b = bucket(context_len)
        found = self._recent(b)
        if len(found) < MIN_SAMPLES:
            found += self._recent(b - 1) + self._recent(b + 1)
        return statistics.median(found) if len(found) >= MIN_SAMPLES else None

    def wanted(self, context_len: int) -> bool:
        """Whether a plain round here would make the baseline measured."""
        return self.per_token_s(context_len) is None


@dataclass(frozen=True)
class Speedup:
    factor: float                   # plain-equivalent time over time taken; 0 before any round
    baseline_tokens_per_s: float    # plain decoding's rate on these tokens
    measured: bool                  # every price came from measured plain rounds (False: an estimate)


@dataclass
class SpeedupMeter:
    """One answer's running speedup. `estimate_s`: the calibration's one-token cost, for buckets whose
    plain rounds were not measured."""

    plain: PlainRounds
    estimate_s: Callable[[], float]
    plain_s: float = 0.0            # time of this answer's plain rounds
    drafted_s: float = 0.0          # time of its drafting rounds
    tokens: int = 0
    _drafted_tokens: dict[int, int] = field(default_factory=dict)  # context bucket -> tokens emitted by drafting rounds
    _context_of: dict[int, int] = field(default_factory=dict)      # bucket -> a context length in it

    def add(self, context_len: int, seconds: float, emitted: int, drafted: bool) -> Speedup:
        """One round: its context length before it, its wall time, the tokens it emitted, whether it drafted."""
        self.tokens += emitted
        if drafted:
            b = bucket(context_len)
            self.drafted_s += seconds
            self._drafted_tokens[b] = self._drafted_tokens.get(b, 0) + emitted
            self._context_of[b] = context_len
        else:
            self.plain_s += seconds
            self.plain.record(context_len, seconds)
        return self.current()

    def current(self) -> Speedup:
        taken = self.plain_s + self.drafted_s
        if taken <= 0:
            one = self.estimate_s()
            return Speedup(0.0, 1.0 / one if one > 0 else 0.0, False)
        equivalent, measured = self.plain_s, True
        for b, n in self._drafted_tokens.items():
            per_token = self.plain.per_token_s(self._context_of[b])
            if per_token is None:
                per_token, measured = self.estimate_s(), False
            equivalent += n * per_token
        factor = equivalent / taken
        return Speedup(factor, self.tokens / equivalent if equivalent > 0 else 0.0, measured)

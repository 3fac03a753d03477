"""Choosing each round's draft length from measured costs and running acceptance.

Expected tokens from a draft of k with conditional acceptance a_1..a_k (a_i = P(position i kept |
position i-1 kept)) is 1 + sum_j prod_{i<=j} a_i: the accepted run plus the target's own token. Its
price is the drafting time plus one verification of k+1 positions. The length with the best ratio
wins, and k = 0 (plain decoding) wins whenever drafting does not pay.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from localspec import paths

CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


@dataclass
class CostModel:
    """Seconds to verify a batch of n positions on the target, learned from measurements."""

    verify_s: dict[int, float]
    alpha: float = 0.1  # weight of a new observation

    def verify(self, n: int) -> float:
        """Interpolated over a table that is never cheaper for a larger batch and never dearer for a
        smaller one. A single slow measurement (a busy machine, a pause) then cannot make a batch size
        look dearer than the larger ones, where it would stay: sizes the planner avoids are never
        measured again to correct it."""
        return self._interpolate(n, self._table())

    def _table(self) -> dict[int, float]:
        table, lowest = {}, math.inf
        for m in sorted(self.verify_s, reverse=True):
            lowest = min(lowest, self.verify_s[m])
            table[m] = lowest
        return table

    @staticmethod
    def _interpolate(n: int, table: dict[int, float]) -> float:
        sizes = sorted(table)
        if n in table:
            return table[n]
        if n <= sizes[0]:
            return table[sizes[0]] * n / sizes[0]
        if n >= sizes[-1]:
            if len(sizes) == 1:
                return table[sizes[0]] * n / sizes[0]
            a, b = sizes[-2], sizes[-1]
            slope = (table[b] - table[a]) / (b - a)
            return table[b] + max(slope, 0.0) * (n - b)
        i = bisect.bisect_left(sizes, n)
        a, b = sizes[i - 1], sizes[i]
        t = (n - a) / (b - a)
        return table[a] * (1 - t) + table[b] * t

    def observe(self, n: int, seconds: float) -> None:
        old = self._interpolate(n, self.verify_s)
        seconds = min(seconds, 2.0 * old)  # a stall (another process, a page fault) is not what a batch costs
        self.verify_s[n] = old + self.alpha * (seconds - old) if n in self.verify_s else seconds * 0.5 + old * 0.5

    @property
    def plain_tokens_per_s(self) -> float:
        return 1.0 / self.verify(1)


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


def expected_tokens(rates: list[float]) -> float:
    total, run = 1.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


def margin_for(samples: float) -> float:
    """How much over plain decoding a draft must promise: more while its acceptance rests on a prior
    and a few samples (a wrong draft costs a whole verification), 2% once well measured."""
    return 0.02 + 0.25 / (1.0 + samples)


def best_length(rates: list[float], cost: CostModel, draft_per_token_s: float,
                margin: float = 0.02) -> tuple[int, float]:
    """(k, expected tokens per second) maximizing throughput over k = 0..len(rates); k = 0 (plain
    decoding) unless the best draft promises `margin` over it."""
    plain = 1.0 / cost.verify(1)
    best_k, best_rate = 0, plain
    for k in range(1, len(rates) + 1):
        seconds = k * draft_per_token_s + cost.verify(k + 1)
        rate = expected_tokens(rates[:k]) / seconds
        if rate > best_rate:
            best_k, best_rate = k, rate
    if best_rate < plain * (1 + margin):
        return 0, plain
    return best_k, best_rate


# ----------------------------------------------------------------------------- calibration


def machine_key(model_path: Path, threads: int, gpu_layers: int) -> str:
    st = os.stat(model_path)
    return "|".join(str(x) for x in (
        Path(model_path).resolve(), st.st_size, int(st.st_mtime), platform.node(), os.cpu_count(), threads, gpu_layers,
    ))


def load_cached(key: str) -> dict | None:
    try:
        data = json.loads(paths.calibration_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get(key)


def store_cached(key: str, value: dict) -> None:
    file = paths.calibration_file()
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    data[key] = value
    paths.ensure(file.parent)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, file)


def measure_verify_costs(model, sizes=CALIBRATION_SIZES, context_tokens: int = 48, repeats: int = 2,
                         clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Time decoding n positions (logits for all) after a short context; the cache is left empty."""
    n_vocab = model.n_vocab
    filler = [(17 + 31 * i) % max(n_vocab - 1, 1) + 1 for i in range(context_tokens + max(sizes))]
    model.truncate(0)
    model.decode(filler[:context_tokens], 0, [context_tokens - 1])
    model.decode(filler[context_tokens:context_tokens + 1], context_tokens, [0])  # warm-up
    model.truncate(context_tokens)
    costs: dict[int, float] = {}
    for n in sizes:
        if context_tokens + n > model.n_ctx:
            break
        best = math.inf
        for _ in range(repeats):
            batch = filler[context_tokens:context_tokens + n]
            t0 = clock()
            model.decode(batch, context_tokens, list(range(n)))
            best = min(best, clock() - t0)
            model.truncate(context_tokens)
        costs[n] = best
    model.truncate(0)
    lowest = math.inf
    for n in sorted(costs, reverse=True):  # a smaller batch never costs more; smooth out timing noise
        lowest = costs[n] = min(costs[n], lowest)
    return costs


def calibrated_costs(model, enabled: bool = True, sizes=CALIBRATION_SIZES) -> dict[int, float]:
    """Verify costs by batch size: from the cache when this model file was measured on this machine."""
    path = getattr(model, "path", None)
    key = None
    if path is not None and Path(path).exists():
        opts = model.options
        key = machine_key(Path(path), opts.threads(), opts.gpu_layers()) + f"|{model.n_ctx}|{','.join(map(str, sizes))}"
        cached = load_cached(key) if enabled else None
        if cached:
            return {int(k): float(v) for k, v in cached.items()}
    costs = measure_verify_costs(model, sizes=sizes, repeats=3 if enabled else 1)
    if key and enabled:
        store_cached(key, {str(k): v for k, v in costs.items()})
    return costs

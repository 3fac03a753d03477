"""Timing a model's decodes: verify batches by size (the sizes in turn, or each after decodes of its own
shape), one position in a stream. engine/calibration.py decides what a measurement is worth."""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

# Verify batch sizes measured at load, up to the most logits rows one decode returns
# (backend.MAX_LOGITS_PER_CALL). Past 16 a batch costs about as much per position as 16 do on a CPU,
# so only a copy that is nearly sure to be kept whole drafts that long: a regenerated answer drafted
# from history.

CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class Interrupted(Exception):
    """A measurement given up because a request arrived."""


def filler(n_vocab: int, n: int) -> list[int]:
    """n ordinary token ids spread over the vocabulary: a context whose content does not matter to a cost."""
    return [(17 + 31 * i) % max(n_vocab - 1, 1) + 1 for i in range(n)]


def measure(model, sizes=CALIBRATION_SIZES, context_tokens: int = 48, repeats: int = 3,
            clock: Callable[[], float] = time.perf_counter, prefill: bool = False,
            interrupt: Callable[[], bool] = lambda: False, steady: int = 0) -> dict[int, list[float]]:
    """Seconds of each pass at each size: decoding n positions (logits for all; `prefill`: for the last
    only, as a prompt or a draft model's catch-up asks) after a short context; the cache is left empty.
    `steady`: each timed batch comes after that many untimed ones of its size (a GPU's captured graph).

    Each repeat is a pass over every size, so a slow spell (RPC workers warming up after the load,
    another process) slows every size of one pass rather than one size's repeats. `interrupt` is
    asked between sizes; when it says so, Interrupted is raised (the cache is emptied first)."""
    # A recurrent state drops at most the positions of its last decode but the first (kv.py): after each
    # batch it keeps that one, as a verify keeps the token it started from, and the context grows by one.
    recurrent = model.max_rollback is not None  # (None: a KV cache drops any positions)
    growth = (repeats * len(sizes) * (steady + 1) + 2) if recurrent else 0
    tokens = filler(model.n_vocab, context_tokens + growth + max(sizes))
    fits = [n for n in sizes if context_tokens + growth + n <= model.n_ctx]
    passes: dict[int, list[float]] = {n: [] for n in fits}
    base = context_tokens

    def go_back() -> None:
        nonlocal base
        keep = base + 1 if recurrent else base
        held = model.truncate(keep)
        if held < keep:  # gone back to a checkpoint (no snapshots): the rest again, with the last logits, whose
            # reading waits for a GPU's asynchronous decode (the next size's clock must not time it)
            model.decode(tokens[held:keep], held, [keep - held - 1])
        base = keep

    try:
        model.truncate(0)
        model.decode(tokens[:context_tokens], 0, [context_tokens - 1])
        model.decode(tokens[base:base + 1], base, [0])  # warm-up: one position
        go_back()
        if fits:  # and the largest batch (the first pass after a load was the slow one at the large sizes)
            n = max(fits)
            model.decode(tokens[base:base + n], base, [n - 1] if prefill else list(range(n)))
            go_back()
        for _ in range(repeats):
            for n in fits:
                if interrupt():
                    raise Interrupted
                for _warm in range(steady):
                    model.decode(tokens[base:base + n], base, [n - 1] if prefill else list(range(n)))
                    go_back()
                batch = tokens[base:base + n]
                t0 = clock()
                model.decode(batch, base, [n - 1] if prefill else list(range(n)))
                passes[n].append(clock() - t0)
                go_back()
    finally:
        model.truncate(0)
    return passes


def stream_cost(model, context_tokens: int = 48, tokens: int = 24,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of one position decoded right after another, as plain decoding does: no rollback
    between them and one batch shape, where every pass of `measure` goes back and changes the shape first
    (on a GPU the two are apart: docs/gpu.md, "Hybrid targets and MTP heads"). The cache is left empty."""
    context = filler(model.n_vocab, context_tokens + tokens)
    times = []
    try:
        model.truncate(0)
        model.decode(context[:context_tokens], 0, [context_tokens - 1])
        for i in range(context_tokens, context_tokens + tokens):
            t0 = clock()
            model.decode([context[i]], i, [0])
            times.append(clock() - t0)
    finally:
        model.truncate(0)
    return statistics.median(times[2:] or times)


def costs_of(passes: dict[int, list[float]]) -> dict[int, float]:
    """Each size at the least it took in any pass; a smaller batch never costs more than a larger one."""
    costs = {n: min(times) for n, times in passes.items() if times}
    lowest = math.inf
    for n in sorted(costs, reverse=True):
        lowest = costs[n] = min(costs[n], lowest)
    return costs


def measure_costs(model, sizes=CALIBRATION_SIZES, context_tokens: int = 48, repeats: int = 3,
                  clock: Callable[[], float] = time.perf_counter, prefill: bool = False) -> dict[int, float]:
    """`measure`, reduced to one cost per size (`costs_of`): for scripts that need no verdict."""
    return costs_of(measure(model, sizes, context_tokens, repeats, clock, prefill))


def spread_of(passes: dict[int, list[float]]) -> float:
    """How far the passes disagree (MAX_SPREAD): each size's median pass over its fastest, median over sizes."""
    ratios = [statistics.median(t) / min(t) for t in passes.values() if len(t) > 1 and min(t) > 0]
    return statistics.median(ratios) if ratios else 1.0

"""Print what one decode of several sequences costs, by shape, against two predictions from the
calibration of one sequence: one sequence of as many positions, and `adaptive.step_cost`.

A step shared by several requests holds each one's pending token and maybe its draft. Each sequence
has its own KV cells, and llama.cpp then splits a batch into micro-batches that take as many tokens
from every sequence in them: parts of different lengths cost a pass per length (1 + 1 + 16 is a
pass of 3 x 1 and another of 15), which `step_cost` prices and drafts in shared steps are priced by
(`adaptive.shared_lengths`). Logits for every position (as a verify asks); medians of passes in alternating
order.

    .venv/bin/python scripts/batch_shape_costs.py [catalog pair or GGUF path] [--context 200] [--repeats 5] [--unified]

`--unified` loads the target with one KV buffer for all sequences (llama.cpp's `kv_unified`): uneven
parts then cost one pass of their total, but every decode attends over every sequence's cells, which
the last line shows (docs/history/2026-12-02-shared-steps.md, "One KV buffer for all sequences").
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.engine import backend
from localspec.engine.adaptive import CostModel, step_cost
from localspec.engine.calibration import CALIBRATION_SIZES

SHAPES = [(1,), (1, 1), (1, 1, 1), (1, 1, 1, 1), (2, 2), (4, 4), (4, 4, 4, 4), (8, 8), (16, 1), (8, 1),
          (8, 1, 1, 1), (14, 1, 1), (16, 16)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("entry", nargs="?", default=None, help="catalog pair or GGUF path (default: the default pair)")
    ap.add_argument("--context", type=int, default=200, help="tokens already in each sequence's cache")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--unified", action="store_true",
                    help="one KV buffer for all sequences (llama.cpp's kv_unified) instead of one per sequence")
    args = ap.parse_args()
    from localspec.catalog import load_catalog
    from localspec.loader import resolve
    target = resolve(args.entry or load_catalog().default_pair)[0]
    print(backend.system_info())
    seqs = max(len(shape) for shape in SHAPES)
    per_seq = max(1024, args.context + 128)
    model = backend.Model(target, backend.ModelOptions(n_ctx=seqs * per_seq, n_seq=seqs, kv_unified=args.unified))
    n_vocab, ctx = model.n_vocab, args.context
    filler = [(17 + 31 * i) % (n_vocab - 1) + 1 for i in range(ctx + 64)]
    for seq in range(seqs):
        model.decode(filler[:ctx], 0, [ctx - 1], seq=seq)

    def shared(shape: tuple[int, ...]) -> float:
        parts = [(seq, filler[ctx:ctx + n], ctx, n) for seq, n in enumerate(shape)]
        t0 = time.perf_counter()
        model.decode_many(parts)
        seconds = time.perf_counter() - t0
        for seq in range(len(shape)):
            model.truncate(ctx, seq)
        return seconds

    def single(n: int) -> float:
        t0 = time.perf_counter()
        model.decode(filler[ctx:ctx + n], ctx, list(range(n)), seq=0)
        seconds = time.perf_counter() - t0
        model.truncate(ctx, 0)
        return seconds

    single(1)  # warm-up
    sizes = sorted(set(CALIBRATION_SIZES[:8]) | {sum(shape) for shape in SHAPES})
    one_seq: dict[int, list[float]] = {n: [] for n in sizes}
    times: dict[tuple[int, ...], list[float]] = {shape: [] for shape in SHAPES}
    for r in range(args.repeats):
        for shape in (SHAPES if r % 2 == 0 else SHAPES[::-1]):
            times[shape].append(shared(shape))
        for n in (sizes if r % 2 == 0 else sizes[::-1]):
            one_seq[n].append(single(n))
    table = {n: statistics.median(v) for n, v in one_seq.items()}
    cost = CostModel({n: s for n, s in table.items() if n in CALIBRATION_SIZES})
    one = table[1]
    print(f"{target.name}: one position {one * 1000:.1f} ms, {ctx} tokens of context per sequence")
    print("positions per sequence   measured ms   x one   one sequence of the total   step_cost")
    for shape in SHAPES:
        measured = statistics.median(times[shape])
        total = table[sum(shape)]
        print(f"{' + '.join(map(str, shape)):22s} {measured * 1000:11.1f} {measured / one:7.2f}"
              f" {total * 1000:14.1f} ({measured / total:4.2f}x) {step_cost(cost, list(shape)) * 1000:8.1f}"
              f" ({measured / step_cost(cost, list(shape)):4.2f}x)")
    # What one request alone pays for the others' caches: with one KV buffer for all sequences its
    # attention spans every sequence's cells (masked), with a buffer each only its own.
    alone_beside = statistics.median(times[(1,)])
    for seq in range(1, seqs):
        model.truncate(0, seq)
    alone = statistics.median([shared((1,)) for _ in range(max(args.repeats, 9))])
    print(f"one position of one sequence: {alone_beside * 1000:.1f} ms while {seqs - 1} others hold {ctx} tokens"
          f" each, {alone * 1000:.1f} ms with them empty ({alone_beside / alone:.2f}x)")
    model.close()


if __name__ == "__main__":
    main()

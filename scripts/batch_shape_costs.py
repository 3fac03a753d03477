"""Print what one decode of s sequences x p positions costs against one sequence of s*p positions.

Drafts in a step shared by several requests are priced from the calibration of one sequence
(`adaptive.beside`: n positions added to a step of r cost verify(r + n) - verify(r)), which holds if
a batch costs what its positions cost, however they are split among sequences. This measures it:
every shape after the same context in each sequence, logits for every position (as a verify asks),
medians of passes that alternate the two layouts.

    .venv/bin/python scripts/batch_shape_costs.py [catalog pair or GGUF path] [--context 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.engine import backend

SHAPES = [(s, p) for s in (1, 2, 3, 4) for p in (1, 2, 4, 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("entry", nargs="?", default=None, help="catalog pair or GGUF path (default: the default pair)")
    ap.add_argument("--context", type=int, default=200, help="tokens already in each sequence's cache")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from localspec.catalog import load_catalog
    from localspec.loader import resolve
    target = resolve(args.entry or load_catalog().default_pair)[0]
    print(backend.system_info())
    seqs = max(s for s, _p in SHAPES)
    model = backend.Model(target, backend.ModelOptions(n_ctx=seqs * 1024, n_seq=seqs))
    n_vocab, ctx = model.n_vocab, args.context
    filler = [(17 + 31 * i) % (n_vocab - 1) + 1 for i in range(ctx + 64)]
    for seq in range(seqs):
        model.decode(filler[:ctx], 0, [ctx - 1], seq=seq)

    def shared(s: int, p: int) -> float:
        parts = [(seq, filler[ctx:ctx + p], ctx, p) for seq in range(s)]
        t0 = time.perf_counter()
        model.decode_many(parts)
        seconds = time.perf_counter() - t0
        for seq in range(s):
            model.truncate(ctx, seq)
        return seconds

    def single(n: int) -> float:
        t0 = time.perf_counter()
        model.decode(filler[ctx:ctx + n], ctx, list(range(n)), seq=0)
        seconds = time.perf_counter() - t0
        model.truncate(ctx, 0)
        return seconds

    single(1)  # warm-up
    times: dict[tuple[int, int], tuple[list[float], list[float]]] = {shape: ([], []) for shape in SHAPES}
    for r in range(args.repeats):
        for s, p in SHAPES:
            a, b = times[(s, p)]
            if r % 2 == 0:
                a.append(shared(s, p))
                b.append(single(s * p))
            else:
                b.append(single(s * p))
                a.append(shared(s, p))
    one = statistics.median(times[(1, 1)][1])
    print(f"{target.name}: one position {one * 1000:.1f} ms, {ctx} tokens of context per sequence")
    print("seqs x pos  total  shared ms  one-seq ms  shared/one-seq  shared x one position")
    for s, p in SHAPES:
        a, b = (statistics.median(x) for x in times[(s, p)])
        print(f"{s:4d} x {p:3d}  {s * p:5d}  {a * 1000:9.1f}  {b * 1000:10.1f}  {a / b:14.2f}  {a / one:21.2f}")
    model.close()


if __name__ == "__main__":
    main()

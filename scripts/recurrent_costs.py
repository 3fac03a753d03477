"""What a recurrent or hybrid target's drafting costs on this machine: verifying n positions against
one, with llama.cpp keeping state snapshots for rollback (n_rs_seq, ModelOptions.rollback) and without,
and what a prompt checkpoint costs to take and to restore (docs/engine.md, "Hybrid and recurrent
targets").

    .venv/bin/python scripts/random_gguf.py qwen35 /tmp/q35-4b-f16.gguf --shape qwen3.5-4b --tokenizer QWEN.gguf
    .venv/bin/python -c "from localspec.engine.backend import quantize; quantize('/tmp/q35-4b-f16.gguf', '/tmp/q35-4b.gguf', 'Q4_K_M')"
    .venv/bin/python scripts/recurrent_costs.py /tmp/q35-4b.gguf [--rounds 2]

The two loads alternate which is measured first (order alone moves figures on small machines).
"""

from __future__ import annotations

import argparse
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.engine import backend
from localspec.engine.calibration import filler, measure_costs, stream_cost

SIZES = (1, 2, 3, 4, 6, 8, 9, 12, 16)


def verify_costs(path: str, rollback: int, context: int) -> dict[int, float]:
    """Each size's verify (after going back, as a round does), and under 0 one position in a stream."""
    model = backend.Model(path, backend.ModelOptions(n_ctx=2048, rollback=rollback))
    try:
        costs = measure_costs(model, sizes=SIZES, context_tokens=context, repeats=3)
        return {0: stream_cost(model, context), **costs}
    finally:
        model.close()


def checkpoint_costs(path: str, context: int, repeats: int = 5) -> tuple[float, float, int]:
    """Seconds to take a checkpoint, seconds to go back to it (restore), and its size in bytes."""
    model = backend.Model(path, backend.ModelOptions(n_ctx=2048))
    try:
        tokens = filler(model.n_vocab, context + 16)
        model.decode(tokens[:context], 0, [])
        take, restore = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.checkpoint()
            take.append(time.perf_counter() - t0)
            for i in range(12):  # one token a decode: the snapshots reach back no further than one
                model.decode([tokens[context + i]], context + i, [])
            t0 = time.perf_counter()
            held = model.truncate(context + 2)
            restore.append(time.perf_counter() - t0)
            assert held == context, held
        return min(take), min(restore), model.checkpoint_bytes()
    finally:
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    args = ap.parse_args()
    print(backend.system_info())
    runs: dict[int, list[dict[int, float]]] = {8: [], 0: []}
    for r in range(args.rounds):
        for rollback in ((8, 0) if r % 2 == 0 else (0, 8)):
            runs[rollback].append(verify_costs(args.gguf, rollback, args.context))
    best = {rb: {n: min(c[n] for c in costs) for n in (0, *SIZES)} for rb, costs in runs.items()}
    one = best[0][1]
    print(f"one position without snapshots: {one * 1000:.1f} ms (context {args.context})")
    print("  n  snapshots(8) ms  x one   none ms  x one   snapshots/none")
    for n in SIZES:
        a, b = best[8][n], best[0][n]
        print(f"{n:3d} {a * 1000:14.1f} {a / one:6.2f} {b * 1000:9.1f} {b / one:6.2f} {a / b:12.3f}")
    print(f"one position in a stream (no rollback before it): {best[8][0] * 1000:.1f} ms with snapshots, "
          f"{best[0][0] * 1000:.1f} ms without")
    take, restore, size = checkpoint_costs(args.gguf, args.context)
    print(f"checkpoint: {size / 2**20:.1f} MiB, taken in {take * 1000:.1f} ms, restored in {restore * 1000:.1f} ms "
          f"({take / one:.2f} and {restore / one:.2f} of one position)")


if __name__ == "__main__":
    main()

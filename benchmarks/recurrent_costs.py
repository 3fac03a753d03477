"""What a recurrent or hybrid target's drafting costs on this machine: verifying n positions against
one, with llama.cpp keeping state snapshots for rollback (n_rs_seq, ModelOptions.rollback) and without,
and what a prompt checkpoint costs to take and to restore (docs/engine.md, "Hybrid and recurrent
targets").

    .venv/bin/python tests/fixtures/random_gguf.py qwen35 /tmp/q35-4b-f16.gguf --shape qwen3.5-4b --tokenizer QWEN.gguf
    .venv/bin/python -c "from localspec.engine.backend import quantize; quantize('/tmp/q35-4b-f16.gguf', '/tmp/q35-4b.gguf', 'Q4_K_M')"
    .venv/bin/python benchmarks/recurrent_costs.py /tmp/q35-4b.gguf [--rounds 2]

The two loads alternate which is measured first (order alone moves figures on small machines).
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.engine import backend
from localspec.engine.measuring import filler, measure_costs, stream_cost

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
        # every decode here asks for logits: reading them waits for a GPU's asynchronous decode, which the
        # clock would otherwise charge to the checkpoint (calibration.measure does the same)
        model.decode(tokens[:context], 0, [context - 1])
        take, restore = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.checkpoint()
            take.append(time.perf_counter() - t0)
            for i in range(12):  # one token a decode: the snapshots reach back no further than one
                model.decode([tokens[context + i]], context + i, [0])
            t0 = time.perf_counter()
            held = model.truncate(context + 2)
            restore.append(time.perf_counter() - t0)
            assert held == context, held
        return min(take), min(restore), model.checkpoint_bytes()
    finally:
        model.close()


def after_rollback(path: str, context: int, mtp: bool, repeats: int = 12) -> dict[str, float]:
    """Median ms of one position decoded: in a stream; right after going back one position (a batch of the
    same shape each time); and the first, second and third after a 4-position batch went back (the shape a
    speculative round leaves). On CUDA these tell whether the graphs ggml captures are re-captured."""
    model = backend.Model(path, backend.ModelOptions(n_ctx=2048, rollback=8, mtp=mtp))
    tokens = filler(model.n_vocab, context + 16 * repeats)
    times: dict[str, list[float]] = {k: [] for k in ("stream", "same shape", "1st after 4", "2nd after 4", "3rd after 4")}

    def one(pos: int, key: str) -> None:
        t0 = time.perf_counter()
        model.decode([tokens[pos]], pos, [0])
        times[key].append(time.perf_counter() - t0)

    try:
        model.decode(tokens[:context], 0, [context - 1])
        pos = context
        for _ in range(2 * repeats):
            one(pos, "stream")
            pos += 1
        for _ in range(repeats):
            one(pos, "same shape")
            model.truncate(pos)
        for _ in range(repeats):
            model.decode(tokens[pos:pos + 4], pos, [0, 1, 2, 3])
            model.truncate(pos)
            for key in ("1st after 4", "2nd after 4", "3rd after 4"):
                one(pos, key)
                pos += 1
        return {k: statistics.median(v[2:] if k == "stream" else v) * 1000 for k, v in times.items()}
    finally:
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--after-rollback", action="store_true",
                    help="only time one position in a stream against one right after going back")
    args = ap.parse_args()
    print(backend.system_info())
    if args.after_rollback:
        for mtp in (False, True):
            got = after_rollback(args.gguf, args.context, mtp)
            print(f"one position, ms (MTP head {'following' if mtp else 'not loaded'}): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in got.items()))
        return
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

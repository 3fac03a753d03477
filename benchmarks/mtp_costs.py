"""What drafting with a target's MTP head costs on this machine (docs/engine.md, "MTP heads"): the head's
step per draft token against one target token, and what following the target (every decode mirrored into
the head's cache) adds to the target's own decodes; then the speedup to expect from these costs at the
acceptance published for such a head, or rates you give (an estimate from costs, never a measured speed).

    .venv/bin/python tests/fixtures/random_gguf.py qwen35 /tmp/q35-4b-mtp-f16.gguf --shape qwen3.5-4b --mtp 1 --tokenizer QWEN.gguf
    .venv/bin/python -c "from localspec.engine.backend import quantize; quantize('/tmp/q35-4b-mtp-f16.gguf', '/tmp/q35-4b-mtp.gguf', 'Q4_K_M')"
    .venv/bin/python benchmarks/mtp_costs.py /tmp/q35-4b-mtp.gguf [--kept 0.867 0.743 0.615]

The loads with and without the head alternate which is measured first (order alone moves figures).
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.bench.estimate import QWEN35_MTP, Published, estimate
from localspec.engine import backend
from localspec.engine.adaptive import CostModel
from localspec.engine.measuring import filler, measure_costs, stream_cost

SIZES = (1, 2, 3, 4)


def verify_costs(path: str, mtp: bool, context: int, sizes: tuple[int, ...] = SIZES) -> dict[int, float]:
    """Each size's verify (after going back, as a round does), and under 0 one position in a stream."""
    model = backend.Model(path, backend.ModelOptions(n_ctx=2048, mtp=mtp))
    try:
        costs = measure_costs(model, sizes=sizes, context_tokens=context, repeats=3)
        return {0: stream_cost(model, context), **costs}
    finally:
        model.close()


def head_step(path: str, context: int, steps: int = 12) -> float:
    """Median seconds of one head step after `context` tokens (the draft's chain, as the drafter runs it)."""
    model = backend.Model(path, backend.ModelOptions(n_ctx=2048, mtp=True))
    try:
        head = model.mtp
        if head is None:
            raise SystemExit(f"{path} has no MTP head this build can run")
        model.decode(filler(model.n_vocab, context), 0, [])
        times = []
        hidden = head.hidden_at(0, context - 1)
        for i in range(steps + 1):
            t0 = time.perf_counter()
            _logits, hidden = head.predict(0, 42, context + i, hidden)
            times.append(time.perf_counter() - t0)
        head.forget(0, context)
        return statistics.median(times[1:])
    finally:
        model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kept", type=float, nargs="+", default=list(QWEN35_MTP.kept),
                        help="share of drafts whose first 1, 2, ... tokens were all kept (vLLM's per-position "
                             "acceptance); default: the rates published for Qwen3.5 (bench/estimate.py)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES),
                        help="verify batch sizes to time (a GPU: up to 32 or 64)")
    args = parser.parse_args()
    sizes = tuple(sorted(set(args.sizes) | {1}))
    runs: dict[bool, list[dict[int, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for mtp in ((False, True) if r % 2 == 0 else (True, False)):
            runs[mtp].append(verify_costs(args.model, mtp, args.context, sizes))
    costs = {mtp: {n: min(run[n] for run in runs[mtp]) for n in (0, *sizes)} for mtp in runs}
    step = head_step(args.model, args.context)
    plain = costs[False][0]  # plain decoding: one position after another, nothing to go back over
    print(f"{args.model}, {args.context} tokens of context (fastest of {args.rounds} runs)")
    print("positions   without head   with head (following)   ratio")
    for n in sizes:
        print(f"{n:9d}   {costs[False][n] * 1e3:9.1f} ms   {costs[True][n] * 1e3:12.1f} ms   {costs[True][n] / costs[False][n]:10.3f}")
    print(f"one position in a stream: {costs[False][0] * 1e3:.1f} ms without head, {costs[True][0] * 1e3:.1f} ms with it "
          "(the verifies above each follow a rollback)")
    print(f"head step per draft token: {step * 1e3:.2f} ms = {step / plain:.3f} of a target token")
    published = QWEN35_MTP if args.kept == list(QWEN35_MTP.kept) else Published("the rates given", "--kept", tuple(args.kept))
    verifies = CostModel({n: c for n, c in costs[True].items() if n})
    print(estimate(verifies, step, published, plain_s=plain).describe()
          + " Plain decoding here: the load without the head, one position in a stream.")


if __name__ == "__main__":
    main()

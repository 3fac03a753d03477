"""A model's verify costs by batch size, steady (the same size decoded again and again, as a GPU's
captured graph replays) and right after a change of size (the calibration's sizes in turn): the two tables
the engine's CostModel prices drafts with where a change costs (docs/gpu.md, "Steady shapes").

    python benchmarks/gpu/shape_costs.py FILE.gguf [--mtp]
"""

from __future__ import annotations

import argparse

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.engine import backend
from localspec.engine.costs import WARM_VERIFIES
from localspec.engine.measuring import costs_of, measure, stream_cost

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--mtp", action="store_true", help="load the MTP head (it follows every target decode)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    model = backend.Model(args.model, backend.ModelOptions(n_ctx=2048, mtp=args.mtp))
    try:
        changed, steady = {}, {}
        for r in range(args.rounds):  # the two patterns in turn, the order alternated
            for pattern in (("changed", "steady") if r % 2 == 0 else ("steady", "changed")):
                table = costs_of(measure(model, SIZES, repeats=2, steady=WARM_VERIFIES if pattern == "steady" else 0))
                into = steady if pattern == "steady" else changed
                for n, s in table.items():
                    into[n] = min(into.get(n, s), s)
        stream = stream_cost(model)
    finally:
        model.close()
    print(f"{args.model}{' (MTP head following)' if args.mtp else ''}: one position in a stream {stream * 1e3:.2f} ms")
    print("positions   steady      after a change   change costs")
    for n in SIZES:
        if n in steady and n in changed:
            print(f"{n:9d}   {steady[n] * 1e3:7.2f} ms   {changed[n] * 1e3:10.2f} ms   {(changed[n] - steady[n]) * 1e3:+9.2f} ms")


if __name__ == "__main__":
    main()

"""Print what verifying a batch of n positions costs on this machine, against one position.

The planner drafts by these ratios (localspec/engine/adaptive.py, CALIBRATION_SIZES): "ceiling" is
the speedup a draft of n-1 tokens kept whole would give. Compare llama.cpp builds by running it
under each (scripts/setup.sh picks AVX-512 kernels where the CPU has them).

    .venv/bin/python scripts/verify_costs.py [catalog pair or GGUF path] [--rounds 2]
"""

from __future__ import annotations

import argparse

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.engine import backend
from localspec.engine.calibration import CALIBRATION_SIZES, measure_costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("entry", nargs="?", default=None, help="catalog pair or GGUF path (default: the default pair)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    args = ap.parse_args()
    from localspec.catalog import load_catalog
    from localspec.loader import resolve
    target = resolve(args.entry or load_catalog().default_pair)[0]
    print(backend.system_info())
    model = backend.Model(target, backend.ModelOptions(n_ctx=2048))
    for _ in range(args.rounds):
        costs = measure_costs(model, sizes=CALIBRATION_SIZES, context_tokens=args.context, repeats=3)
        one = costs[1]
        print(f"{target.name}: one position {one * 1000:.1f} ms")
        print("  n     ms  x one  ceiling")
        for n, s in costs.items():
            print(f"{n:3d} {s * 1000:6.1f} {s / one:6.1f} {n * one / s:8.2f}")


if __name__ == "__main__":
    main()

"""Print what verifying a batch of n positions costs on this machine, against one position.

The planner drafts by these ratios (localspec/engine/adaptive.py, CALIBRATION_SIZES): "ceiling" is
the speedup a draft of n-1 tokens kept whole would give. Compare llama.cpp builds by running it
under each (setup.sh picks AVX-512 kernels where the CPU has them).

    .venv/bin/python benchmarks/verify_costs.py [catalog pair or GGUF path] [--rounds 2]
    .venv/bin/python benchmarks/verify_costs.py --live edit,code     # the table against live rounds

`--live SUITES`: answer the bench's prompts of these suites with the pair (`auto`, then plain, 128
tokens, greedy, history off) and print, for each verify size the rounds used, its median cost over the
median one-token round's, beside the calibration's ratio: how far the planner's prices are from what
live rounds cost (a ratio over 1: the table makes that size look cheaper than it is). With `--json
FILE` it also writes a table to replay at (`replay_planner.py replay --costs FILE`): each size the
live rounds used at least MIN_ROUNDS times at their median, every other size at the calibration's
price times the live-over-table ratio of the nearest size measured live.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.engine import backend
from localspec.engine.measuring import CALIBRATION_SIZES, measure_costs

MIN_ROUNDS = 3  # live rounds of a size before their median stands for it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("entry", nargs="?", default=None, help="catalog pair or GGUF path (default: the default pair)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--live", default=None, metavar="SUITES", help="compare the table with live rounds on these suites")
    ap.add_argument("--json", type=Path, default=None, help="with --live: write the live table here, to replay at")
    args = ap.parse_args()
    from localspec.catalog import load_catalog
    from localspec.loader import resolve
    if args.live:
        live_against_table(args.entry or load_catalog().default_pair, args.live.split(","), args.json)
        return
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


def live_table(live: dict[int, list[float]], priced: dict[int, float]) -> dict[int, float]:
    """Seconds per verify size as live rounds took them: the median of a size's rounds where there are
    MIN_ROUNDS of them (one position always: every table is read against it), else its `priced` seconds
    scaled by how far live rounds of the nearest size measured live were from their price."""
    measured = {n: statistics.median(s) for n, s in live.items() if len(s) >= MIN_ROUNDS or n == 1}
    table = {}
    for n in sorted(set(priced) | set(measured)):
        if n in measured:
            table[n] = measured[n]
        else:
            near = min(measured, key=lambda m: (abs(m - n), -m))
            table[n] = priced[n] * measured[near] / priced[near]
    return table


def live_against_table(entry: str, suites: list[str], out: Path | None = None) -> None:
    from localspec.bench import load_suites
    from localspec.engine.events import Round
    from localspec.loader import load

    engine = load(entry, history="off")
    table = engine.cost
    live: dict[int, list[float]] = defaultdict(list)
    for prompt in load_suites(suites):
        tokens = engine.chat_tokens([{"role": "user", "content": prompt.text}])
        for drafter in ("auto", "none"):
            for event in engine.generate(tokens, max_tokens=128, drafter=drafter):
                if isinstance(event, Round) and not event.candidates and not event.shared:
                    live[event.drafted + 1].append(event.verify_s)
    one = statistics.median(live[1])
    print(f"one position: live rounds {one * 1000:.1f} ms, the table {table.verify(1) / table.scale * 1000:.1f} ms")
    print("  n  rounds  live/one  table/one  live over table")
    for n in sorted(live):
        if n > 1 and len(live[n]) >= MIN_ROUNDS:
            ratio, priced = statistics.median(live[n]) / one, table.verify(n) / table.verify(1)
            print(f"{n:3d} {len(live[n]):7d} {ratio:9.2f} {priced:10.2f} {ratio / priced:16.3f}")
    if out is not None:
        sizes = sorted(set(table.verify_s) | set(live))
        verify_s = live_table(live, {n: table.verify(n) for n in sizes})
        meta = {"entry": entry, "suites": ",".join(suites), "rounds": {str(n): len(live[n]) for n in sorted(live)},
                "how": "benchmarks/verify_costs.py --live: live rounds' medians, other sizes priced and scaled"}
        out.write_text(json.dumps({"meta": meta, "verify_s": {str(n): s for n, s in verify_s.items()}}, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""Drafting on a loaded machine: localspec's `auto` and its plain decoding on the same prompts, each on a
quiet machine and beside busy loops (another program taking cores, as a compile beside the chat does).

A machine slowed for every batch alike slows plain decoding as much as a draft's verify, so what pays
on a quiet machine should pay there too, and the loss bound should let it (engine/loss_bound.py values
a drafting round's time at what plain tokens take now). Per prompt and repeat the four answers (`auto`
and `none`, quiet and loaded) run in an order that alternates between the quiet pair and the loaded
pair, and within each pair between `auto` and `none`; a loaded answer runs beside --busy processes
that each spin on a core, started before its prompt and stopped after it. History drafts are off (no
answer drafts from another's). Prints each answer as it ends, then per condition the draft tokens
proposed and kept and `auto`'s decoding rate over plain's: the median over prompts of each prompt's
geometric mean over its repeats, with a 90% bootstrap interval; and the speedup `auto`'s answers showed
(engine/speedup.py), the same way. Under load single answers move by a third or more: read the drafts
first, the rates with their intervals.

    .venv/bin/python benchmarks/loaded_drafts.py --suite benchmarks/prompts/heldout_edit.yaml --repeat 2 \
        --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_flags, median, median_interval, prompt_ratios

CONDITIONS = ("quiet", "loaded")


def spinners(count: int) -> list[subprocess.Popen]:
    """`count` processes spinning on a core each, until stopped."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    time.sleep(0.2)  # (running before the prompt is)
    return procs


def answer(engine, text: str, drafter: str, max_tokens: int, busy: int) -> dict:
    """One answer's summary, beside `busy` spinning processes."""
    from localspec.engine.events import Summary

    procs = spinners(busy)
    try:
        summary = next(e for e in engine.chat([{"role": "user", "content": text}], max_tokens=max_tokens,
                                              drafter=drafter) if isinstance(e, Summary))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return {"tokens": summary.generated_tokens, "rate": summary.tokens_per_s, "drafted": summary.drafted,
            "kept": summary.accepted, "shown": summary.speedup}


def order(n: int, r: int) -> list[tuple[str, str]]:
    """(condition, drafter) in the order prompt `n` of repeat `r` runs them."""
    conditions = CONDITIONS if (n + r) % 2 == 0 else CONDITIONS[::-1]
    drafters = ("auto", "none") if (n // 2 + r) % 2 == 0 else ("none", "auto")
    return [(c, d) for c in conditions for d in drafters]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a catalog entry (default: the default pair)")
    parser.add_argument("--suite", default="edit", help="suites or YAML prompt files, comma-separated")
    parser.add_argument("--prompts", type=int, default=None, help="only the first N prompts of each suite")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--busy", type=int, default=1, help="spinning processes beside a loaded answer")
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from localspec.bench.runner import _history_recording
    from localspec.bench.suites import load_suites
    from localspec.catalog import load_catalog
    from localspec.errors import LocalspecError
    from localspec.loader import load_here

    entry = args.model or load_catalog().default_pair
    try:
        prompts = [p for p in load_suites(args.suite.split(",")) if args.prompts is None or p.index < args.prompts]
        engine = load_here(entry, drafter="auto", n_ctx=args.ctx, history="memory")
    except LocalspecError as exc:
        raise SystemExit(str(exc)) from None
    rows: list[dict] = []
    with engine:
        _history_recording(engine, False)
        for r in range(args.repeat):
            for n, prompt in enumerate(prompts):
                for condition, drafter in order(n, r):
                    busy = args.busy if condition == "loaded" else 0
                    rows.append({"suite": prompt.suite, "prompt": prompt.id, "repeat": r, "condition": condition,
                                 "drafter": drafter, **answer(engine, prompt.text, drafter, args.max_tokens, busy)})
                    print(json.dumps(rows[-1]), flush=True)
    print(f"\n{entry}, {args.max_tokens} tokens, greedy, {args.repeat} repeats, {args.busy} busy loop(s) when "
          f"loaded; CPU flags: {cpu_flags()}")
    for condition in CONDITIONS:
        report(rows, condition)
    if args.json:
        args.json.write_text(json.dumps({"meta": {**{k: str(v) for k, v in vars(args).items()}, "entry": entry,
                                                  "cpu_flags": cpu_flags()}, "rows": rows}, indent=1))


def report(rows: list[dict], condition: str) -> None:
    """A condition's drafts, and `auto`'s rate over plain's per prompt (the same prompt and repeat)."""
    ours = [row for row in rows if row["condition"] == condition]
    auto = [row for row in ours if row["drafter"] == "auto"]
    plain = {(row["prompt"], row["repeat"]): row["rate"] for row in ours if row["drafter"] == "none"}
    pairs = [{**row, "ratio": row["rate"] / plain[(row["prompt"], row["repeat"])]} for row in auto
             if plain.get((row["prompt"], row["repeat"]))]
    if not pairs:
        return
    ratios = sorted(prompt_ratios(pairs).values())
    low, high = median_interval(ratios)
    drafted, kept = sum(row["drafted"] for row in auto), sum(row["kept"] for row in auto)
    print(f"{condition:7} auto drafted {drafted} tokens, kept {kept}, in {len(auto)} answers; auto / plain "
          f"{median(ratios):.3f}x ({low:.3f}-{high:.3f}), worst {ratios[0]:.3f}x, "
          f"{sum(x < 0.95 for x in ratios)} of {len(ratios)} below 0.95x; the speedup shown "
          f"{median(prompt_ratios(auto, 'shown').values()):.3f}x")


if __name__ == "__main__":
    sys.exit(main())

"""Candidate trees live against chains and plain decoding, on one engine in one process.

    .venv/bin/python scripts/tree_rounds.py                     # the default pair, held-out code and edits
    .venv/bin/python scripts/tree_rounds.py --leaves 2,4 --draft-len 3 --tokens 128 --json trees.json

Every prompt runs each variant once per repeat, back to back, the order rotated per prompt and repeat
(on a 2-core machine the order alone moves a figure by up to ~10%): `plain` (no drafts), `chain` (the
draft model's chain of --draft-len tokens, as llama-server's draft defaults) and `tree-N` (the same
chain and N of the draft's second candidates, verified in the same batch: engine/tree.py). Greedy, the
history drafter off, so no variant replays another's answer. Prints tokens/s per variant, the medians
of per-prompt ratios, tokens kept per round and how often a second candidate was the target's token.

The prompts: scripts/heldout_code.yaml and heldout_edit.yaml, written before trees were built and
never tuned on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

HERE = Path(__file__).resolve().parent


def answer(engine, prompt: list[int], variant: str, draft_len: int, tokens: int) -> dict:
    from localspec.engine.events import Round, Summary

    leaves = int(variant.split("-")[1]) if variant.startswith("tree-") else 0
    engine.drafter("model").tree_leaves = leaves
    drafter = "none" if variant == "plain" else "model"
    rounds, summary = [], None
    for event in engine.generate(prompt, max_tokens=tokens, drafter=drafter,
                                 draft_len=None if drafter == "none" else draft_len):
        if isinstance(event, Round):
            rounds.append(event)
        elif isinstance(event, Summary):
            summary = event
    assert summary is not None
    return {"tokens_per_s": summary.tokens_per_s, "tokens": summary.generated_tokens, "rounds": summary.rounds,
            "drafted": summary.drafted, "accepted": summary.accepted, "tree_rounds": summary.tree_rounds,
            "seconds_kept": summary.seconds_kept, "text": summary.text}


def main() -> None:
    from localspec.bench.suites import load_suites
    from localspec.catalog import load_catalog
    from localspec.loader import load_here

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("entry", nargs="?", default=None, help="catalog pair or target GGUF (default: the default pair)")
    ap.add_argument("--suites", default=f"{HERE / 'heldout_code.yaml'},{HERE / 'heldout_edit.yaml'}")
    ap.add_argument("--leaves", default="4", help="tree variants: second candidates per draft, comma-separated")
    ap.add_argument("--draft-len", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=0, help="only the first N prompts of each suite (0: all)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    prompts = load_suites(args.suites.split(","))
    if args.prompts:
        prompts = [p for p in prompts if p.index < args.prompts]
    variants = ["plain", "chain", *(f"tree-{n}" for n in args.leaves.split(","))]
    engine = load_here(args.entry or load_catalog().default_pair, history="off")
    if not engine.target.spare_seqs:
        sys.exit("this target was loaded without spare sequences: no trees (a one-slot pair is needed)")
    print(f"target {engine.target.path.name}, draft {engine.draft.path.name}, {args.tokens} tokens, "
          f"draft length {args.draft_len}, {len(prompts)} prompts x {args.repeat}", file=sys.stderr)
    runs: list[dict] = []
    for r in range(args.repeat):
        for i, prompt in enumerate(prompts):
            tokens = engine.chat_tokens([{"role": "user", "content": prompt.text}])
            shift = (i + r) % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                run = answer(engine, tokens, variant, args.draft_len, args.tokens)
                runs.append({"prompt": prompt.id, "repeat": r, "variant": variant, **run})
            line = "  ".join(f"{x['variant']} {x['tokens_per_s']:5.1f}" for x in runs[-len(variants):])
            print(f"{prompt.id} #{r}: {line}", file=sys.stderr)
    engine.close()

    def of(variant: str, prompt: str) -> list[dict]:
        return [x for x in runs if x["variant"] == variant and x["prompt"] == prompt]

    ids = list(dict.fromkeys(x["prompt"] for x in runs))
    print(f"\n{'variant':10} {'tok/s':>7} {'/plain':>7} {'/chain':>7} {'kept/round':>10} {'trees':>6} {'second kept':>11}")
    for variant in variants:
        mine = [x for x in runs if x["variant"] == variant]

        def ratio(base: str) -> float:
            return statistics.median(statistics.median(y["tokens_per_s"] for y in of(variant, p))
                                     / statistics.median(y["tokens_per_s"] for y in of(base, p)) for p in ids)

        kept = sum(x["accepted"] for x in mine) / max(1, sum(x["rounds"] for x in mine if x["drafted"]))
        print(f"{variant:10} {statistics.median(x['tokens_per_s'] for x in mine):7.1f} {ratio('plain'):7.3f} "
              f"{ratio('chain'):7.3f} {kept:10.2f} {sum(x['tree_rounds'] for x in mine):6d} "
              f"{sum(x['seconds_kept'] for x in mine):11d}")
    same = sum(len({x["text"] for x in runs if x["prompt"] == p and x["repeat"] == r}) == 1
               for p in ids for r in range(args.repeat))
    print(f"answers identical across variants: {same} of {len(ids) * args.repeat}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()

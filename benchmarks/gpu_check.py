"""GPU check (not a test): does a CUDA build offload, stay exact, and make verification nearly free?

    .venv/bin/python benchmarks/gpu_check.py TARGET.gguf [--draft DRAFT.gguf] [--self-keep 0-26,29] [--json OUT]

Prints the llama.cpp devices, the target's verify cost by batch size (all layers offloaded), and
plain vs speculative greedy decoding (n-gram, draft model, self-draft) on edit, code and chat prompts
with tokens/s, speedup and whether the speculative tokens equal the plain ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from localspec.engine import backend
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.adaptive import CostModel
from localspec.engine.measuring import measure_costs
from localspec.engine.backend import Model, ModelOptions
from localspec.engine.events import answer_tokens

def prompts() -> dict[str, str]:
    """Two edit prompts, one code and one chat prompt from the bench's suites."""
    from localspec.bench import load_suites

    chosen = {}
    for p in load_suites(["edit", "code", "chat"]):
        if p.index < (2 if p.suite == "edit" else 1):
            chosen[p.id] = p.text
    return chosen


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("target")
    p.add_argument("--draft")
    p.add_argument("--self-keep")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--json")
    a = p.parse_args()

    report: dict = {"gpu_offload": backend.supports_gpu_offload(),
                    "devices": [f"{d.kind} {d.name} {d.description}" for d in backend.devices()]}
    print("GPU offload:", report["gpu_offload"])
    for d in report["devices"]:
        print("  device", d)
    target = Model(Path(a.target), ModelOptions(n_ctx=2048))
    sizes = (1, 2, 3, 4, 6, 8, 12, 16)
    costs = measure_costs(target, sizes)
    report["verify_ms"] = {n: round(s * 1000, 3) for n, s in costs.items()}
    print("verify ms by batch size:", ", ".join(f"{n}:{s * 1000:.2f}" for n, s in costs.items()),
          f"  (8 cost {costs[8] / costs[1]:.2f}x one)")

    drafts = {}
    if a.draft:
        drafts["model"] = Model(Path(a.draft), ModelOptions(n_ctx=2048))
    if a.self_keep:
        from localspec import selfdraft

        keep = selfdraft.parse_layers(a.self_keep, selfdraft.describe(Path(a.target))[1])
        path = selfdraft.make(Path(a.target), keep, Path(a.target).with_suffix(".self.gguf"))
        drafts["self"] = Model(path, ModelOptions(n_ctx=2048))
    engine = Engine(target, drafts.get("model"), EngineOptions(), cost=CostModel(dict(costs)),
                    self_draft=drafts.get("self"))
    variants = ["none", "ngram", "auto"] + [d for d in ("model", "self") if d in drafts]
    results = []
    for name, prompt in prompts().items():
        messages = [{"role": "user", "content": prompt}]
        plain_tokens = None
        base = None
        for variant in variants:
            rates = []
            for _ in range(2):
                engine.reset()
                events = list(engine.chat(messages, max_tokens=a.max_tokens, drafter=variant))
                rates.append(events[-1].tokens_per_s)
            s = events[-1]
            toks = answer_tokens(events)
            rate = statistics.median(rates)
            if variant == "none":
                plain_tokens, base = toks, rate
            same = toks == plain_tokens
            row = {"prompt": name, "drafter": variant, "tokens_per_s": round(rate, 1),
                   "speedup": round(rate / base, 3), "drafted": s.drafted, "accepted": s.accepted,
                   "identical_to_plain": same}
            results.append(row)
            print(f"  {name:7} {variant:6} {rate:8.1f} tok/s  x{rate / base:5.2f}  accepted {s.accepted}/{s.drafted}"
                  f"  identical {same}")
    report["runs"] = results
    engine.close()
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Plain decoding through localspec vs llama-cpp-python's `Llama` on the same GGUF, and time to first
token with and without the draft model, measured in one process with the order alternated.

    .venv/bin/python benchmarks/plain_parity.py                      # the default pair, 96 tokens
    .venv/bin/python benchmarks/plain_parity.py --tokens 128 --rounds 4 --json parity.json
    .venv/bin/python benchmarks/plain_parity.py --variants fa-on,fa-off,outputs-all   # find a cause

Decode speed: for every prompt and round the sides run back to back, the order rotated each round so
that every side (variants included) runs in every place equally often over as many rounds as there are
sides (on a 2-core machine the order alone moves a figure by up to ~10%). Both time the answer only
(the prompt minus its last token is evaluated beforehand, untimed, by each side alike). localspec runs
with the whole pair loaded, as `localspec chat` does, and `--drafter none`. `Llama` gets the same
context size and every core, which is the fastest plain `Llama` a user can ask for (its default is
half the cores). The verdict is the median of per-round ratios.

`--variants` adds localspec targets loaded with other context settings (each its own llama.cpp
context on the same file), to find what makes a difference: same (localspec's own settings again:
the spread between two loads of one file), llama-like (all of `Llama`'s), fa-on / fa-off (flash attention),
outputs-all (n_outputs_max = n_batch, llama.cpp's default), mmap-explicit (load mode MMAP, as `Llama`
asks, instead of AUTO), no-trees (no spare sequences for candidate trees, so no unified KV buffer).

Time to first token: a long prompt (~1,500 tokens) from an empty cache with `--drafter auto` and with
`--drafter none`, alternated; with the default pair on a CPU the planner does not draft with the 0.5B
model, so auto must not spend time on it.

The prompts are not those of `localspec bench` (held out, so nothing here was tuned on them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain how a B-tree differs from a binary search tree, and why databases use B-trees.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Rename the class `Stack` to `LifoQueue`. Reply with the whole class only.\n\nclass Stack:\n"
    "    def __init__(self):\n        self._data = []\n\n    def push(self, value):\n"
    "        self._data.append(value)\n\n    def pop(self):\n        if not self._data:\n"
    "            raise IndexError(\"pop from empty Stack\")\n        return self._data.pop()\n",
]

LONG_PROMPT_UNIT = (
    "def load_rows(path):\n    rows = []\n    with open(path, encoding='utf-8') as f:\n"
    "        for line in f:\n            name, amount, city = line.rstrip('\\n').split(',')\n"
    "            rows.append({'name': name, 'amount': float(amount), 'city': city})\n    return rows\n\n"
)

VARIANTS = {
    "same": {},  # a second context with localspec's own settings: how much two loads of one file differ
    "llama-like": {"flash_attn": False, "n_outputs_max": 0, "mmap": True},  # the settings `Llama` uses
    "fa-on": {"flash_attn": True},
    "fa-off": {"flash_attn": False},
    "outputs-all": {"n_outputs_max": 0},
    "mmap-explicit": {"mmap": True},
    "no-trees": {"tree_seqs": 0},  # without the spare sequences of candidate trees (one KV buffer for them)
}


def localspec_plain(engine, tokens: list[int], max_tokens: int, temperature: float = 0.0, seed: int = 0) -> float:
    from localspec.engine.events import Summary
    from localspec.engine.sampling import SamplingSettings

    summary = None
    sampling = SamplingSettings(temperature=temperature, seed=seed)  # top-k 40, top-p 0.95, min-p 0.05: the peer's
    for event in engine.generate(tokens, max_tokens=max_tokens, sampling=sampling, drafter="none"):
        if isinstance(event, Summary):
            summary = event
    assert summary is not None
    return summary.tokens_per_s


def parity(engine, extra: dict, peer, prompts: list[list[int]], rounds: int, max_tokens: int,
           temperature: float = 0.0) -> dict:
    from localspec.bench import Prompt

    sides = {"localspec": engine, **extra}
    tps: dict[str, list[float]] = {name: [] for name in [*sides, "Llama"]}
    ratios: dict[str, list[float]] = {name: [] for name in sides}
    is_eog = engine.target.vocab.is_eog
    for p, tokens in enumerate(prompts):
        prompt = Prompt("parity", p, "")
        for r in range(rounds):
            order = [*sides, "Llama"]
            shift = (p * rounds + r) % len(order)  # every side in every place alike: the place moves a figure
            order = order[shift:] + order[:shift]
            got = {}
            for name in order:
                if name == "Llama":
                    got[name] = peer.run(tokens, prompt, temperature, r, max_tokens, is_eog).tokens_per_s
                else:
                    got[name] = localspec_plain(sides[name], tokens, max_tokens, temperature, seed=r)
                tps[name].append(got[name])
            line = "  ".join(f"{name} {got[name]:5.1f}" for name in order)
            print(f"prompt {p + 1} round {r + 1} ({' '.join(order)}): {line} tok/s", file=sys.stderr)
            for name in sides:
                ratios[name].append(got[name] / got["Llama"])
    return {
        "tokens_per_s": {name: statistics.median(v) for name, v in tps.items()},
        "ratio_vs_llama": {name: statistics.median(v) for name, v in ratios.items()},
        "ratios": ratios,
    }


def time_to_first_token(engine, rounds: int) -> dict:
    """Prompt time and time to first token of a long prompt from an empty cache, auto vs none."""
    from localspec.engine.events import Summary
    from localspec.engine.sampling import SamplingSettings

    text = "Add type hints to every function below. Reply with the code only.\n\n" + LONG_PROMPT_UNIT * 22
    tokens = engine.chat_tokens([{"role": "user", "content": text}])
    got: dict[str, dict[str, list[float]]] = {m: {"prompt_s": [], "first_token_s": []} for m in ("auto", "none")}
    for r in range(rounds):
        for mode in (("auto", "none") if r % 2 == 0 else ("none", "auto")):
            engine.reset()
            summary = [e for e in engine.generate(tokens, max_tokens=4, sampling=SamplingSettings(temperature=0),
                                                  drafter=mode) if isinstance(e, Summary)][0]
            got[mode]["prompt_s"].append(summary.prompt_s)
            got[mode]["first_token_s"].append(summary.first_token_s)
            print(f"ttft round {r + 1} {mode:4}: prompt {summary.prompt_s:6.2f}s, first token "
                  f"{summary.first_token_s:6.2f}s ({len(tokens)} prompt tokens)", file=sys.stderr)
    med = {m: {k: statistics.median(v) for k, v in d.items()} for m, d in got.items()}
    return {"prompt_tokens": len(tokens), "median": med,
            "prompt_ratio_auto_vs_none": med["auto"]["prompt_s"] / med["none"]["prompt_s"],
            "first_token_ratio_auto_vs_none": med["auto"]["first_token_s"] / med["none"]["first_token_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("entry", nargs="?", default=None, help="catalog pair or GGUF path (default: the default pair)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3, help="runs per prompt and side (order alternates)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--suite", default=None, help="use this bench suite's prompts instead of the held-out ones")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--variants", default="", help=f"comma-separated: {', '.join(VARIANTS)}")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature (top-k 40, top-p 0.95, min-p 0.05 on both sides); 0: greedy")
    ap.add_argument("--no-ttft", action="store_true", help="skip the time-to-first-token comparison")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()

    from localspec.bench import LlamaPeer, load_suites
    from localspec.catalog import load_catalog
    from localspec.engine.api import Engine
    from localspec.loader import load
    from localspec.engine.backend import Model

    entry = args.entry or load_catalog().default_pair
    engine = load(entry, n_ctx=args.ctx)
    extra = {}
    for name in filter(None, args.variants.split(",")):
        if name not in VARIANTS:
            sys.exit(f"unknown variant {name}; choose from {', '.join(VARIANTS)}")
        options = engine.target.options.with_(**VARIANTS[name])
        extra[name] = Engine(Model(engine.target.path, options), None)
    peer = LlamaPeer(engine.target.path, engine.n_ctx, on=engine.driver.run)
    texts = PROMPTS if args.suite is None else [p.text for p in load_suites([args.suite])]
    prompts = [engine.chat_tokens([{"role": "user", "content": text}]) for text in texts[:args.prompts]]
    print(f"target {engine.target.path.name}, draft {engine.draft.path.name if engine.draft else '-'}, "
          f"{args.tokens} tokens, {len(prompts)} prompts x {args.rounds} rounds, {os.cpu_count()} threads",
          file=sys.stderr)
    t0 = time.perf_counter()
    result = {"parity": parity(engine, extra, peer, prompts, args.rounds, args.tokens, args.temperature)}
    peer.close()
    if not args.no_ttft:
        result["ttft"] = time_to_first_token(engine, args.rounds)
    result["seconds"] = time.perf_counter() - t0

    print("\nplain decoding, median tok/s:", file=sys.stderr)
    for name, v in result["parity"]["tokens_per_s"].items():
        ratio = result["parity"]["ratio_vs_llama"].get(name)
        print(f"  {name:14} {v:6.2f}" + (f"   {ratio:.3f}x Llama (median of per-round ratios)" if ratio else ""))
    if "ttft" in result:
        t = result["ttft"]
        print(f"time to first token ({t['prompt_tokens']} prompt tokens, empty cache), median:")
        for mode, m in t["median"].items():
            print(f"  --drafter {mode:5} prompt {m['prompt_s']:.2f}s, first token {m['first_token_s']:.2f}s")
        print(f"  auto / none: prompt {t['prompt_ratio_auto_vs_none']:.3f}x, "
              f"first token {t['first_token_ratio_auto_vs_none']:.3f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    for e in (engine, *extra.values()):
        e.close()


if __name__ == "__main__":
    main()

"""Flash attention on and off on this CPU: the target's decoding rate after contexts of several lengths,
with llama.cpp's flash attention and without it, the two contexts decoding in turns.

localspec leaves flash attention to llama.cpp (on, on CPUs; settings.yaml's `flash_attention` overrides
it), `Llama` turns it off unless asked. Whether that costs depends on the CPU and on the context: the
attention's share of a step grows with the tokens before it. Each step decodes --positions tokens at
the end of the context (1: a plain round; more: a verify batch whose draft is rejected at once) and
keeps one, so the context grows a token a step from --contexts. The two sides take turns of --lead
steps (`interleaved_rate.interleave`), so both meet the same machine; the side that starts alternates
from one repeat to the next.

    .venv/bin/python benchmarks/attention_rate.py --contexts 64,300,600,1200 --positions 1,4 --json out.json

Prints each pair of runs as it ends, then per context and batch size the geometric mean of the repeats'
ratios, flash attention on over off (below 1: on is slower).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
from pathlib import Path

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from common import cpu_flags
from interleaved_rate import LEAD, interleave

TEXT_MODULES = ("json.decoder", "json.encoder", "textwrap", "argparse")  # code to fill the contexts with


class DecodeSide:
    """One context of the target decoding `steps` steps after `context` tokens of `text`."""

    def __init__(self, name: str, model, text: list[int], context: int, steps: int, positions: int):
        self.name, self.model, self.text = name, model, text
        self.context, self.steps, self.positions = context, steps, positions
        self.tokens: list[int] = []  # the token each step kept (interleave counts them)
        self.done = False

    def start(self) -> None:
        self.model.truncate(0)
        self.model.decode(self.text[:self.context], 0)

    def step(self) -> None:
        at = self.context + len(self.tokens)
        self.model.decode(self.text[at:at + self.positions], at, [self.positions - 1])
        self.model.truncate(at + 1)
        self.tokens.append(self.text[at])
        self.done = len(self.tokens) >= self.steps


def source_text(vocab, needed: int) -> list[int]:
    """At least `needed` tokens of Python source from the standard library."""
    import importlib

    tokens: list[int] = []
    for name in TEXT_MODULES:
        tokens += vocab.tokenize(inspect.getsource(importlib.import_module(name)), add_special=False,
                                 parse_special=False)
        if len(tokens) >= needed:
            return tokens[:needed]
    raise SystemExit(f"The standard library sources give {len(tokens)} tokens; {needed} are needed.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a catalog entry or GGUF path (default: the default pair's target)")
    parser.add_argument("--contexts", default="64,300,600,1200", help="context lengths, comma-separated")
    parser.add_argument("--positions", default="1", help="tokens a step decodes, comma-separated (1: plain)")
    parser.add_argument("--steps", type=int, default=96, help="steps a side runs after each context")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lead", type=int, default=LEAD, help="steps a side's turn takes it past the other")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from localspec.catalog import load_catalog
    from localspec.engine.backend import Model, ModelOptions
    from localspec.errors import LocalspecError
    from localspec.names import resolve

    contexts = [int(c) for c in args.contexts.split(",")]
    positions = [int(p) for p in args.positions.split(",")]
    n_ctx = max(contexts) + args.steps + max(positions) + 1
    try:
        path = resolve(args.model or load_catalog().default_pair)[0]
        models = {"on": Model(path, ModelOptions(n_ctx=n_ctx, flash_attn=True)),
                  "off": Model(path, ModelOptions(n_ctx=n_ctx, flash_attn=False))}
    except LocalspecError as exc:
        raise SystemExit(str(exc)) from None
    text = source_text(models["on"].vocab, n_ctx)
    rows: list[dict] = []
    try:
        for context in contexts:
            for batch in positions:
                for r in range(args.repeat):
                    names = ["on", "off"] if r % 2 == 0 else ["off", "on"]
                    sides = [DecodeSide(n, models[n], text, context, args.steps, batch) for n in names]
                    spent = dict(zip(names, interleave(sides, args.lead)))
                    rate = {n: args.steps / spent[n] for n in names}
                    rows.append({"context": context, "positions": batch, "repeat": r, "first": names[0],
                                 "on": rate["on"], "off": rate["off"], "ratio": rate["on"] / rate["off"]})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for model in models.values():
            model.close()
    print(f"\n{path.name}, {args.steps} steps after each context, turns of {args.lead} steps, {args.repeat} repeats; "
          f"CPU flags: {cpu_flags()}")
    for context in contexts:
        for batch in positions:
            mine = [row for row in rows if row["context"] == context and row["positions"] == batch]
            mean = statistics.geometric_mean(row["ratio"] for row in mine)
            print(f"  context {context:5}, {batch:2} positions a step: on {sum(r['on'] for r in mine) / len(mine):6.2f}, "
                  f"off {sum(r['off'] for r in mine) / len(mine):6.2f} steps/s; on / off {mean:.3f}x "
                  f"({', '.join(format(row['ratio'], '.3f') for row in mine)})")
    if args.json:
        args.json.write_text(json.dumps({"meta": {**{k: str(v) for k, v in vars(args).items()}, "model": path.name,
                                                  "cpu_flags": cpu_flags()}, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

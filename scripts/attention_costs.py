"""Verify and prompt costs by context length, flash attention on against off, in one process.

Two contexts on the same file (flash attention on and off), alternated in every repeat; for each
context length the median time of decoding 1-64 positions with logits for all (a verify batch), then
a prompt of each length from an empty cache (logits for its last token only). Prints each cost and
off / on.

    python scripts/attention_costs.py                      # the default pair's target
    python scripts/attention_costs.py --contexts 48,600,1500 --repeats 5

localspec leaves flash attention to llama.cpp (`ModelOptions.flash_attn=None`: on, on this CPU); this
measures what that costs where a verify batch meets a long context.
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("entry", nargs="?", default=None, help="catalog pair or GGUF path (default: the default pair)")
    parser.add_argument("--contexts", default="48,300,600,1000,1500")
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from localspec.catalog import load_catalog
    from localspec.engine.backend import Model, ModelOptions
    from localspec.loader import resolve

    path, _draft = resolve(args.entry or load_catalog().default_pair)
    contexts = [int(x) for x in args.contexts.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    n_ctx = 2048
    while n_ctx < max(contexts) + max(sizes):
        n_ctx *= 2
    models = {"on": Model(path, ModelOptions(n_ctx=n_ctx, flash_attn=True)),
              "off": Model(path, ModelOptions(n_ctx=n_ctx, flash_attn=False))}
    vocab = models["on"].n_vocab
    filler = [(17 + 31 * i) % (vocab - 1) + 1 for i in range(max(contexts) + max(sizes))]
    print("| context | positions | flash attention on | off | off / on |\n|---|---|---|---|---|")
    for ctx in contexts:
        times: dict[tuple[str, int], list[float]] = {(k, n): [] for k in models for n in sizes}
        prompt: dict[str, list[float]] = {k: [] for k in models}
        for rep in range(args.repeats):
            for k in (("on", "off") if rep % 2 else ("off", "on")):
                m = models[k]
                m.truncate(0)
                t0 = time.perf_counter()
                m.decode(filler[:ctx], 0, [ctx - 1])
                prompt[k].append(time.perf_counter() - t0)
                for n in sizes:
                    t0 = time.perf_counter()
                    m.decode(filler[ctx:ctx + n], ctx, list(range(n)))
                    times[(k, n)].append(time.perf_counter() - t0)
                    m.truncate(ctx)
        for n in sizes:
            on, off = statistics.median(times[("on", n)]), statistics.median(times[("off", n)])
            print(f"| {ctx} | {n} | {on * 1000:.1f} ms | {off * 1000:.1f} ms | {off / on:.3f} |")
        on, off = statistics.median(prompt["on"]), statistics.median(prompt["off"])
        print(f"| {ctx} | prompt | {on * 1000:.0f} ms | {off * 1000:.0f} ms | {off / on:.3f} |", flush=True)


if __name__ == "__main__":
    main()

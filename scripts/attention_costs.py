"""Verify and prompt costs by context length, flash attention on against off, in one process.

Two contexts on the same file (flash attention on and off), alternated in every repeat; for each
context length the median time of decoding 1-64 positions with logits for all (a verify batch), then
a prompt of each length from an empty cache (logits for its last token only). Prints each cost and
off / on.

    python scripts/attention_costs.py                      # the default pair's target
    python scripts/attention_costs.py --contexts 48,600,1500 --repeats 5
    python scripts/attention_costs.py --answers            # whole answers: plain and auto, on against off
    python scripts/attention_costs.py --answers --suites edit,code,chat,creative,long,follow-up

`--answers` runs the default pair twice over (flash attention on, off), `--drafter none` and `auto`
alternated per prompt, two runs each, 128 tokens greedy: by default the edit suite, the same edits
after four earlier edit turns of the chat (contexts of 650-1,000 tokens) and the follow-up sessions.

localspec leaves flash attention to llama.cpp (on, on this CPU) unless settings.yaml's
`flash_attention` says otherwise; this measures what that costs where a verify batch meets a long
context, and what it saves on the prompt (docs/performance.md, "Flash attention").
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
    parser.add_argument("--answers", action="store_true", help="time whole answers instead (see above)")
    parser.add_argument("--suites", default="edit,long,follow-up",
                        help="with --answers: bench suites (edit, code, chat, creative), long (the edits after "
                             "four earlier edit turns), follow-up (the sessions' second requests)")
    args = parser.parse_args()
    if args.answers:
        answers(args.entry, args.suites.split(","))
        return

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


def answers(entry: str | None, groups: list[str]) -> None:
    from localspec.bench import load_sessions, load_suites
    from localspec.catalog import load_catalog
    from localspec.engine.api import Engine, EngineOptions
    from localspec.engine.backend import Model, ModelOptions
    from localspec.engine.sampling import SamplingSettings
    from localspec.loader import resolve

    target, draft = resolve(entry or load_catalog().default_pair)
    engines = {}
    for name, flash in (("on", True), ("off", False)):
        options = ModelOptions(n_ctx=4096, flash_attn=flash)
        engines[name] = Engine(Model(target, options), Model(draft, options) if draft else None,
                               EngineOptions(drafter="auto", history_drafts=False))
    greedy = SamplingSettings(temperature=0)
    first = engines["on"]

    def answer(messages: list[dict]) -> str:
        return list(first.chat(messages, max_tokens=128, sampling=greedy, drafter="none"))[-1].text

    suites = [g for g in groups if g not in ("long", "follow-up")]
    chats = [(p.id, [{"role": "user", "content": p.text}]) for p in (load_suites(suites) if suites else [])]
    if "long" in groups:
        edits = load_suites(["edit"])
        plain = {p.id: answer([{"role": "user", "content": p.text}]) for p in edits}
        for i, p in enumerate(edits):  # the same edit after four earlier edit turns of one chat
            earlier = [edits[(i + 1 + j) % len(edits)] for j in range(4)]
            turns = [m for q in earlier for m in ({"role": "user", "content": q.text},
                                                  {"role": "assistant", "content": plain[q.id]})]
            chats.append((p.id + "-long", [*turns, {"role": "user", "content": p.text}]))
    for session in load_sessions():
        if session.kind == "follow-up" and "follow-up" in groups:
            opening = [{"role": "user", "content": session.requests[0]}]
            chats.append((session.id, [*opening, {"role": "assistant", "content": answer(opening)},
                                       {"role": "user", "content": session.requests[1]}]))
    print("| prompt | context | plain on / off tok/s | auto on / off tok/s | auto off / on |\n|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {}
    plain_ratios: dict[str, list[float]] = {}
    for n, (ident, messages) in enumerate(chats):
        runs: dict[str, list[float]] = {}
        for rep in range(2):
            order = [("on", "none"), ("off", "none"), ("on", "auto"), ("off", "auto")]
            for flash, drafter in (order if (n + rep) % 2 == 0 else order[::-1]):
                summary = list(engines[flash].chat(messages, max_tokens=128, sampling=greedy, drafter=drafter))[-1]
                runs.setdefault(f"{flash} {drafter}", []).append(summary.tokens_per_s)
        tps = {k: statistics.mean(v) for k, v in runs.items()}
        ratio = tps["off auto"] / tps["on auto"]
        group = "long edits" if ident.endswith("-long") else ident.rsplit("-", 1)[0]
        ratios.setdefault(group, []).append(ratio)
        plain_ratios.setdefault(group, []).append(tps["off none"] / tps["on none"])
        print(f"| {ident} | {len(first.chat_tokens(messages))} | {tps['on none']:.1f} / {tps['off none']:.1f} | "
              f"{tps['on auto']:.1f} / {tps['off auto']:.1f} | {ratio:.3f} |", flush=True)
    for group, values in ratios.items():
        print(f"{group}: auto off / on, median {statistics.median(values):.3f}; plain off / on, median "
              f"{statistics.median(plain_ratios[group]):.3f}")


if __name__ == "__main__":
    main()

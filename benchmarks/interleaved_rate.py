"""localspec against llama-cpp-python's `Llama` on the same file, the two answers to a prompt generated
in turns: each turn takes one side --lead tokens past the other, until both answers are whole.

On a shared VM the machine's speed drifts from one answer to the next by more than a per-prompt floor
(no prompt below 0.95x) allows (a plain decoder against itself: docs/performance.md), so two answers
run back to back read the drift, not the engines. In turns of a few
tokens (a fraction of a second) the answers advance together, and both sides meet the same machine.
Each side's rate is its answer's tokens over the time spent in its own turns after its prompt was in
(the prompt is evaluated before the turns, untimed, as `localspec bench` times them); the side that
starts alternates from prompt to prompt and from one repeat to the next. Both decode on the engine's
one decoding thread (a second OpenMP team would slow both). History drafts off: no variant drafts
from another's answer.

    .venv/bin/python benchmarks/interleaved_rate.py --suite ~/corpus/heldout-explain.yaml --drafter auto,none \\
        --max-tokens 128 --repeat 2 --json out.json

Prints each pair of answers as it ends, then per suite the median of the prompts' ratios (each the
geometric mean of its repeats) with a 90% bootstrap interval, the worst prompt and how many fall below
0.95x; with `none` among the drafters, each drafter against localspec's own plain decoding too.

A drafter may carry other terms of the loss bound (engine/loss_bound.py), to rank them live as
`replay_planner.py replay --bound` ranks them on recordings: `auto@unbounded`, or `auto@SHARE:START`
(`auto@0.03:3`: LOSS_SHARE and START_TOKENS).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from common import cpu_flags, median_interval, prompt_ratios

LEAD = 6
FLOOR = 0.95


class LocalspecSide:
    """One answer of the engine, its prompt evaluated by `start` and its rounds pulled by `step`."""

    def __init__(self, engine, tokens: list[int], variant: str, max_tokens: int):
        from localspec.engine.sampling import SamplingSettings

        self.name = variant
        self._engine = engine
        drafter, self._bound = bound_of(variant)
        self._events: Iterator = iter(engine.generate(tokens, max_tokens=max_tokens, drafter=drafter,
                                                      sampling=SamplingSettings(temperature=0)))
        self.tokens: list[int] = []
        self.drafted = self.kept = 0
        self.done = False

    def start(self) -> None:
        from localspec.engine.events import Prefill

        drafting = self._engine.drafting  # (the request's planner takes the bound's terms as it begins)
        drafting.loss_bound, drafting.bound_terms = self._bound is not None, self._bound or {}
        while not isinstance(next(self._events), Prefill):
            pass

    def step(self) -> None:
        from localspec.engine.events import Round, Summary

        event = next(self._events)
        if isinstance(event, Round):
            self.tokens += [*event.accepted, *([event.token] if event.token is not None else [])]
            self.drafted += event.drafted
            self.kept += len(event.accepted)
        elif isinstance(event, Summary):
            self.tokens = self.tokens[:event.generated_tokens]  # (an end-of-generation token is not the answer's)
            self.done = True

    def close(self) -> None:
        self._events.close()  # (lets go of its slot now, not when the generator is collected)


class LlamaSide:
    """One greedy answer of `Llama`, one token a step, decoded on `on` (the engine's decoding thread)."""

    def __init__(self, llm, tokens: list[int], max_tokens: int, is_eog: Callable[[int], bool],
                 on: Callable[[Callable], object]):
        self.name = "Llama"
        self._llm, self._prompt, self._max, self._is_eog, self._on = llm, tokens, max_tokens, is_eog, on
        self.tokens: list[int] = []
        self.done = False
        self._gen: Iterator[int] | None = None

    def start(self) -> None:
        def evaluate() -> None:
            self._llm.reset()
            self._llm.eval(self._prompt[:-1])
            self._gen = self._llm.generate(self._prompt[-1:], reset=False, top_k=1, temp=0.0)
        self._on(evaluate)

    def step(self) -> None:
        assert self._gen is not None
        token = self._on(lambda: next(self._gen))
        if self._is_eog(token):
            self.done = True
        else:
            self.tokens.append(token)
            self.done = len(self.tokens) >= self._max

    def close(self) -> None:
        self._gen = None  # (the next answer's `start` resets the context)


def bound_of(variant: str) -> tuple[str, dict[str, float] | None]:
    """A variant's drafter and its loss bound's terms: {} the shipped ones, None unbounded."""
    drafter, _, terms = variant.partition("@")
    if not terms:
        return drafter, {}
    if terms == "unbounded":
        return drafter, None
    try:
        share, start = (float(t) for t in terms.split(":"))
    except ValueError:
        raise SystemExit(f"'{variant}': give the bound as DRAFTER@SHARE:START or DRAFTER@unbounded") from None
    return drafter, {"share": share, "start_tokens": start}


def interleave(sides: list, lead: int = LEAD, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Each side's prompt in (untimed), then turns in the order given until every side is done, each turn
    taking its side `lead` tokens past the others: the answers advance together, so each stretch of them
    meets the same machine on every side (a side whose answer ends first leaves the rest to the others).
    Returns the seconds each side spent in its own turns."""
    for side in sides:
        side.start()
    spent = [0.0] * len(sides)
    while not all(side.done for side in sides):
        for i, side in enumerate(sides):
            goal = max(len(other.tokens) for other in sides) + lead
            began = clock()
            while not side.done and len(side.tokens) < goal:
                side.step()
            spent[i] += clock() - began
    return spent


def report(rows: list[dict], variant: str, key: str, label: str) -> None:
    """Per suite: the median of the prompts' ratios (each the geometric mean of its repeats) with a
    bootstrap interval, the worst and how many fall below FLOOR."""
    by_prompt = prompt_ratios([row for row in rows if row["variant"] == variant and row.get(key) is not None], key)
    for suite in sorted({suite for suite, _prompt in by_prompt}) + ["all"]:
        ratios = {p: ratio for (s, p), ratio in by_prompt.items() if suite in (s, "all")}
        if not ratios:
            continue
        low, high = median_interval(list(ratios.values()))
        worst = min(ratios, key=ratios.get)
        below = sum(r < FLOOR for r in ratios.values())
        print(f"  {variant:6} {label:12} {suite:18} median {statistics.median(ratios.values()):.3f}x ({low:.3f}-{high:.3f}), "
              f"worst {ratios[worst]:.3f}x ({worst}), {below} of {len(ratios)} below {FLOOR:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a catalog entry (default: the default pair)")
    parser.add_argument("--suite", default="edit", help="suites or YAML prompt files, comma-separated")
    parser.add_argument("--prompts", type=int, default=None, help="only the first N prompts of each suite")
    parser.add_argument("--drafter", default="auto", help="localspec's drafters, comma-separated (none: plain)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--lead", type=int, default=LEAD, help="tokens a side's turn takes it past the other")
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                        help="localspec's flash attention (settings.yaml's flash_attention); Llama's stays off, "
                             "its default")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from localspec.bench.peers import LlamaPeer
    from localspec.bench.runner import _history_recording
    from localspec.bench.suites import load_suites
    from localspec.catalog import load_catalog
    from localspec.config import UserConfig
    from localspec.engine.params import DRAFTER_SETTINGS
    from localspec.errors import LocalspecError
    from localspec.loader import load_here

    entry = args.model or load_catalog().default_pair
    drafters = [d.strip() for d in args.drafter.split(",") if d.strip()]
    if unknown := [d for d in drafters if bound_of(d)[0] not in DRAFTER_SETTINGS]:
        raise SystemExit(f"Unknown drafter '{unknown[0]}'; choose from {', '.join(DRAFTER_SETTINGS)}.")
    try:
        prompts = [p for p in load_suites(args.suite.split(",")) if args.prompts is None or p.index < args.prompts]
        engine = load_here(entry, drafter="auto", n_ctx=args.ctx, history="memory",
                           flash_attn=UserConfig(flash_attention=args.flash_attn).flash_attn())
    except LocalspecError as exc:
        raise SystemExit(str(exc)) from None
    rows: list[dict] = []
    with engine:
        _history_recording(engine, False)
        peer = LlamaPeer(Path(engine.target.path), engine.n_ctx, on=engine.driver.run)
        try:
            for r in range(args.repeat):
                for n, prompt in enumerate(prompts):
                    tokens = engine.chat_tokens([{"role": "user", "content": prompt.text}])
                    first_ours = (n + r) % 2 == 0  # (a prompt's repeats: one started by each side)
                    for drafter in (drafters if first_ours else drafters[::-1]):
                        ours = LocalspecSide(engine, tokens, drafter, args.max_tokens)
                        theirs = LlamaSide(peer.llm, tokens, args.max_tokens, engine.target.vocab.is_eog,
                                           engine.driver.run)
                        sides = [ours, theirs] if first_ours else [theirs, ours]
                        spent = dict(zip((s.name for s in sides), interleave(sides, args.lead)))
                        ours.close()
                        theirs.close()
                        rate_ours = len(ours.tokens) / spent[drafter]
                        rate_theirs = len(theirs.tokens) / spent["Llama"]
                        rows.append({"suite": prompt.suite, "prompt": prompt.id, "repeat": r, "variant": drafter,
                                     "first": "localspec" if first_ours else "Llama", "tokens": len(ours.tokens),
                                     "llama_tokens": len(theirs.tokens), "localspec": rate_ours, "llama": rate_theirs,
                                     "ratio": rate_ours / rate_theirs, "drafted": ours.drafted, "kept": ours.kept,
                                     "same_answer": ours.tokens == theirs.tokens})
                        print(json.dumps(rows[-1]), flush=True)
        finally:
            peer.close()
    own_plain(rows)
    print(f"\n{entry}, {args.max_tokens} tokens, greedy, turns of {args.lead} tokens ahead, {args.repeat} repeats, "
          f"localspec's flash attention {args.flash_attn}; "
          f"CPU flags: {cpu_flags()}")
    for drafter in drafters:
        report(rows, drafter, "ratio", "/ Llama")
        if drafter != "none" and "none" in drafters:
            report(rows, drafter, "own_plain", "/ own plain")
    if args.json:
        args.json.write_text(json.dumps({"meta": {**{k: str(v) for k, v in vars(args).items()}, "entry": entry,
                                                  "cpu_flags": cpu_flags()}, "rows": rows}, indent=1))


def own_plain(rows: list[dict]) -> None:
    """Each drafter's row gets its ratio to localspec's plain decoding of the same prompt and repeat, both
    measured against `Llama` in their own turns (the ratio of the two ratios)."""
    plain = {(r["prompt"], r["repeat"]): r["ratio"] for r in rows if r["variant"] == "none"}
    for row in rows:
        base = plain.get((row["prompt"], row["repeat"]))
        row["own_plain"] = row["ratio"] / base if base and row["variant"] != "none" else None


if __name__ == "__main__":
    sys.exit(main())

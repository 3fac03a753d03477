"""One chat at a time through `/v1/chat/completions`: `localspec serve` against llama.cpp's `llama-server`
on the same file (by default nothing drafted: the rate of the engine's own path).

Both servers are up at once and asked in turn, one streamed chat each per pair, the order alternated
from pair to pair within each suite (whoever runs second is often faster here, by 3% or more); the
rate is the client's: tokens after the first over the time after the first, the same way for both.
Prints the median per-pair ratio and a bootstrap 90% interval of that median (a 1% difference needs 30+
pairs on a small machine).

    LLAMA_SERVER=/path/to/llama-server .venv/bin/python benchmarks/wire_rate.py --pairs 40 [--json out.json]
    LLAMA_SERVER=... .venv/bin/python benchmarks/wire_rate.py --drafter auto --serve-defaults --pairs 30
    LLAMA_SERVER=... .venv/bin/python benchmarks/wire_rate.py --drafter auto --serve-defaults \
        --prompts ~/corpus/heldout-edit.yaml,benchmarks/prompts/heldout_code.yaml,~/corpus/heldout-explain.yaml --pairs 12

`--prompts`: suites of prompts (YAML files, as `localspec bench --suite` reads them), each prompt asked
once (one pair), `--pairs` of each suite, the suites interleaved; each suite's median and worst prompt.
`--repeat N` asks every prompt N times, both servers started afresh for each repeat (localspec's history
empty: no repeat replays another's answer) and the order reversed: one pair per prompt cannot tell a
prompt's 5% from this VM's noise. Every pair records what localspec drafted (tokens made and kept, by
drafter), and each suite's summary their totals.

`--peer own`: the other server is localspec too, as the benchmark starts it without --serve-defaults (one
slot of 4096 tokens, no history drafts), the same --drafter: what serve's defaults themselves cost.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from pathlib import Path

from common import MORE_QUESTIONS, QUESTIONS, chat, cpu_flags, free_port, llama_server, median_interval, prompt_ratios, \
    start_llama_server, start_server, stop

PEER_NAMES = {"llama-server": "llama-server", "own": "localspec 1 slot"}  # by --peer: the other server in rows


def rate(url: str, question: str, tokens: int, drafts: dict | None = None) -> float:
    """Tokens per second after the first token, as the client sees them; `drafts` gets localspec's draft
    tokens made and kept by drafter."""
    out: dict = {}
    chat(url, question, tokens, out, time.perf_counter())
    if out["first_token_s"] is None or out["tokens"] < 2:
        raise SystemExit(f"{url}: no answer to time ({out})")
    if drafts is not None:
        drafts.update(out.get("by_drafter", {}))
    return (out["tokens"] - 1) / (out["done_s"] - out["first_token_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="models.yaml entry (default: the default target)")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--drafter", default="none", help="localspec's drafter (default none: the path alone)")
    ap.add_argument("--serve-defaults", action="store_true",
                    help="localspec serve as a user starts it (4 slots sharing 16k, history drafts on, its history "
                         "empty at the start) rather than 1 slot of 4096 without history; no server is asked a "
                         "question twice")
    ap.add_argument("--prompts", default=None, help="YAML prompt files, comma-separated: each suite's first "
                    "--pairs prompts, each asked once, instead of the chat questions")
    ap.add_argument("--repeat", type=int, default=1, help="ask every question this many times, both servers "
                    "started afresh each time and the order reversed (a prompt's ratio: their geometric mean)")
    ap.add_argument("--peer-args", default="", help="more llama-server arguments (e.g. --no-repack)")
    ap.add_argument("--peer", choices=("llama-server", "own"), default="llama-server",
                    help="own: the other server is localspec with one slot of 4096 and no history drafts")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.peer == "llama-server" and llama_server() is None:  # (checked before localspec's server starts)
        raise SystemExit("llama-server is not on PATH and LLAMA_SERVER does not name it")
    ours_port, theirs_port = free_port(), free_port()
    asked = suites(args.prompts, args.pairs) if args.prompts else None
    questions = QUESTIONS + MORE_QUESTIONS if args.serve_defaults else QUESTIONS
    if args.serve_defaults and not asked and args.pairs + 1 > len(questions):
        raise SystemExit(f"--serve-defaults asks each question once: at most {len(questions) - 1} pairs")
    asked = asked or [("chat", f"q{i % len(questions) + 1}", questions[i % len(questions)]) for i in range(args.pairs)]
    peer = PEER_NAMES[args.peer]
    urls = {"localspec": f"http://127.0.0.1:{ours_port}", peer: f"http://127.0.0.1:{theirs_port}"}
    rows = []
    for repeat in range(args.repeat):  # each repeat: both servers started afresh (localspec's history empty)
        rows += one_pass(args, urls, asked, questions[-1], repeat)
    ratios = [r["ratio"] for r in rows]
    lo, hi = median_interval(ratios)
    per_prompt = prompt_ratios(rows)
    ours_rate = statistics.median(r["localspec"] for r in rows)
    theirs_rate = statistics.median(r[peer] for r in rows)
    setup = "serve's defaults" if args.serve_defaults else "1 slot, no history"
    print(f"\n{len(rows)} pairs, {args.tokens} tokens, localspec --drafter {args.drafter} ({setup}) / {peer}: "
          f"median ratio {statistics.median(ratios):.3f} (90% interval of the median {lo:.3f}-{hi:.3f}; per pair "
          f"{min(ratios):.2f}-{max(ratios):.2f}); median tok/s {ours_rate:.2f} vs {theirs_rate:.2f}")
    for first in urls:
        sub = [r["ratio"] for r in rows if r["first"] == first]
        print(f"  {first} first: median ratio {statistics.median(sub):.3f} ({len(sub)} pairs)")
    if args.prompts:  # each prompt's ratio: the geometric mean of its repeats'
        for suite in dict.fromkeys(r["suite"] for r in rows):
            sub = {prompt: ratio for (s, prompt), ratio in per_prompt.items() if s == suite}
            lo, hi = median_interval(list(sub.values()))
            worst = min(sub, key=sub.get)
            print(f"  {suite}: median ratio {statistics.median(sub.values()):.3f} ({lo:.3f}-{hi:.3f}), "
                  f"worst {sub[worst]:.3f} ({worst}), {sum(v < 0.95 for v in sub.values())} of {len(sub)} "
                  f"prompts below 0.95" + (f" (each the mean of {args.repeat} repeats)" if args.repeat > 1 else ""))
            made, kept = drafted_in([r for r in rows if r["suite"] == suite])
            print(f"    localspec drafted {made} tokens, kept {kept}")
    if args.json:
        args.json.write_text(json.dumps({"meta": vars(args) | {"json": str(args.json), "cpu_flags": cpu_flags()}, "rows": rows}, indent=1))


def one_pass(args, urls: dict[str, str], asked: list[tuple[str, str, str]], warm_up: str,
             repeat: int) -> list[dict]:
    """Both servers started, every question asked of each in turn, both stopped. The order alternates
    within each suite and is reversed from one repeat to the next, so each prompt of a repeated run is
    answered first by each server equally often."""
    ours_port, theirs_port = (int(url.rsplit(":", 1)[1]) for url in urls.values())
    peer = list(urls)[1]
    rows = []
    ours = start_server(args.model, 1, ours_port, ["--drafter", args.drafter], defaults=args.serve_defaults)
    theirs = None
    try:
        if args.peer == "own":
            theirs = start_server(args.model, 1, theirs_port, ["--drafter", args.drafter])
        else:
            theirs = start_llama_server(args.model, 1, theirs_port, args.peer_args.split())
        for name in urls:  # a first answer each, not counted (loads, first-use allocations)
            rate(urls[name], warm_up, 16)
        turns: dict[str, int] = {}  # each suite's pairs so far: the order alternates within every suite
        for i, (suite, ident, question) in enumerate(asked):
            turns[suite] = turns.get(suite, -1) + 1
            order = asking_order(list(urls), turns[suite], repeat)
            drafts: dict = {}  # localspec's, by drafter: [made, kept]
            got = {name: rate(urls[name], question, args.tokens, drafts if name == "localspec" else None)
                   for name in order}
            rows.append({"pair": i, "repeat": repeat, "suite": suite, "prompt": ident, "first": order[0], **got,
                         "ratio": got["localspec"] / got[peer], "drafts": drafts})
            print(json.dumps(rows[-1]), flush=True)
    finally:  # (ours too where the peer failed to start)
        for proc in (ours, theirs):
            if proc is not None:
                stop(proc)
    return rows


def asking_order(names: list[str], turn: int, repeat: int) -> list[str]:
    """Who answers a suite's `turn`-th question first in `repeat`: alternating within the suite, reversed
    from one repeat to the next."""
    return names if (turn + repeat) % 2 == 0 else names[::-1]


def drafted_in(rows: list[dict]) -> tuple[int, int]:
    """localspec's draft tokens made and kept over these rows, every drafter together."""
    pairs = [made_kept for row in rows for made_kept in row.get("drafts", {}).values()]
    return sum(made for made, _kept in pairs), sum(kept for _made, kept in pairs)


def suites(files: str, per_suite: int) -> list[tuple[str, str, str]]:
    """(suite, prompt id, text): the first `per_suite` prompts of each file, the suites interleaved."""
    from localspec.bench.suites import parse_prompts

    chosen = []
    for name in files.split(","):
        with open(os.path.expanduser(name), encoding="utf-8") as f:
            chosen.append([(p.suite, p.id, p.text) for p in parse_prompts(f.read())][:per_suite])
    return [prompt for row in itertools.zip_longest(*chosen) for prompt in row if prompt is not None]


if __name__ == "__main__":
    main()

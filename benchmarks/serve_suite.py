"""The serving benchmark: `localspec serve` against llama.cpp's `llama-server -np N` on the same target
file (when it is on PATH or LLAMA_SERVER names it), every scenario below on a fresh server, one server
at a time, the two servers back to back for each scenario (a 2-core machine's speed drifts by 10-20%
over minutes) and their order reversed on every other trial:

    chats        1, 2 and 4 chat clients asking at the same moment (streamed, greedy, 128 tokens each,
                 benchmarks/common.py's questions, none asked twice of one server): aggregate tok/s,
                 every client's time to its first token
    editor       the recorded llama.vim typing session (benchmarks/prompts/llama-vim-session.jsonl) replayed with its real
                 gaps, nothing else asking: completion latency p50 / p90
    editor+chat  the same replay while a chat streams 256-token answers back to back; the chat's tok/s
                 against its solo rate on the same server, measured just before
    n_cmpl       /infill with n_cmpl 3 against n_cmpl 1 and against three requests in turn (48 tokens,
                 sampled, each at a new place in a file)

    LLAMA_SERVER=/path/to/llama-server .venv/bin/python benchmarks/serve_suite.py --trials 3 --json out.json
    .venv/bin/python benchmarks/serve_suite.py --scenarios editor+chat --trials 3
    .venv/bin/python benchmarks/serve_suite.py --scenarios chats --drafter model --peer-args "-md DRAFT.gguf"

Prints a table per scenario (medians over trials, localspec / llama-server) and the bars the serving
issue set: completions while a chat streams p50 <= 2 s, p90 <= 4 s with the chat at >= 60% of its solo
rate; the editor alone no slower than llama-server; 4 chats at least llama-server's aggregate with every
first token within 3 s; n_cmpl 3 / n_cmpl 1 no higher than llama-server's. localspec runs with
`--no-history-drafts` (no answer drafts from an earlier trial's), its defaults otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

import fim_session
from common import (PROMPTS, QUESTIONS, at_once, free_port, llama_server, median as med, start_llama_server,
                    start_server, stop)

SESSION = PROMPTS / "llama-vim-session.jsonl"
SCENARIOS = ("chats", "editor", "editor+chat", "n_cmpl")
CLIENTS = (1, 2, 4)  # seven distinct questions per server run: a prompt asked twice would be cached
FUNCTIONS = ["parse_header", "merge_intervals", "flatten", "retry", "slugify", "chunked", "median", "word_count",
             "is_palindrome", "transpose", "deep_get", "rolling_mean"]


class Server:
    """One fresh server for one scenario, stopped when the scenario ends."""

    def __init__(self, kind: str, entry: str, slots: int, peer_args: list[str] | None = None):
        self.kind, self.entry, self.slots, self.peer_args = kind, entry, slots, peer_args

    def __enter__(self) -> str:
        port = free_port()
        self.proc = (start_llama_server(self.entry, self.slots, port, self.peer_args) if self.kind == "llama-server"
                     else start_server(self.entry, self.slots, port))
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        stop(self.proc)


def chats(url: str, trial: int, tokens: int, extra: dict | None = None) -> dict:
    at_once(url, ["Say hello."], 8)  # warm-up: first-request costs out of the way
    out, used = {}, 0
    for clients in CLIENTS:
        asked = [QUESTIONS[(trial + used + i) % len(QUESTIONS)] for i in range(clients)]
        used += clients
        many = at_once(url, asked, tokens, extra)
        wall = max(r["done_s"] for r in many)
        out[clients] = {"aggregate_tokens_per_s": sum(r["tokens"] for r in many) / wall,
                        "first_tokens_s": [r["first_token_s"] for r in many],
                        "by_drafter": [r.get("by_drafter") for r in many]}
    return out


def editor(url: str, chat_tokens: int = 0) -> dict:
    entries = [json.loads(line) for line in SESSION.read_text().splitlines() if line.strip()]
    solo = {}
    if chat_tokens:
        solo = fim_session.chat_rate(asyncio.run(fim_session.chat_alone(url, chat_tokens, 2)))
    chat: list[dict] = []
    results = asyncio.run(fim_session.replay_session(entries, url, chat_tokens, chat))
    summary = fim_session.summarize(results, "")
    summary.pop("label")
    if chat_tokens:
        summary |= fim_session.chat_rate(chat)
        summary["solo_tokens_per_s"] = solo["chat_tokens_per_s"]
        summary["chat_kept"] = summary["chat_tokens_per_s"] / solo["chat_tokens_per_s"]
    return summary


def infill_body(place: int, n: int, tokens: int, seed: int) -> dict:
    """A completion at a new place in a file (a prompt no earlier request cached), sampled as llama.vscode
    asks, no stop."""
    name = FUNCTIONS[place % len(FUNCTIONS)]
    prefix = (f"# utils_{place}.py: small helpers\nimport re\nimport math\n\n\n"
              f"def {name}(value, *args):\n    \"\"\"{name.replace('_', ' ')} of value.\"\"\"\n    ")
    return {"input_prefix": prefix, "input_suffix": "\n\n\ndef main():\n    pass\n", "n_predict": tokens,
            "temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": seed, "n_cmpl": n, "cache_prompt": True}


def timed_infill(url: str, request: dict) -> float:
    t0 = time.perf_counter()
    httpx.post(url + "/infill", json=request, timeout=600).raise_for_status()
    return time.perf_counter() - t0


def n_cmpl(url: str, n: int = 3, trials: int = 3, tokens: int = 48) -> dict:
    """`n_cmpl` n decoded together, and n requests in turn, each against `n_cmpl` 1; the three ways back to
    back, their order rotated from trial to trial."""
    timed_infill(url, infill_body(999, 1, 8, 1))  # warm-up
    rows = []
    for trial in range(trials):
        ways = ["one", "together", "in turn"]
        ways = ways[trial % 3:] + ways[:trial % 3]
        row: dict = {"trial": trial}
        for k, way in enumerate(ways):
            request = infill_body(trial * 3 + k, n if way == "together" else 1, tokens, seed=100 + trial)
            row[way] = (sum(timed_infill(url, {**request, "seed": 100 + trial + i}) for i in range(n))
                        if way == "in turn" else timed_infill(url, request))
        row["together / one"] = row["together"] / row["one"]
        row["in turn / one"] = row["in turn"] / row["one"]
        rows.append(row)
    return {"together / one": statistics.median(r["together / one"] for r in rows), "rows": rows}


def run_one(kind: str, scenario: str, trial: int, args) -> dict | None:
    """One scenario on a fresh server; tried once more on a fresh server if it failed (printed)."""
    for attempt in range(2):
        try:
            with Server(kind, args.entry, args.slots, args.peer_args.split()) as url:
                if scenario == "n_cmpl":
                    result = n_cmpl(url)
                elif scenario == "chats":
                    asked = {"drafter": args.drafter} if args.drafter else {}
                    if args.draft_len is not None:
                        asked["draft_len"] = args.draft_len
                    result = chats(url, trial, args.tokens, asked or None)
                else:
                    result = editor(url, args.chat_tokens if scenario == "editor+chat" else 0)
            break
        except (httpx.HTTPError, SystemExit) as exc:
            print(f"{kind} {scenario} trial {trial}: failed ({type(exc).__name__}: {exc})", flush=True)
    else:
        return None
    row = {"server": kind, "scenario": scenario, "trial": trial, "result": result}
    print(json.dumps(row if scenario != "n_cmpl" else {**row, "result": {"together / one": result["together / one"]}}),
          flush=True)
    return row


def report(rows: list[dict], servers: list[str]) -> list[tuple[str, bool]]:
    """Prints the tables; returns the issue's bars as (what, met)."""
    def of(kind: str, scenario: str) -> list[dict]:
        return [r["result"] for r in rows if r["server"] == kind and r["scenario"] == scenario]

    bars: list[tuple[str, bool]] = []
    peer = "llama-server" if "llama-server" in servers else None
    if any(r["scenario"] == "chats" for r in rows):
        print("\n| chats at once | server | aggregate tok/s (median, min-max) | first token median / worst |")
        print("|---|---|---|---|")
        for clients in CLIENTS:
            for kind in servers:
                got = [r[clients] for r in of(kind, "chats")]
                if not got:
                    continue
                rates = [g["aggregate_tokens_per_s"] for g in got]
                firsts = [s for g in got for s in g["first_tokens_s"] if s is not None]
                print(f"| {clients} | {kind} | {med(rates):.1f} ({min(rates):.1f}-{max(rates):.1f}) | "
                      f"{med(firsts):.2f} s / {max(firsts):.2f} s |")
        ours = [r[4] for r in of("localspec", "chats")]
        worst = max(s for g in ours for s in g["first_tokens_s"])
        bars.append((f"4 chats: every first token within 3 s (worst {worst:.2f} s)", worst <= 3.0))
        if peer:
            a = med(r[4]["aggregate_tokens_per_s"] for r in of("localspec", "chats"))
            b = med(r[4]["aggregate_tokens_per_s"] for r in of(peer, "chats"))
            by_trial = {r["trial"]: r["result"] for r in rows if r["server"] == peer and r["scenario"] == "chats"}
            paired = [r["result"][4]["aggregate_tokens_per_s"] / by_trial[r["trial"]][4]["aggregate_tokens_per_s"]
                      for r in rows if r["server"] == "localspec" and r["scenario"] == "chats" and r["trial"] in by_trial]
            bars.append((f"4 chats: aggregate >= llama-server's ({a:.1f} vs {b:.1f} tok/s; per trial "
                         f"{', '.join(f'{x:.2f}' for x in paired)}x)", a >= b))
    for scenario in ("editor", "editor+chat"):
        if not any(r["scenario"] == scenario for r in rows):
            continue
        print(f"\n| {scenario} | server | finished | p50 / p90 (median over trials) | chat tok/s (solo) | chat kept |")
        print("|---|---|---|---|---|---|")
        for kind in servers:
            got = of(kind, scenario)
            chat = (f"{med(g.get('chat_tokens_per_s') for g in got):.1f} "
                    f"({med(g.get('solo_tokens_per_s') for g in got):.1f})" if scenario == "editor+chat" else "-")
            kept = f"{med(g.get('chat_kept') for g in got):.2f}" if scenario == "editor+chat" else "-"
            print(f"| | {kind} | {', '.join(str(g['completions']) for g in got)} | "
                  f"{med(g['p50_s'] for g in got):.2f} / {med(g['p90_s'] for g in got):.2f} s | {chat} | {kept} |")
        ours = of("localspec", scenario)
        p50, p90 = med(g["p50_s"] for g in ours), med(g["p90_s"] for g in ours)
        if scenario == "editor+chat":
            kept = med(g["chat_kept"] for g in ours)
            bars.append((f"completions while a chat streams: p50 {p50:.2f} <= 2 s, p90 {p90:.2f} <= 4 s", p50 <= 2 and p90 <= 4))
            bars.append((f"the chat keeps >= 60% of its solo rate ({kept:.0%})", kept >= 0.6))
        elif peer:
            theirs = of(peer, scenario)
            q50, q90 = med(g["p50_s"] for g in theirs), med(g["p90_s"] for g in theirs)
            bars.append((f"editor alone: p50 {p50:.2f} vs {q50:.2f} s, p90 {p90:.2f} vs {q90:.2f} s (llama-server)",
                         p50 <= q50 and p90 <= q90))
    if any(r["scenario"] == "n_cmpl" for r in rows):
        print("\n| n_cmpl 3 / n_cmpl 1 | server | per trial |")
        print("|---|---|---|")
        for kind in servers:
            got = [g["together / one"] for g in of(kind, "n_cmpl")]
            print(f"| {med(got):.2f}x | {kind} | {', '.join(f'{x:.2f}' for x in got)} |")
        if peer:
            a = med(g["together / one"] for g in of("localspec", "n_cmpl"))
            b = med(g["together / one"] for g in of(peer, "n_cmpl"))
            bars.append((f"n_cmpl 3 / n_cmpl 1: {a:.2f}x vs llama-server's {b:.2f}x", a <= b))
    print()
    for what, met in bars:
        print(f"{'met    ' if met else 'NOT MET'}  {what}")
    return bars


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry", default="qwen2.5-coder-1.5b")
    ap.add_argument("--slots", type=int, default=4, help="localspec's --slots and llama-server's -np")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="each chat client's answer")
    ap.add_argument("--chat-tokens", type=int, default=256, help="each answer of the chat beside the editor")
    ap.add_argument("--drafter", help="the drafter every chat asks localspec for (e.g. model); default: the server's")
    ap.add_argument("--draft-len", type=int, help="a draft length every chat forces on localspec")
    ap.add_argument("--peer-args", default="", help="more llama-server arguments (e.g. -md DRAFT.gguf --no-repack)")
    ap.add_argument("--no-llama-server", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    scenarios = args.scenarios.split(",")
    if unknown := set(scenarios) - set(SCENARIOS):
        raise SystemExit(f"unknown scenarios: {', '.join(sorted(unknown))} (known: {', '.join(SCENARIOS)})")
    servers = ["localspec"]
    if not args.no_llama_server:
        if llama_server() is None:
            print("llama-server is not on PATH (nor LLAMA_SERVER): localspec only", file=sys.stderr)
        else:
            servers.append("llama-server")
    rows = []
    for trial in range(args.trials):
        for scenario in scenarios:
            for kind in (servers if trial % 2 == 0 else servers[::-1]):
                if (row := run_one(kind, scenario, trial, args)) is not None:
                    rows.append(row)
    bars = report(rows, servers)
    if args.json:
        flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
        meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()} | {
            "cores": os.cpu_count(), "avx512": "avx512f" in flags, "llama_server": llama_server()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "bars": bars}, indent=1))


if __name__ == "__main__":
    main()

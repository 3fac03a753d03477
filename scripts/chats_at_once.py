"""N chat clients asking `localspec serve` at the same moment, against one chat alone: aggregate
tokens/s and every client's time to first token, with requests joining the running generation (the
server now), with --no-join (each waits for the one before: what it did before), and llama.cpp's
`llama-server -np N` on the same file when it is on PATH (or LLAMA_SERVER names it).

    .venv/bin/python scripts/chats_at_once.py                          # 4 chats, --slots 4, 2 trials
    .venv/bin/python scripts/chats_at_once.py --clients 4 --slots 4 --trials 3 --json out.json
    .venv/bin/python scripts/chats_at_once.py --configs join,llama-server
    .venv/bin/python scripts/chats_at_once.py --configs join,no-drafts --questions edit

Each server configuration starts in turn (never two at once), the order of configurations reversed
on every other trial; per trial: one chat alone, then N at once (streamed OpenAI chat completions,
greedy, `--tokens` each). No editor asks these servers for completions, so no slot is kept for them:
N chats at once need N slots. The questions are not the bench's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallel_completions import free_port, llama_server, start_llama_server, start_server  # noqa: E402

CONFIGS = ("join", "no-drafts", "no-join", "llama-server")  # no-drafts: joining, `--drafter none`

QUESTIONS = [
    "Explain how a hash map handles collisions, with an example in Python.",
    "What are the trade-offs between threads and async I/O in a web server?",
    "Describe how git rebase differs from git merge, and when to use each.",
    "How does a B-tree keep lookups fast as a database grows?",
    "Write a short guide to writing good commit messages.",
    "What happens, step by step, when you type a URL into a browser?",
]

# Edits (answers that copy their prompt, where drafts pay): written for this script, not tuned on.
EDITS = [
    "Add type hints to this function and return the result:\n```python\ndef merge(a, b):\n    out = dict(a)\n"
    "    for key, value in b.items():\n        if key in out and isinstance(out[key], dict):\n"
    "            out[key] = merge(out[key], value)\n        else:\n            out[key] = value\n    return out\n```",
    "Rename `items` to `records` everywhere in this code:\n```python\ndef total(items):\n    s = 0\n"
    "    for item in items:\n        s += item.price * item.count\n    return s\n\n\ndef cheapest(items):\n"
    "    return min(items, key=lambda item: item.price)\n```",
    "Make this function skip blank lines and return the result:\n```python\ndef parse(text):\n    rows = []\n"
    "    for line in text.splitlines():\n        name, _, value = line.partition('=')\n"
    "        rows.append((name.strip(), value.strip()))\n    return rows\n```",
    "Add a docstring to each function:\n```python\ndef clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n\n\n"
    "def lerp(a, b, t):\n    return a + (b - a) * t\n\n\ndef remap(x, a, b, c, d):\n"
    "    return lerp(c, d, (x - a) / (b - a))\n```",
    "Convert this loop to use enumerate and return the code:\n```python\ndef find(xs, target):\n    i = 0\n"
    "    while i < len(xs):\n        if xs[i] == target:\n            return i\n        i += 1\n    return -1\n```",
    "Replace print with logging in this code:\n```python\ndef sync(files, dest):\n    for f in files:\n"
    "        print('copying', f)\n        copy(f, dest)\n    print('done:', len(files), 'files')\n```",
]


def chat(url: str, question: str, tokens: int, out: dict, t0: float) -> None:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    first = None
    generated = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if first is None and data.get("choices") and data["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - t0
            if data.get("usage"):
                generated = data["usage"]["completion_tokens"]
    out.update(first_token_s=first, done_s=time.perf_counter() - t0, tokens=generated)


def at_once(url: str, questions: list[str], tokens: int) -> list[dict]:
    results: list[dict] = [{} for _ in questions]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=chat, args=(url, q, tokens, results[i], t0)) for i, q in enumerate(questions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def run(entry: str, slots: int, config: str, clients: int, tokens: int, trial: int,
        questions: list[str] = QUESTIONS) -> dict:
    port = free_port()
    if config == "llama-server":
        proc = start_llama_server(entry, slots, port)
    else:
        extra = {"no-join": ["--no-join"], "no-drafts": ["--drafter", "none"]}.get(config, [])
        proc = start_server(entry, slots, port, extra=extra)
    url = f"http://127.0.0.1:{port}"
    try:
        at_once(url, QUESTIONS[-1:], 8)  # warm-up
        alone = at_once(url, questions[trial % len(questions):][:1], tokens)[0]
        many = at_once(url, [questions[(trial + i) % len(questions)] for i in range(clients)], tokens)
    finally:
        proc.terminate()
        proc.wait(30)
    wall = max(r["done_s"] for r in many)
    row = {"config": config, "slots": slots, "trial": trial, "alone_tokens_per_s": alone["tokens"] / alone["done_s"],
           "alone_first_token_s": alone["first_token_s"],
           "aggregate_tokens_per_s": sum(r["tokens"] for r in many) / wall,
           "first_tokens_s": [r["first_token_s"] for r in many], "clients": many}
    row["aggregate / alone"] = row["aggregate_tokens_per_s"] / row["alone_tokens_per_s"]
    print(f"{config} trial {trial}: alone {row['alone_tokens_per_s']:.1f} tok/s; "
          f"{clients} at once "
          f"{row['aggregate_tokens_per_s']:.1f} tok/s in all ({row['aggregate / alone']:.2f}x), first tokens "
          f"{', '.join(f'{s:.1f}' for s in row['first_tokens_s'])} s", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry", default="qwen2.5-coder-1.5b")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--configs", default=None,
                    help=f"comma-separated, of {', '.join(CONFIGS)} (default: all; llama-server when on PATH)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--questions", choices=("chat", "edit"), default="chat",
                    help="chat questions, or edits of code in the prompt (answers that copy it)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    questions = EDITS if args.questions == "edit" else QUESTIONS
    configs = args.configs.split(",") if args.configs else [c for c in CONFIGS
                                                             if c != "llama-server" or llama_server() is not None]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"unknown configs: {', '.join(sorted(unknown))} (known: {', '.join(CONFIGS)})")
    rows = []
    for trial in range(args.trials):
        for config in (configs if trial % 2 == 0 else configs[::-1]):
            rows.append(run(args.entry, args.slots, config, args.clients, args.tokens, trial, questions))
    print(f"\n| {args.clients} chats at once | aggregate tok/s (x one alone) | first token median / worst |")
    print("|---|---|---|")
    for config in configs:
        mine = [r for r in rows if r["config"] == config]
        firsts = [s for r in mine for s in r["first_tokens_s"]]
        print(f"| {config} | {statistics.median(r['aggregate_tokens_per_s'] for r in mine):.1f} "
              f"({statistics.median(r['aggregate / alone'] for r in mine):.2f}x) | "
              f"{statistics.median(firsts):.1f} s / {max(firsts):.1f} s |")
    if args.json:
        args.json.write_text(json.dumps({"meta": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

"""localspec's drafts against llama-server's speculative configurations, through `/v1/chat/completions`
on the same file (#44's wire bar: localspec's median rate ahead of each configuration on edits, and no
worse than the best of them on code).

    LLAMA_SERVER=/path/to/llama-server .venv/bin/python scripts/wire_speculative.py --trials 3 [--json out.json]

Servers, all up at once and asked one at a time (an idle server takes no CPU; the script checks that and
reports the most CPU an idle server used while another was timed):
    localspec      `localspec serve` on the pair (drafter `auto`; no history drafts, so nothing replays an
                   earlier answer), one slot
    plain          `llama-server` on the target alone
    ngram-mod      `llama-server --spec-type ngram-mod` (its defaults)
    draft          `llama-server --spec-type draft-simple -md DRAFT` (the pair's draft, its defaults: 3 tokens)
Every trial starts every server afresh: ngram-mod's pool and localspec's lookups may learn from a trial's
earlier prompts, as they would for a user, never from an earlier trial's answers. The prompts are held out
from tuning: scripts/heldout_edit.yaml + heldout_edit2.yaml (edits) and scripts/heldout_code.yaml (code);
each is asked of every server once per trial, the order of servers rotated from prompt to prompt and
trial to trial. Greedy, `--tokens` each. The rate is the client's: tokens after the first over the time
after the first (every server evaluates the same prompt before it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parallel_completions import free_port, llama_server, start_llama_server, start_server  # noqa: E402

HERE = Path(__file__).resolve().parent
SUITES = {"edit": ["heldout_edit.yaml", "heldout_edit2.yaml"], "code": ["heldout_code.yaml"]}
CONFIGS = ("localspec", "plain", "ngram-mod", "draft")


def prompts(suite: str) -> list[str]:
    return [p for name in SUITES[suite] for p in yaml.safe_load((HERE / name).read_text())["prompts"]]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks (USER_HZ 100)


def ask(url: str, prompt: str, tokens: int) -> dict:
    """One streamed greedy chat; what the client saw and what the server said it drafted."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    out: dict = {"drafted": 0, "accepted": 0}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if first is None and data.get("choices") and data["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - t0
            if data.get("usage"):
                out["tokens"] = data["usage"]["completion_tokens"]
            if "localspec" in data:
                out.update(drafted=data["localspec"]["drafted"], accepted=data["localspec"]["accepted"])
            if data.get("timings", {}).get("draft_n"):
                out.update(drafted=data["timings"]["draft_n"], accepted=data["timings"]["draft_n_accepted"])
    done = time.perf_counter() - t0
    if first is None or out.get("tokens", 0) < 2:
        raise SystemExit(f"{url}: no answer to time ({out})")
    out.update(first_token_s=round(first, 4), rate=(out["tokens"] - 1) / (done - first))
    return out


def start(config: str, entry: str, draft: Path, port: int):
    if config == "localspec":
        return start_server(entry, 1, port)
    extra = {"plain": [], "ngram-mod": ["--spec-type", "ngram-mod"],
             "draft": ["--spec-type", "draft-simple", "-md", str(draft)]}[config]
    return start_llama_server(entry, 1, port, extra)


def trial(number: int, entry: str, draft: Path, suites: list[str], tokens: int) -> list[dict]:
    procs, urls = {}, {}
    try:
        for config in CONFIGS:  # one after another: a starting server measures and loads
            port = free_port()
            procs[config], urls[config] = start(config, entry, draft, port), f"http://127.0.0.1:{port}"
        for config in CONFIGS:  # a first answer each, not counted (first-use allocations)
            ask(urls[config], "Say hello.", 8)
        rows = []
        for suite in suites:
            for i, prompt in enumerate(prompts(suite)):
                k = (i + number) % len(CONFIGS)
                for config in CONFIGS[k:] + CONFIGS[:k]:
                    idle = {c: cpu_seconds(p.pid) for c, p in procs.items() if c != config}
                    got = ask(urls[config], prompt, tokens)
                    idle_cpu = max(cpu_seconds(procs[c].pid) - s for c, s in idle.items())
                    rows.append({"trial": number, "suite": suite, "prompt": i, "config": config,
                                 "idle_cpu_s": round(idle_cpu, 2), **got})
                    print(json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)


def summary(rows: list[dict], suites: list[str], trials: int) -> list[str]:
    lines = []
    for suite in suites:
        lines.append(f"\n{suite}: median tok/s per trial (localspec / config: ratio of medians; "
                     "median of per-prompt ratios); drafted / accepted over the trial")
        for t in range(trials):
            sub = [r for r in rows if r["suite"] == suite and r["trial"] == t]
            rate = {c: {r["prompt"]: r["rate"] for r in sub if r["config"] == c} for c in CONFIGS}
            med = {c: statistics.median(rate[c].values()) for c in CONFIGS}
            parts = []
            for c in CONFIGS:
                drafted = sum(r["drafted"] for r in sub if r["config"] == c)
                accepted = sum(r["accepted"] for r in sub if r["config"] == c)
                text = f"{c} {med[c]:.2f} ({accepted}/{drafted})"
                if c != "localspec":
                    per_prompt = statistics.median(rate["localspec"][p] / rate[c][p] for p in rate[c])
                    text += f" x{med['localspec'] / med[c]:.3f}, {per_prompt:.3f}"
                parts.append(text)
            lines.append(f"  trial {t}: " + " | ".join(parts))
        best = {t: max(statistics.median(r["rate"] for r in rows if r["suite"] == suite and r["trial"] == t
                                         and r["config"] == c) for c in CONFIGS[1:]) for t in range(trials)}
        ours = {t: statistics.median(r["rate"] for r in rows if r["suite"] == suite and r["trial"] == t
                                     and r["config"] == "localspec") for t in range(trials)}
        lines.append(f"  localspec / the best llama-server configuration, per trial: "
                     + ", ".join(f"{ours[t] / best[t]:.3f}" for t in range(trials)))
    idle = max((r["idle_cpu_s"] for r in rows), default=0.0)
    lines.append(f"\nmost CPU an idle server used while another was timed: {idle:.2f} s")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="models.yaml pair (default: the default pair)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--suites", default="edit,code")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if llama_server() is None:
        raise SystemExit("llama-server is not on PATH and LLAMA_SERVER does not name it")
    from localspec.names import resolve

    _target, draft = resolve(args.model)
    if draft is None:
        raise SystemExit(f"{args.model} has no draft model: name a pair")
    suites = args.suites.split(",")
    rows = []
    for t in range(args.trials):
        rows += trial(t, args.model, draft, suites, args.tokens)
    text = summary(rows, suites, args.trials)
    print("\n".join(text))
    if args.json:
        args.json.write_text(json.dumps({"meta": vars(args) | {"json": str(args.json)}, "summary": text,
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

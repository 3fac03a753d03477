"""Several completions per request (llama.cpp's `n_cmpl`, as llama.vscode asks) against one, through
`localspec serve` on the default pair: the time of `n_cmpl` N relative to `n_cmpl` 1, decoded
together (the server now) and one after another (N requests in turn: what it did before).

    .venv/bin/python scripts/parallel_completions.py                 # --slots 2 and 4 (serve's default)
    .venv/bin/python scripts/parallel_completions.py --slots 4 --trials 6 --json out.json

With `llama-server` on PATH (or LLAMA_SERVER naming it: built from the llama.cpp vendored in
llama-cpp-python), each --slots runs against `llama-server -np N` on the same file too, in turn.

Each trial asks for a completion at a new place in a file (a prompt no earlier request cached), the
three ways back to back, the order rotated from trial to trial (order alone moves a figure by up to
~10% on a 2-core machine). Sampled as llama.vscode asks (temperature 0.8 here, seeded), `--tokens` each,
no stop. The servers start one after another, never together. The prompts are not the bench's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ["parse_header", "merge_intervals", "flatten", "retry", "slugify", "chunked", "median", "word_count",
             "is_palindrome", "transpose", "deep_get", "rolling_mean"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(entry: str, slots: int, port: int, extra: list[str] | None = None) -> subprocess.Popen:
    """`localspec serve` on loopback (no history drafts: nothing drafts from another run's answers)."""
    exe = Path(sys.executable).parent / "localspec"
    return _started([str(exe), "serve", entry, "--port", str(port), "--no-socket", "--slots", str(slots),
                     "--ctx", str(4096 * slots), "--no-history-drafts", *(extra or [])], port)


def llama_server() -> str | None:
    """llama.cpp's `llama-server` (LLAMA_SERVER, or on PATH), if there is one."""
    return os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")


def start_llama_server(entry: str, slots: int, port: int, extra: list[str] | None = None) -> subprocess.Popen:
    """llama.cpp's `llama-server -np N` on the same target file, each slot 4096 tokens as localspec's,
    reusing cached runs that moved as an editor's window slides (--cache-reuse 256, what llama.vim asks);
    `extra`: more arguments (a speculative configuration)."""
    from localspec.names import resolve

    binary = llama_server()
    if binary is None:
        raise SystemExit("llama-server is not on PATH (or set LLAMA_SERVER)")
    target, _draft = resolve(entry)
    return _started([binary, "-m", str(target), "-np", str(slots), "-c", str(4096 * slots), "--cache-reuse", "256",
                     "--host", "127.0.0.1", "--port", str(port), "-t", str(os.cpu_count() or 1), *(extra or [])],
                    port)


def _started(cmd: list[str], port: int) -> subprocess.Popen:
    # The server's log goes to a file: a pipe nobody reads fills up (llama-server logs every request) and
    # the server blocks writing to it.
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    proc.log = log  # type: ignore[attr-defined]  # read back by server_log()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server ended: {server_log(proc)[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not start within 300 s")


def server_log(proc: subprocess.Popen) -> str:
    """What the server wrote to stderr so far."""
    log = proc.log  # type: ignore[attr-defined]
    log.seek(0)
    return log.read()


def body(trial: int, n: int, tokens: int, seed: int) -> dict:
    name = FUNCTIONS[trial % len(FUNCTIONS)]
    prefix = (f"# utils_{trial}.py: small helpers\nimport re\nimport math\n\n\n"
              f"def {name}(value, *args):\n    \"\"\"{name.replace('_', ' ')} of value.\"\"\"\n    ")
    return {"input_prefix": prefix, "input_suffix": "\n\n\ndef main():\n    pass\n", "n_predict": tokens,
            "temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": seed, "n_cmpl": n, "cache_prompt": True}


def timed(url: str, request: dict) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/infill", json=request, timeout=600)
    r.raise_for_status()
    data = r.json()
    return time.perf_counter() - t0, data if isinstance(data, list) else [data]


def run(entry: str, slots: int, n: int, trials: int, tokens: int, server: str = "localspec") -> list[dict]:
    port = free_port()
    proc = start_server(entry, slots, port) if server == "localspec" else start_llama_server(entry, slots, port)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        timed(url, body(999, 1, 8, 1))  # warm-up: first-request costs out of the way
        for trial in range(trials):
            ways = ["one", "together", "in turn"]
            ways = ways[trial % 3:] + ways[:trial % 3]
            row: dict = {"server": server, "slots": slots, "n": n, "trial": trial, "order": ways}
            for k, way in enumerate(ways):
                # each way its own place in the file (a prompt not cached), the same size for all three
                request = body(trial * 3 + k, 1 if way != "together" else n, tokens, seed=100 + trial)
                if way == "in turn":
                    seconds, out = 0.0, []
                    for i in range(n):
                        s, got = timed(url, {**request, "seed": 100 + trial + i})
                        seconds, out = seconds + s, out + got
                else:
                    seconds, out = timed(url, request)
                row[way] = seconds
                row[f"{way} tokens"] = [c.get("tokens_predicted") for c in out]
            row["together / one"] = row["together"] / row["one"]
            row["in turn / one"] = row["in turn"] / row["one"]
            print(f"{server} slots {slots} trial {trial}: one {row['one']:.2f} s, "
                  f"n_cmpl {n} together {row['together']:.2f} s "
                  f"({row['together / one']:.2f}x), in turn {row['in turn']:.2f} s ({row['in turn / one']:.2f}x)",
                  flush=True)
            rows.append(row)
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry", default="qwen2.5-coder-1.5b")
    ap.add_argument("--slots", default="2,4")
    ap.add_argument("--no-llama-server", action="store_true", help="localspec only, even with llama-server on PATH")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    servers = ["localspec"] + ([] if args.no_llama_server or llama_server() is None else ["llama-server"])
    for k, slots in enumerate(int(s) for s in args.slots.split(",")):
        for server in (servers if k % 2 == 0 else servers[::-1]):  # never two at once; order alternated
            rows += run(args.entry, slots, args.n, args.trials, args.tokens, server)
    print(f"\n| server | slots | n_cmpl {args.n} together / n_cmpl 1 (median, min-max) | in turn / n_cmpl 1 |")
    print("|---|---|---|---|")
    for server, slots in sorted({(r["server"], r["slots"]) for r in rows}):
        mine = [r for r in rows if r["slots"] == slots and r["server"] == server]
        a, b = [r["together / one"] for r in mine], [r["in turn / one"] for r in mine]
        print(f"| {server} | {slots} | {statistics.median(a):.2f}x ({min(a):.2f}-{max(a):.2f}) | "
              f"{statistics.median(b):.2f}x ({min(b):.2f}-{max(b):.2f}) |")
    if args.json:
        cpu = " ".join(sorted(set(open("/proc/cpuinfo").read().split()) & {"avx2", "avx512f"})) \
            if os.path.exists("/proc/cpuinfo") else ""
        args.json.write_text(json.dumps({"meta": {"entry": args.entry, "n": args.n, "tokens": args.tokens,
                                                  "cpu_flags": cpu, "cores": os.cpu_count()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

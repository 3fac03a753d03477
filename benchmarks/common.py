"""What the benchmarks share: servers started on loopback (`localspec serve`, llama.cpp's `llama-server`),
the chat client they time, the questions they ask, and the statistics they print.

Every benchmark runs one CPU-heavy server at a time (llama.cpp's threads spin: two processes sharing a
core cost each other up to 10x) and alternates which side runs first (order alone moves a figure by up
to ~10% on a small machine).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "benchmarks" / "prompts"
RESULTS = ROOT / "benchmarks" / "results"

# Chat questions nothing was tuned on; a server is never asked one twice in a run (it would be cached).
QUESTIONS = [
    "Explain how a hash map handles collisions, with an example in Python.",
    "What are the trade-offs between threads and async I/O in a web server?",
    "Describe how git rebase differs from git merge, and when to use each.",
    "How does a B-tree keep lookups fast as a database grows?",
    "Write a short guide to writing good commit messages.",
    "What happens, step by step, when you type a URL into a browser?",
    "How does garbage collection work in CPython, and when does the cycle collector run?",
    "Explain what a race condition is and two ways to prevent one.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# More chat questions, for runs that must not ask one twice (with the history drafter on, a repeat would
# replay the first answer).
MORE_QUESTIONS = [
    "Explain the difference between a process and a thread.",
    "How do TCP's congestion control algorithms react to packet loss?",
    "What is dependency injection, and when is it worth the indirection?",
    "Describe how a CPU cache hierarchy affects the speed of a loop over an array.",
    "How does HTTPS establish a shared key between a browser and a server?",
    "What is the difference between optimistic and pessimistic locking in a database?",
    "Explain how Python's asyncio event loop schedules coroutines.",
    "What makes a good unit test, and what makes a brittle one?",
    "How does a bloom filter answer membership queries, and what can go wrong?",
    "Describe the trade-offs of microservices against a single deployable application.",
    "How does DNS resolve a domain name, from the stub resolver to the authoritative server?",
    "What is a memory leak in a garbage-collected language, and how do you find one?",
    "Explain eventual consistency with an example from a replicated key-value store.",
    "How do you choose between a list and a set in Python for a lookup-heavy task?",
    "What does a load balancer do when one of its backends becomes slow?",
    "Explain how a regular expression engine can take exponential time, and how to avoid it.",
    "What is the purpose of a write-ahead log in a database?",
    "How does Unicode normalisation affect comparing two strings?",
    "Describe how virtual memory lets two processes use the same addresses.",
    "What are the benefits and costs of static typing in a large codebase?",
    "How do you design an API so that old clients keep working after a change?",
    "Explain how a consistent hashing ring spreads keys across servers.",
    "What is backpressure in a streaming system, and why does it matter?",
    "How does a compiler decide to inline a function?",
]


def scratch_home() -> Path:
    """A LOCALSPEC_HOME of its own, with the current one's pulled models (linked) and calibrations
    (copied): a run's history and settings touch nothing of yours, and no earlier run's answers are
    drafted from."""
    from localspec import paths

    home = Path(tempfile.mkdtemp(prefix="localspec-bench-"))
    for folder in ("data", "cache", "config"):
        (home / folder).mkdir()
    models = home / "data" / "models"
    if paths.models_dir().exists():
        models.symlink_to(paths.models_dir())
    if paths.registry_file().exists():  # what was pulled, its paths moved to the linked folder
        text = paths.registry_file().read_text().replace(str(paths.models_dir()), str(models))
        (home / "data" / paths.registry_file().name).write_text(text)
    if paths.calibration_file().exists():
        shutil.copy(paths.calibration_file(), home / "cache" / paths.calibration_file().name)
    return home


def start_server(entry: str, slots: int, port: int, extra: list[str] | None = None, *,
                 defaults: bool = False) -> subprocess.Popen:
    """`localspec serve` on loopback, 4096 tokens a slot and no history drafts (nothing drafts from
    another run's answers); `defaults`: as a user starts it (its own slots, context and history drafts),
    in a home of its own (scratch_home: the history starts empty)."""
    exe = Path(sys.executable).parent / "localspec"
    if defaults:
        home = scratch_home()
        proc = started([str(exe), "serve", entry, "--port", str(port), "--no-socket", *(extra or [])], port,
                       {**os.environ, "LOCALSPEC_HOME": str(home)})
        proc.home = home  # type: ignore[attr-defined]  # removed by stop()
        return proc
    return started([str(exe), "serve", entry, "--port", str(port), "--no-socket", "--slots", str(slots),
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
    return started([binary, "-m", str(target), "-np", str(slots), "-c", str(4096 * slots), "--cache-reuse", "256",
                    "--host", "127.0.0.1", "--port", str(port), "-t", str(os.cpu_count() or 1), *(extra or [])],
                   port)


def started(cmd: list[str], port: int, env: dict | None = None) -> subprocess.Popen:
    """`cmd` started and answering /health on `port` (its stderr kept in a file: a pipe nobody reads fills
    up, llama-server logs every request, and the server then blocks writing to it)."""
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
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


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(30)
    if hasattr(proc, "home"):  # (a home of its own: start_server(defaults=True))
        shutil.rmtree(proc.home, ignore_errors=True)


def chat(url: str, question: str, tokens: int, out: dict, t0: float, extra: dict | None = None) -> None:
    """One streamed, greedy OpenAI chat (`extra`: more body fields); `out` gets its first-token and end
    times (from `t0`), tokens, and from localspec the draft tokens each drafter made and kept."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
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
            if data.get("localspec"):
                out["by_drafter"] = data["localspec"].get("by_drafter", {})
    out.update(first_token_s=first, done_s=time.perf_counter() - t0, tokens=generated)


def at_once(url: str, questions: list[str], tokens: int, extra: dict | None = None) -> list[dict]:
    """Every question asked at the same moment, one client thread each (`extra`: more body fields)."""
    results: list[dict] = [{} for _ in questions]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=chat, args=(url, q, tokens, results[i], t0, extra))
               for i, q in enumerate(questions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def prompt_ratios(rows: list[dict], key: str = "ratio") -> dict[tuple[str, str], float]:
    """(suite, prompt) -> the geometric mean of that prompt's `key` over its rows (its repeats)."""
    by_prompt: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        by_prompt.setdefault((row["suite"], row["prompt"]), []).append(row[key])
    return {prompt: statistics.geometric_mean(values) for prompt, values in by_prompt.items()}


def median_interval(ratios: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap 90% interval of the median of `ratios`."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]


def median(values) -> float:
    """The median of the values that are not None (NaN when none is)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def cpu_flags() -> str:
    """The CPU's vector extensions that change llama.cpp's kernels, for a result's metadata."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return ""
    return " ".join(sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx512vbmi", "avx512_bf16"}))

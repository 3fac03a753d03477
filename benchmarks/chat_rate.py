"""The chat app's rate against `localspec run` on the same prompt: what the terminal UI costs the engine.

    .venv/bin/python benchmarks/chat_rate.py                       # the default pair, 400 tokens, 3 repeats
    .venv/bin/python benchmarks/chat_rate.py --modes in-process,connect --repeat 3 --json out.json
    git worktree add /tmp/before REV && .venv/bin/python benchmarks/chat_rate.py --against /tmp/before

Each repeat answers the prompt with `localspec run` and with the real `localspec chat` in a real terminal
(tmux, 160x45), in-process and `--connect`ed to a `localspec serve`, the order rotated from repeat to
repeat; greedy, drafting history off, a fresh conversation each time. With `--connect` in the modes, a
client without a screen (`bare`: the app's own client code, reading the same stream) answers too: what
the server path alone leaves of `run`'s rate, so that the app's share of `--connect`'s cost shows. With
`--against DIR` (a checkout of another revision) that revision's chat app answers too, in each mode, in
the same rotation (`in-process@against`): a change to the app compared with what it changed, in one run.
Every rate is the engine's own summary (generated tokens over the answer's wall time): `run` prints it,
the chat stores it with the answer. While the chat streams, the app's CPU is sampled: its main thread
(the UI's event loop) in process, the whole client process with `--connect`. The frames a second are
the bursts of output the app wrote to its terminal while streaming (`tmux pipe-pane` into a reader that
notes when each chunk came; capturing the pane 50 times a second instead took a sixth of a core from the
engine while it counted).

Runs in a home of its own (LOCALSPEC_HOME) that links your pulled models and copies your calibrations,
so nothing of yours is changed. Nothing else CPU-heavy may run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_flags, scratch_home

PROMPT = ("Write a Python module for a small library system: classes for books, members and loans, "
          "with methods to lend, return and list overdue books, docstrings, and a short usage example.")
EXE = Path(sys.executable).parent / "localspec"
SESSION = "localspec-chat-rate"
PASSED_ENV = ("LOCALSPEC_HOME", "HF_HOME", "PYTHONPATH")  # into the tmux session (PYTHONPATH: --against)


def own_home(max_tokens: int, draws: str = "smooth") -> Path:
    """A home of its own (common.scratch_home) whose chat settings ask greedy answers of `max_tokens`."""
    home = scratch_home()
    (home / "config" / "settings.yaml").write_text(
        f"chat: {{temperature: 0.0, max_tokens: {max_tokens}, drafter: auto}}\nhistory_drafts: false\n"
        f"chat_draws: {draws}\n")
    return home


def cpu_seconds(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_rate(entry: str, env: dict, max_tokens: int) -> float:
    out = subprocess.run([str(EXE), "run", entry, PROMPT, "--max-tokens", str(max_tokens), "--temperature", "0",
                          "--no-history-drafts", "--json"], env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"localspec run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])["tokens_per_s"]


def bare_rate(env: dict, max_tokens: int) -> dict:
    """The chat's request through the app's client code, without the app: the server path's own rate."""
    out = subprocess.run([sys.executable, __file__, "--bare-client", "--max-tokens", str(max_tokens)], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"the bare client failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def bare_client(max_tokens: int) -> None:
    from localspec.engine.sampling import SamplingSettings
    from localspec.tui.remote import RemoteProvider

    engine = RemoteProvider().load("")
    summary = None
    for summary in engine.chat([{"role": "user", "content": PROMPT}], max_tokens=max_tokens,
                               sampling=SamplingSettings(temperature=0.0), drafter="auto"):
        pass
    engine.close()
    print(json.dumps({"tokens_per_s": summary.tokens_per_s, "tokens": summary.generated_tokens}))


def answer_row(db: Path) -> tuple[str, dict] | None:
    if not db.exists():
        return None
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT status, stats FROM messages WHERE role = 'assistant' ORDER BY id DESC "
                          "LIMIT 1").fetchone()
    return (row[0], json.loads(row[1]) if row[1] else {}) if row else None


def frame_log(path: Path) -> None:
    """Read what the app writes to its terminal (tmux pipe-pane) and note when each chunk came: the
    frame counter, which costs the machine a read a chunk where capturing the pane 50 times a second
    would cost the engine a share of a core."""
    with path.open("a") as log:
        while data := os.read(0, 1 << 16):
            log.write(f"{time.monotonic()} {len(data)}\n")
            log.flush()


def frames_per_s(path: Path, start: float, end: float, gap: float = 0.02) -> float | None:
    """Frames a second the app wrote between `start` and `end` (monotonic clock): bursts of output at
    least `gap` apart (a frame reaches the pty in chunks a few ms apart at most)."""
    if not path.exists() or end <= start:
        return None
    times = [float(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]
    inside = [t for t in times if start <= t <= end]
    bursts = sum(1 for i, t in enumerate(inside) if i == 0 or t - inside[i - 1] >= gap)
    return bursts / (end - start)


def chat_rate(entry: str, env: dict, home: Path, connect: bool) -> dict:
    """The chat app answers PROMPT in tmux; its stored summary's rate, the app's CPU and the frames it
    wrote a second while streaming."""
    db = home / "data" / "history.sqlite3"
    for stale in home.glob("data/history.sqlite3*"):
        stale.unlink()
    command = f"{EXE} chat {'--connect' if connect else entry} --no-history-drafts"
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    for attempt in range(3):  # a tmux server still exiting from the last session refuses a new one
        started = subprocess.run(["tmux", "new-session", "-d", "-s", SESSION, "-x", "160", "-y", "45",
                                  "env", *[f"{k}={v}" for k, v in env.items() if k in PASSED_ENV],
                                  *command.split()], capture_output=True, text=True)
        if started.returncode == 0:
            break
        time.sleep(1)
    else:
        raise SystemExit(f"tmux did not start the chat app: {started.stderr.strip()}")
    try:
        deadline = time.monotonic() + 600
        while "is ready" not in subprocess.run(["tmux", "capture-pane", "-p", "-t", SESSION],
                                                capture_output=True, text=True).stdout:
            if time.monotonic() > deadline:
                raise SystemExit("the chat app did not load its model within 600 s")
            time.sleep(0.5)
        pid = int(subprocess.run(["tmux", "list-panes", "-t", SESSION, "-F", "#{pane_pid}"], capture_output=True,
                                 text=True).stdout.split()[0])
        app = next((p for p in [pid, *map(int, subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                                text=True).stdout.split())]
                    if "chat" in Path(f"/proc/{p}/cmdline").read_text()), pid)
        stat = Path(f"/proc/{app}/stat") if connect else Path(f"/proc/{app}/task/{app}/stat")
        frames = home / "frames.log"
        frames.unlink(missing_ok=True)
        subprocess.run(["tmux", "pipe-pane", "-t", SESSION, "-o",
                        f"exec {sys.executable} -u {Path(__file__).resolve()} --frame-log {frames}"], check=True)
        subprocess.run(["tmux", "send-keys", "-t", SESSION, "-l", PROMPT], check=True)
        subprocess.run(["tmux", "send-keys", "-t", SESSION, "Enter"], check=True)
        time.sleep(1.5)  # past the prompt's evaluation: the answer streams
        c0, t0 = cpu_seconds(stat), time.monotonic()
        c1, t1 = c0, t0
        while (row := answer_row(db)) is None or row[0] == "streaming":
            c1, t1 = cpu_seconds(stat), time.monotonic()
            time.sleep(0.2)
        status, stats = row if row else ("missing", {})
        if status != "complete":
            raise SystemExit(f"the chat's answer ended {status}: {stats}")
        return {"tokens_per_s": stats["tokens_per_s"], "tokens": stats["generated_tokens"],
                "app_cpu": (c1 - c0) / (t1 - t0) if t1 > t0 else None,
                "frames_per_s": frames_per_s(frames, t0, t1)}
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entry", default="qwen2.5-coder-1.5b")
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="in-process,connect", help="in-process, connect, or both")
    ap.add_argument("--draws", choices=("smooth", "sparingly"), default="smooth",
                    help="the chat app's settings.yaml `chat_draws` (sparingly: it yields the CPU to the engine)")
    ap.add_argument("--against", type=Path, help="a checkout of another revision whose chat app answers too")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--bare-client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--frame-log", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.frame_log:
        frame_log(args.frame_log)
        return
    if args.bare_client:
        bare_client(args.max_tokens)
        return
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is needed (setup.sh --with-editor-tools installs it)")
    home = own_home(args.max_tokens, args.draws)
    env = {**os.environ, "LOCALSPEC_HOME": str(home)}
    modes = args.modes.split(",")
    if args.against:
        modes += [f"{mode}@against" for mode in modes]
    sides = ["run", *modes, *(["bare"] if "connect" in modes else [])]
    server = None
    if "connect" in modes:
        server = subprocess.Popen([str(EXE), "serve", args.entry, "--no-history-drafts", "--port", "0", "--slots", "1",
                                   "--ctx", "4096"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
        while not (home / "run" / "localspec.sock").exists():
            if server.poll() is not None:
                raise SystemExit(f"localspec serve ended: {server.stderr.read()[-2000:]}")
            time.sleep(0.5)
    rows = []
    try:
        for i in range(args.repeat):
            for side in sides[i % len(sides):] + sides[:i % len(sides)]:
                if side == "run":
                    got = {"tokens_per_s": run_rate(args.entry, env, args.max_tokens)}
                elif side == "bare":
                    got = bare_rate(env, args.max_tokens)
                else:
                    mode, _, against = side.partition("@")
                    got = chat_rate(args.entry, {**env, "PYTHONPATH": str(args.against.resolve())} if against else env,
                                    home, mode == "connect")
                rows.append({"repeat": i, "side": side, **got})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        shutil.rmtree(home, ignore_errors=True)
    plain = statistics.median(r["tokens_per_s"] for r in rows if r["side"] == "run")
    print(f"\n`localspec run`: {plain:.1f} tok/s (median of {args.repeat})")
    if "bare" in sides:
        bare = statistics.median(r["tokens_per_s"] for r in rows if r["side"] == "bare")
        print(f"a client without a screen over `serve` (bare): {bare:.1f} tok/s = {bare / plain:.3f}x run")
    for mode in modes:
        mine = [r for r in rows if r["side"] == mode]
        rate = statistics.median(r["tokens_per_s"] for r in mine)
        cpu = statistics.median(r["app_cpu"] for r in mine if r["app_cpu"] is not None)
        frames = [r["frames_per_s"] for r in mine if r["frames_per_s"] is not None]
        versus_bare = f" ({rate / bare:.3f}x bare)" if mode.startswith("connect") and "bare" in sides else ""
        print(f"`localspec chat` {mode}: {rate:.1f} tok/s = {rate / plain:.3f}x run{versus_bare}; the app's "
              f"{'process' if mode.startswith('connect') else 'main thread'} {cpu:.1%} of a core"
              + (f"; {statistics.median(frames):.1f} frames/s" if frames else ""))
    if args.json:
        args.json.write_text(json.dumps({"meta": {k: str(v) for k, v in vars(args).items()} | {
            "cpu_flags": cpu_flags(), "cores": os.cpu_count()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

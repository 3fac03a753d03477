"""What the calibration's trust checks see, alone and beside another llama.cpp process.

    .venv/bin/python benchmarks/calibration_noise.py qwen2.5-coder-1.5b --runs 2

Loads the target once, takes `--runs` calibrations with the machine to itself, then starts a second
process that decodes with llama.cpp in a loop (the same file by default: `--rival` another) and takes
as many again; prints, for each, the one-token and 16-position costs, how far its passes disagreed,
the CPU share llama.cpp's threads got, what other programs used, and the verdict
(engine/calibration.py's `assess`). Nothing is cached.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp  # noqa: F401  (before numpy, as localspec.engine does)


from localspec.engine import calibration  # noqa: E402
from localspec.engine.backend import Model, ModelOptions  # noqa: E402
from localspec.loader import resolve  # noqa: E402

def rival(path: Path) -> None:
    """Decode with llama.cpp until killed: a prompt, then 32 tokens one at a time, over and over.
    Prints "decoding" once loaded (tests/test_cli.py starts it as `--as-rival PATH`)."""
    m = Model(path, ModelOptions(n_ctx=512))
    print("decoding", flush=True)
    while True:
        m.truncate(0)
        m.decode(list(range(10, 74)), 0, [63])
        for i in range(32):
            m.decode([100 + i], 64 + i, [0])


def start_rival(path: Path) -> subprocess.Popen:
    """A second llama.cpp process decoding until killed (what the issue measured under)."""
    proc = subprocess.Popen([sys.executable, __file__, "--as-rival", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # loaded and decoding
    time.sleep(1.0)
    return proc


def row(label: str, c: calibration.Calibration) -> str:
    share = f"{c.cpu_share:.2f}" if c.cpu_share is not None else "-"
    others = f"{c.others_busy:.2f}" if c.others_busy is not None else "-"
    return (f"{label:8} 1 pos {c.costs[1] * 1e3:7.1f} ms  16 pos {c.costs[16] * 1e3:7.1f} ms ({c.costs[16] / c.costs[1]:4.1f}x)"
            f"  spread {c.spread:5.2f}  cpu share {share}  others {others}  -> {'trusted' if c.trusted else c.problem}")


def main() -> None:
    if sys.argv[1:2] == ["--as-rival"]:
        rival(Path(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("entry", help="catalog id or GGUF path (the pair's target is measured)")
    parser.add_argument("--rival", default=None, help="GGUF the second process decodes (default: the same file)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args()
    target, _draft = resolve(args.entry)
    rival_path = Path(args.rival) if args.rival else target
    print(f"CPU: {os.cpu_count()} cores; {target.name}; rival {rival_path.name}")
    model = Model(target, ModelOptions(n_ctx=args.ctx))
    try:
        for i in range(args.runs):
            print(row("alone", calibration.take(model)), flush=True)
        rival_process = start_rival(rival_path)
        try:
            for i in range(args.runs):
                print(row("beside", calibration.take(model)), flush=True)
        finally:
            os.kill(rival_process.pid, signal.SIGKILL)
            rival_process.wait()
        time.sleep(1.0)
        print(row("alone", calibration.take(model)), flush=True)
    finally:
        model.close()


if __name__ == "__main__":
    main()

"""localspec against llama.cpp's `llama-server` on one GGUF with an MTP head, through the same wire: plain
decoding and MTP drafts, 1 and N greedy chats at once (random weights draft the same tokens in both
engines, so the rates compare engines, not luck).

Each configuration is one server started alone (never two at once), asked `--trials` times, the order of
the configurations reversed every trial. The rate is the aggregate a client sees: tokens of every answer
over the time until the last one ended. On a machine without a GPU it runs as a dry run of the device
check (benchmarks/gpu/check.sh), slowly.

    LLAMA_SERVER=/path/to/llama-server python benchmarks/gpu/engines.py FILE.gguf [--requests 1 4] [--tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import QUESTIONS, at_once, free_port, start_llama_server, start_server, stop  # noqa: E402

# (label, engine, its arguments): llama-server's MTP is its default draft length (n_max 3, p_min 0).
CONFIGS = [
    ("llama-server plain", "llama", []),
    ("llama-server draft-mtp", "llama", ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]),
    ("localspec none", "localspec", ["--drafter", "none"]),
    ("localspec mtp", "localspec", ["--drafter", "mtp"]),
]


def aggregate(model: str, engine: str, extra: list[str], requests: int, tokens: int, gpu_layers: int) -> tuple[float, float]:
    """(tokens per second over all answers, the slowest first token in seconds) of `requests` chats at once."""
    port = free_port()
    if engine == "llama":
        proc = start_llama_server(model, requests, port, ["-ngl", str(gpu_layers), *extra])
    else:
        proc = start_server(model, requests, port, ["--gpu-layers", str(gpu_layers), *extra])
    try:
        url = f"http://127.0.0.1:{port}"
        at_once(url, [QUESTIONS[-1]] * requests, 8)  # warm-up (its prompt differs from those timed)
        results = at_once(url, [QUESTIONS[i % len(QUESTIONS)] for i in range(requests)], tokens)
    finally:
        stop(proc)
    total = sum(r["tokens"] for r in results)
    return total / max(r["done_s"] for r in results), max(r["first_token_s"] or 0.0 for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a GGUF with an MTP head (tests/fixtures/random_gguf.py qwen35 --mtp 1)")
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=99)
    args = ap.parse_args()
    for requests in args.requests:
        rates: dict[str, list[float]] = {label: [] for label, _e, _x in CONFIGS}
        firsts: dict[str, list[float]] = {label: [] for label, _e, _x in CONFIGS}
        for trial in range(args.trials):
            for label, engine, extra in (CONFIGS if trial % 2 == 0 else CONFIGS[::-1]):
                rate, first = aggregate(args.model, engine, extra, requests, args.tokens, args.gpu_layers)
                rates[label].append(rate)
                firsts[label].append(first)
                print(f"  {requests} at once, trial {trial + 1}: {label:24} {rate:8.1f} tok/s  first token {first:.2f} s",
                      flush=True)
        plain = statistics.median(rates["llama-server plain"])
        print(f"{requests} request(s) at once, {args.tokens} tokens each, median of {args.trials}:")
        for label in rates:
            rate = statistics.median(rates[label])
            print(f"  {label:24} {rate:8.1f} tok/s  {rate / plain:5.2f}x llama-server plain  "
                  f"slowest first token {max(firsts[label]):.2f} s")


if __name__ == "__main__":
    main()

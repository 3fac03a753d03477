"""Engine benchmark (not a test): plain vs speculative decoding on one pair, in one run.

    .venv/bin/python scripts/bench_engine.py [PAIR] [--max-tokens 128] [--repeat 2] [--drafter auto]

Greedy. For each prompt, the variants run interleaved (plain, speculative, plain, speculative, …) so
that machine drift cancels out; the report gives median tokens/s per variant, the ratio of medians
per category, acceptance, and how many tokens of the speculative answer equal the plain one. It also
times llama-cpp-python's own `Llama` generation on the same target file (plain, same prompts and
token budget) to show the engine's per-token overhead, and the process's peak memory.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time

from localspec.engine.api import load
from localspec.engine.events import answer_tokens

FUNC = '''def parse_config(path):
    """Read a simple KEY=VALUE config file into a dict."""
    result = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            result[key.strip()] = value.strip()
    return result
'''

CLASS = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())
'''

LOOP = '''def moving_average(values, window):
    averages = []
    for i in range(len(values) - window + 1):
        chunk = values[i:i + window]
        averages.append(sum(chunk) / window)
    return averages
'''

PROMPTS = {
    "edit": [
        f"Rename the variable `result` to `settings` in this function. Reply with the whole function only.\n\n{FUNC}",
        f"Add type hints to every method of this class. Reply with the whole class only.\n\n{CLASS}",
        f"Rename `averages` to `means` and `chunk` to `frame`. Reply with the whole function only.\n\n{LOOP}",
    ],
    "code": [
        "Write a Python function that merges two sorted lists into one sorted list, with a docstring.",
        "Write a Python class for a least-recently-used cache with get and put methods.",
        "Write a Python function that validates an IPv4 address string without using regular expressions.",
    ],
    "story": [
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Tell a bedtime story about a fox who learns to share.",
    ],
}


def run_once(engine, messages, max_tokens, drafter):
    events = list(engine.chat(messages, max_tokens=max_tokens, drafter=drafter))
    return events[-1], answer_tokens(events)


def peer_llama(path, prompts_tokens, max_tokens, n_ctx, repeat):
    """llama-cpp-python's high-level Llama, plain greedy, same file/prompts/budget: tokens/s medians."""
    from llama_cpp import Llama

    import os

    threads = os.cpu_count() or 1  # Llama's default is half the cores; the engine uses all of them
    llm = Llama(str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    rates = []
    for tokens in prompts_tokens:
        per = []
        for _ in range(repeat):
            llm.reset()
            llm.eval(tokens[:-1]) if len(tokens) > 1 else None
            t0 = time.perf_counter()
            n = 0
            for tok in llm.generate(tokens[-1:], top_k=1, temp=0.0, reset=False):
                n += 1
                if llm.token_eos() == tok or n >= max_tokens:
                    break
            per.append(n / (time.perf_counter() - t0))
        rates.append(statistics.median(per))
    llm.close()
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pair", nargs="?", default="qwen2.5-coder-1.5b")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--categories", default="edit,code,story")
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args()

    engine = load(args.pair, drafter="auto", n_ctx=2048)
    print(f"pair {args.pair}: target {engine.target.path.name}, draft "
          f"{engine.draft.path.name if engine.draft else '-'}; greedy, {args.max_tokens} tokens, "
          f"repeat {args.repeat}, speculative drafter '{args.drafter}'", flush=True)
    print("verify cost by batch size (ms): " + ", ".join(
        f"{n}:{s * 1000:.0f}" for n, s in sorted(engine.cost.verify_s.items())), flush=True)

    rows = []
    prompt_tokens = []
    for category in args.categories.split(","):
        for prompt in PROMPTS[category]:
            messages = [{"role": "user", "content": prompt}]
            prompt_tokens.append(engine.chat_tokens(messages))
            plain, spec, same, acc = [], [], [], []
            for _ in range(args.repeat):
                engine.reset()
                s_plain, t_plain = run_once(engine, messages, args.max_tokens, "none")
                engine.reset()
                s_spec, t_spec = run_once(engine, messages, args.max_tokens, args.drafter)
                plain.append(s_plain.tokens_per_s)
                spec.append(s_spec.tokens_per_s)
                acc.append((s_spec.accepted, s_spec.drafted, s_spec.mean_accepted_per_round, s_spec.rounds_by_drafter))
                n = min(len(t_plain), len(t_spec))
                first_diff = next((i for i in range(n) if t_plain[i] != t_spec[i]), n)
                same.append(first_diff / max(1, len(t_plain)))
            ratio = statistics.median(spec) / statistics.median(plain)
            accepted, drafted, mean_len, by = acc[-1]
            rows.append((category, statistics.median(plain), statistics.median(spec), ratio, accepted, drafted,
                         mean_len, min(same)))
            print(f"  {category:6} plain {statistics.median(plain):6.1f} tok/s  spec {statistics.median(spec):6.1f} tok/s"
                  f"  x{ratio:.2f}  accepted {accepted}/{drafted}  mean run {mean_len:.2f}  rounds {by}"
                  f"  identical prefix {min(same):.0%}", flush=True)

    print("\n| category | plain tok/s | speculative tok/s | speedup (ratio of medians) | acceptance |")
    print("|---|---|---|---|---|")
    for category in args.categories.split(","):
        sel = [r for r in rows if r[0] == category]
        p = statistics.median(r[1] for r in sel)
        s = statistics.median(r[2] for r in sel)
        a = sum(r[4] for r in sel) / max(1, sum(r[5] for r in sel))
        print(f"| {category} | {p:.1f} | {s:.1f} | {s / p:.2f}x (per prompt {min(r[3] for r in sel):.2f}-"
              f"{max(r[3] for r in sel):.2f}) | {a:.0%} |")

    if not args.no_peer:
        target_path = engine.target.path
        ours = [r[1] for r in rows]
        engine.close()
        peer = peer_llama(target_path, prompt_tokens, args.max_tokens, 2048, args.repeat)
        ratio = statistics.median(ours) / statistics.median(peer)
        print(f"\nplain decoding: localspec {statistics.median(ours):.1f} tok/s vs llama-cpp-python Llama "
              f"{statistics.median(peer):.1f} tok/s (x{ratio:.3f})")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

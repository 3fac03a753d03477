"""Four requests decoded together in one engine, with drafts in the shared steps (the default drafter)
and without (`none`): aggregate tokens/s, and what the shared steps drafted and kept.

The first request starts alone and the others join it at its first round (as the server's scheduler
does when they arrive together); greedy, `--tokens` each, no history; trials alternate which side
runs first and rotate the questions (scripts/chats_at_once.py's edits or chat questions, not tuned on).
The engine-level twin of `scripts/chats_at_once.py --configs join,no-drafts`, without the HTTP noise.

    .venv/bin/python scripts/shared_drafts.py --questions edit --trials 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chats_at_once import EDITS, QUESTIONS  # noqa: E402

from localspec.engine.events import Round  # noqa: E402
from localspec.loader import load  # noqa: E402


def count_promises(engine) -> list[float]:
    """[tokens promised, kept] by the shared steps' drafts from now on (the engine's Promises, counted
    without decay)."""
    totals = [0.0, 0.0]
    promises = engine.drafting.promises
    observe = promises.observe

    def counted(promised: float, kept: int) -> None:
        totals[0] += promised
        totals[1] += kept
        observe(promised, kept)

    promises.observe = counted
    return totals


def together(engine, prompts: list[str], mode: str, tokens: int) -> tuple[float, int, int, int, int]:
    """Aggregate tokens/s of the prompts decoded together, the draft tokens shared steps drafted and kept,
    and those that rounds alone (the first request's first round, the last one left) drafted and kept."""
    contexts = [engine.chat_tokens([{"role": "user", "content": p}]) for p in prompts]
    host: list = []
    guests: list[list] = [[] for _ in contexts[1:]]
    t0 = time.perf_counter()
    for event in engine.generate(contexts[0], max_tokens=tokens, drafter=mode):
        host.append(event)
        if isinstance(event, Round) and event.index == 0:
            for events, context in zip(guests, contexts[1:]):
                engine.submit(context, events.append, max_tokens=tokens, drafter=mode)
    while engine.step():
        pass
    wall = time.perf_counter() - t0
    answers = [host, *guests]
    rounds = [e for events in answers for e in events if isinstance(e, Round)]
    shared = [e for e in rounds if e.shared]
    alone = [e for e in rounds if not e.shared]
    generated = sum(events[-1].generated_tokens for events in answers)
    return (generated / wall, sum(e.drafted for e in shared), sum(len(e.accepted) for e in shared),
            sum(e.drafted for e in alone), sum(len(e.accepted) for e in alone))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entry", default="qwen2.5-coder-1.5b")
    ap.add_argument("--questions", choices=("edit", "chat"), default="edit")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--trials", type=int, default=6)
    args = ap.parse_args()
    questions = EDITS if args.questions == "edit" else QUESTIONS
    engine = load(args.entry, slots=args.requests, n_ctx=4096 * args.requests, history="off")
    rates: dict[str, list[float]] = {"auto": [], "none": []}
    promises = count_promises(engine)
    for trial in range(args.trials):
        prompts = [questions[(trial + i) % len(questions)] for i in range(args.requests)]
        for mode in (("auto", "none") if trial % 2 == 0 else ("none", "auto")):
            engine.reset()
            rate, drafted, kept, alone_drafted, alone_kept = together(engine, prompts, mode, args.tokens)
            rates[mode].append(rate)
            print(f"{mode} trial {trial}: {rate:.1f} tok/s in all; shared steps drafted {drafted}, kept {kept};"
                  f" rounds alone drafted {alone_drafted}, kept {alone_kept}"
                  f" (promised {promises[0]:.1f}, kept {promises[1]:.0f} so far; trust now"
                  f" {engine.drafting.promises.trust:.2f})", flush=True)
    ratios = [a / n for a, n in zip(rates["auto"], rates["none"])]
    print(f"auto / none per trial: {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f}")
    engine.close()


if __name__ == "__main__":
    main()

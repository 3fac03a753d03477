"""Replay the planner offline on recorded greedy answers, to try planner changes in seconds.

A greedy answer does not depend on how it was drafted (up to llama.cpp's batched-kernel rounding), so
once the plain answers and the target's verify costs are recorded, any n-gram planning policy can be
replayed against them: each round's draft is kept as far as it agrees with the recorded answer, and
costs the recorded price of verifying its batch. On the edit suite the replay predicted 1.31x where
`localspec bench` measured 1.39x (two repeats, AVX-512 build): use it to rank ideas, and the bench
to measure them; check an idea on `--prompts benchmarks/prompts/heldout_edit.yaml` too, edits nothing was tuned
on. It replays n-gram drafting only (copies, renames, session openings), which is all that pays on a
CPU, and copies of a session's earlier requests (the history drafter) where the recording has them.

    python benchmarks/replay_planner.py record qwen2.5-coder-1.5b answers.json --suite edit,code,creative
    python benchmarks/replay_planner.py replay answers.json
    python benchmarks/replay_planner.py replay answers.json --report --bound 0.02:2.5   # another loss bound beside
    python benchmarks/replay_planner.py record qwen2.5-coder-1.5b heldout.json --prompts benchmarks/prompts/heldout_edit.yaml
    python benchmarks/replay_planner.py record qwen2.5-coder-1.5b followup.json --sessions follow-up
    python benchmarks/replay_planner.py replay followup.json --oracle
    python benchmarks/replay_planner.py record qwen2.5-coder-1.5b heldout-followup.json --sessions follow-up \
        --sessions-file benchmarks/prompts/heldout_followups.yaml
    python benchmarks/replay_planner.py record qwen2.5-coder-1.5b retellings.json --sessions quote,tool-output \
        --sessions-file benchmarks/prompts/heldout_retellings.yaml
    .venv-avx2/bin/python benchmarks/replay_planner.py record qwen2.5-coder-1.5b edit-avx2.json --suite edit
    python benchmarks/replay_planner.py replay answers.json --costs edit-avx2.json --oracle

`--sessions follow-up` records the bench's follow-up sessions: the second request's prompt is the
conversation with the first answer in it, as `localspec bench --suite sessions` sends it (any session
kind: `quote` and `tool-output` start a new conversation), with the session's first request and answer:
its replay drafts from them too (the history drafter, holding what the bench's pass holds); older
recordings have none and replay copies of the request itself. `--costs` prices the
replay with another recording's verify costs (record once with an AVX2 build, `LOCALSPEC_CMAKE_ARGS`
without the AVX-512 flags, and once with the default one; replay every recording at both). `--oracle`
also prints what perfect knowledge would reach: every round drafts exactly the copy that the answer
goes on to keep (up to 63 tokens, the lengths the costs were measured for), the headroom a planner has,
and the same oracle within the shipped loss bound (each round no longer than the room allows were none
of it kept), the headroom a planner obeying the bound has.
`--age-bound` prints what drafting by copy age reaches with hindsight: every fixed draft length per
age class (prompt copies 0-4, 5-9 and 10+ tokens old, answer copies 10+), the best for each suite
chosen on the very answers it is scored on. A yardstick, not a proof: the planner also learns within
a request. Where it stays well below a target, pricing by age is unlikely to reach it: the copies'
breaks there are not told by their age.

Candidate trees (benchmarks/replay_trees.py): `--trees SLACK` grows each round's chain into a tree of other
matches within SLACK more than the chain's verify cost; `--bounds` prints the hindsight bound of each
kind of draft (copies, trees of lookups, and after `record-draft` the draft model's guesses and the copy
with the model's guess where it breaks); `--model-drafts` replays the draft model's chains and two-wide
trees priced with its recorded time; `--gpu-table` prices bounds and model drafts at a GPU's shape.

    python benchmarks/replay_planner.py record-draft qwen2.5-coder-1.5b heldout.json
    python benchmarks/replay_planner.py replay heldout.json --bounds --trees 0.1 --model-drafts
    python benchmarks/replay_planner.py replay heldout.json --gpu-table --bounds --model-drafts 0.4
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from localspec.engine.adaptive import CostModel, free_positions
from localspec.engine.backend.gguf import VocabFile
from localspec.engine.measuring import measure_costs
from localspec.engine.drafters import CopyDrafter, HistoryDrafter, NgramDrafter, OpeningDrafter
from localspec.engine.drafters.base import Draft
from localspec.engine.drafters.ngram import copy_of
from localspec.engine.drafters.respelling import Respelling
from localspec.engine.drafters.suffix_index import SuffixIndex
from localspec.engine.loss_bound import LOSS_SHARE, START_TOKENS, LossBound
from localspec.engine.planner import Drafting
from common import median_interval
from replay_trees import GPU_SHAPE, bounds, grow, hindsight, hindsight_within, kept_of, kept_on, model_drafts, truth_of


def record(entry: str, out: str, suites: list[str], max_tokens: int, prompts_file: str | None = None,
           sessions: list[str] = (), sessions_file: str | None = None) -> None:
    from localspec import load
    from localspec.bench import next_messages
    from localspec.bench import load_sessions, load_suites, parse_prompts
    from localspec.engine.events import answer_tokens
    from localspec.engine.sampling import SamplingSettings

    engine = load(entry, n_ctx=2048)
    vocab = engine.target.vocab
    data = {"eos": vocab.eos, "control": [t for t in range(vocab.n_tokens) if vocab.is_control(t)],
            "verify_s": {}, "answers": [], "max_tokens": max_tokens}
    greedy = SamplingSettings(temperature=0)
    conversations: list[tuple[str, str, list[dict]]] = []  # (id, suite, messages before the recorded answer)
    earlier: dict[str, list[list[int]]] = {}  # a session's earlier requests (prompt and answer), as history holds them
    if sessions:
        for session in load_sessions([sessions_file] if sessions_file else ["sessions"]):
            if session.kind in sessions:  # the first answer, then the second request as the bench sends it
                first = [{"role": "user", "content": session.requests[0]}]
                events = list(engine.chat(first, max_tokens=max_tokens, sampling=greedy, drafter="none"))
                conversation = [*first, {"role": "assistant", "content": events[-1].text}]
                earlier[session.id] = [[*engine.chat_tokens(first), *answer_tokens(events)]]
                conversations.append((session.id, session.kind,
                                      next_messages(session.requests[1], conversation, [first])))
    else:
        if prompts_file:  # one file or several, comma-separated: each its own suite
            prompts = []
            for name in prompts_file.split(","):
                with open(os.path.expanduser(name), encoding="utf-8") as f:
                    prompts += parse_prompts(f.read())
        else:
            prompts = load_suites(suites)
        conversations = [(p.id, p.suite, [{"role": "user", "content": p.text}]) for p in prompts]
    for done, (ident, suite, messages) in enumerate(conversations):
        events = list(engine.chat(messages, max_tokens=max_tokens, sampling=greedy, drafter="none"))
        data["answers"].append({"id": ident, "suite": suite, "prompt": engine.chat_tokens(messages),
                                "answer": answer_tokens(events), "ended": events[-1].stop_reason == "eog",
                                "earlier": earlier.get(ident, [])})
        print(f"{ident}: {len(data['answers'][-1]['answer'])} tokens ({done + 1} of {len(conversations)})",
              file=sys.stderr)
    data["verify_s"] = measure_costs(engine.target, context_tokens=200, repeats=3)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(data, f)


def record_draft(entry: str, recorded: str) -> None:
    """Add the pair's draft model's guesses to a recording: at each answer position, its two likeliest
    tokens after the recorded answer so far (what it would draft there whenever the tokens before were
    kept), and its one-token decode time (replay_trees.model_bound)."""
    import time

    import numpy as np

    from localspec import load

    with open(recorded, encoding="utf-8") as f:
        data = json.load(f)
    engine = load(entry, n_ctx=2048, calibrate=False)
    draft = engine.draft
    if draft is None:
        raise SystemExit(f"{entry} has no draft model")
    for item in data["answers"]:
        truth = truth_of(data, item)
        tokens = item["prompt"] + truth
        first = len(item["prompt"]) - 1  # the row that predicts the answer's first token
        draft.truncate(0)
        draft.decode(tokens[:first], 0)
        guesses = []
        for start in range(first, first + len(truth), 64):
            chunk = tokens[start:min(start + 64, first + len(truth))]
            rows = draft.decode(chunk, start, list(range(len(chunk))))
            guesses += [[int(t) for t in np.argsort(-r)[:2]] for r in rows]
        item["draft_guesses"] = guesses
        print(f"{item['id']}: {sum(g[0] == t for g, t in zip(guesses, truth))} of {len(truth)} guessed",
              file=sys.stderr)
    times = []
    for i in range(12):
        t0 = time.perf_counter()
        draft.decode([tokens[-1]], len(tokens) - 1 + i)
        times.append(time.perf_counter() - t0)
    data["draft_s"] = statistics.median(times)
    with open(recorded, "w", encoding="utf-8") as f:
        json.dump(data, f)


def replay(data: dict, trees: float | None = None, one_position: float = 1.0,
           plan_on_truth: bool = False, bounded: bool = True,
           bound: tuple[float, float] | None = None, respelling: Respelling | None = None) -> dict[str, list[float]]:
    """Predicted speedup per answer, by suite, with the planner as it is in this checkout. `trees`: each
    round's chain grown into a tree within that much more than the chain's verify cost (replay_trees).
    `one_position`: rounds of one position cost that share of the recorded table's (the table's bias that
    `verify_costs.py --live` measures), the planner pricing by the table as recorded, or by the corrected
    one with `plan_on_truth`. `bounded` False: without the bound on what a request's drafts may lose
    (engine/loss_bound.py); `bound`: with that bound's share and start tokens instead of the shipped.
    `respelling`: the target's vocabulary's, so that renames carry to a name's other tokens and copies
    that open an answer's code are priced as live."""
    costs = {int(n): s for n, s in data["verify_s"].items()}
    truth = {**costs, 1: costs[1] * one_position}
    control = set(data["control"])
    copies = CopyDrafter(control.__contains__, OpeningDrafter(), respelling)
    drafting = Drafting(CostModel(dict(truth if plan_on_truth else costs)), [copies], learn_costs=False,
                        loss_bound=bounded)
    price = CostModel(dict(truth))
    speedups: dict[str, list[float]] = {}
    for item in data["answers"]:
        drafting.drafters = [copies]
        drafting.planner(item["prompt"], "ngram").finish(item["answer"])  # the plain run comes first, as in the bench
        if item.get("earlier"):  # the session's earlier requests, as the history drafter holds them in the bench
            history = HistoryDrafter(SuffixIndex())
            for text in item["earlier"]:
                history.index.add(text)
            history.recording = False
            drafting.drafters = [copies, history]
        planner = drafting.planner(item["prompt"], "auto", budget=data.get("max_tokens", 512))
        if bound is not None:
            planner.bound = LossBound(share=bound[0], start_tokens=bound[1])
        truth = truth_of(data, item)
        context, seconds = list(item["prompt"]), 0.0
        planner.remaining = lambda: len(truth) - (len(context) - len(item["prompt"]))  # (as its answer counts)
        while len(context) - len(item["prompt"]) < len(truth):
            at = len(context) - len(item["prompt"])
            draft = planner.draft(context, 10**6, None)
            kept = kept_of(draft.tokens, truth, at)
            nodes, kept_in_all = len(draft.tokens), kept
            if trees is not None:
                tree = grow(draft.tokens, context, free_positions(price, len(draft.tokens) + 1, trees) - 1)
                nodes, kept_in_all = len(tree), kept_on(tree, truth, at)
            cost = price.verify(nodes + 1)
            seconds += cost
            # The planner hears how its chain fared (as live: its pricing is of chains).
            planner.observe(draft, kept, cost, nodes + 1, truth[at + kept] if at + kept < len(truth) else None)
            context.extend(truth[at:at + kept_in_all + 1])
            if at + kept_in_all >= len(truth):
                break
        speedups.setdefault(item["suite"], []).append(len(truth) * price.verify(1) / seconds)
    return speedups


def report(label: str, data: dict, speedups: dict[str, list[float]], floor: float = 0.95) -> None:
    """Per suite and for all answers: the median with its interval, the worst prompt, how many fall
    below `floor`."""
    ids: dict[str, list[str]] = {}
    for item in data["answers"]:
        ids.setdefault(item["suite"], []).append(item["id"])
    groups = dict(speedups)
    groups["all"] = [v for values in speedups.values() for v in values]
    named = {suite: list(zip(ids[suite], values)) for suite, values in speedups.items()}
    named["all"] = [pair for pairs in named.values() for pair in pairs]
    for suite, values in groups.items():
        low, high = median_interval(values)
        worst_id, worst = min(named[suite], key=lambda pair: pair[1])
        below = sum(v < floor for v in values)
        print(f"{label:10} {suite:16} median {statistics.median(values):.3f}x ({low:.3f}-{high:.3f})  worst "
              f"{worst:.3f}x ({worst_id})  {below} of {len(values)} below {floor:.2f}x")


def oracle(data: dict, longest: int = 63, bound: tuple[float, float] | None = None) -> dict[str, list[float]]:
    """Speedup per answer, by suite, with perfect knowledge: at each position the copy lookup's proposal
    is kept as far as the recorded answer goes on with it, and the lengths drafted are the cheapest
    plan over the whole answer (a shortest path over positions, priced by the recorded verify costs).
    `bound` (share, start): the cheapest plan whose every round fits the loss bound's room, the most a
    copy planner obeying that bound could reach."""
    price = CostModel({int(n): s for n, s in data["verify_s"].items()})
    control = set(data["control"])
    speedups: dict[str, list[float]] = {}
    for item in data["answers"]:
        lookup = NgramDrafter(ends_copy=control.__contains__)
        lookup.reset(prompt_len=len(item["prompt"]))
        truth = truth_of(data, item)
        context, keepable = list(item["prompt"]), []
        for at in range(len(truth)):
            keepable.append(kept_of(lookup.propose(context, longest).tokens, truth, at))
            context.append(truth[at])
        best = hindsight(keepable, price) if bound is None else hindsight_within(keepable, price, *bound)
        speedups.setdefault(item["suite"], []).append(len(truth) * price.verify(1) / best)
    return speedups


# The age classes and lengths `age_bound` tries (288 choices, ~15 s a recording). Younger copies get
# few: with prompt copies 0-4 tokens old tried at up to 15 and answer copies 0-9 at up to 3, the best
# drafted neither on the edit, held-out and follow-up recordings at the AVX2 and AVX-512 tables checked.
BOUND_LENGTHS = {(True, 5): (0, 1, 2, 3, 5, 7, 11, 15), (True, 10): (1, 2, 3, 5, 7, 11, 15, 23, 31),
                 (True, 0): (0, 1), (False, 10): (0, 1, 3, 7)}
AGE_CLASS_NAMES = {(True, 0): "prompt 0-4", (True, 5): "prompt 5-9", (True, 10): "prompt 10+",
                   (False, 10): "answer 10+"}


def _fixed_lengths(data: dict, item: dict, lengths: dict[tuple[bool, int], int], price: CostModel) -> float:
    """One answer's speedup drafting copies of each (prompt copy, age class) at a fixed length."""
    lookup = NgramDrafter(ends_copy=set(data["control"]).__contains__)
    lookup.reset(prompt_len=len(item["prompt"]))
    truth = truth_of(data, item)
    context, seconds, at = list(item["prompt"]), 0.0, 0
    while at < len(truth):
        proposal, k = lookup.propose(context, 63), 0
        if proposal.tokens:
            copy = copy_of(proposal)
            age_class = 10 if copy.age >= 10 else 5 if copy.age >= 5 and copy.from_prompt else 0
            k = min(lengths.get((copy.from_prompt, age_class), 0), len(proposal.tokens))
            while k and k + 1 not in price.verify_s:
                k -= 1
        tokens = proposal.tokens[:k]
        kept = kept_of(tokens, truth, at)
        token = truth[at + kept] if at + kept < len(truth) else None
        seconds += price.verify(k + 1)
        if k:
            lookup.observe(Draft(tokens=tokens, source="ngram", evidence=proposal.evidence, note=proposal.note),
                           kept, token)
        context.extend(truth[at:at + kept + 1])
        at += kept + 1
    return len(truth) * price.verify(1) / seconds


def age_bound(data: dict) -> dict[str, tuple[dict, list[float]]]:
    """For each suite, the fixed lengths per copy age class (BOUND_LENGTHS) whose speedups have the best
    median over that suite's answers (then the best mean), with those speedups."""
    price = CostModel({int(n): s for n, s in data["verify_s"].items()})
    keys = list(BOUND_LENGTHS)
    best: dict[str, tuple[tuple[float, float], dict, list[float]]] = {}
    for choice in itertools.product(*(BOUND_LENGTHS[k] for k in keys)):
        lengths = dict(zip(keys, choice))
        by_suite: dict[str, list[float]] = {}
        for item in data["answers"]:
            by_suite.setdefault(item["suite"], []).append(_fixed_lengths(data, item, lengths, price))
        for suite, values in by_suite.items():
            score = (statistics.median(values), statistics.mean(values))
            if suite not in best or score > best[suite][0]:
                best[suite] = (score, lengths, values)
    return {suite: (lengths, values) for suite, (_score, lengths, values) in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="generate the plain answers and measure verify costs")
    rec.add_argument("entry")
    rec.add_argument("out")
    rec.add_argument("--suite", default="edit,code,creative")
    rec.add_argument("--max-tokens", type=int, default=128)
    rec.add_argument("--prompts", default=None, help="a YAML file of prompts instead of the bench's suites "
                     "(benchmarks/prompts/heldout_edit.yaml: edits the planner was not tuned on)")
    rec.add_argument("--sessions", default="", help="record these session kinds' second requests instead "
                     "(follow-up: the answer to a request that asks to change the first answer)")
    rec.add_argument("--sessions-file", default=None, help="with --sessions: a YAML file of sessions instead of "
                     "the bench's (benchmarks/prompts/heldout_followups.yaml: follow-ups the planner was not tuned on)")
    rec_draft = sub.add_parser("record-draft", help="add the pair's draft model's guesses to a recording")
    rec_draft.add_argument("entry")
    rec_draft.add_argument("recorded")
    rep = sub.add_parser("replay", help="replay the planner on recorded answers")
    rep.add_argument("recorded")
    rep.add_argument("--oracle", action="store_true", help="also print the perfect-knowledge bound")
    rep.add_argument("--age-bound", action="store_true", help="also print the best fixed draft length per copy "
                     "age class, chosen with hindsight: a yardstick for pricing copies by age")
    rep.add_argument("--unbounded", action="store_true", help="also replay the planner without the bound on "
                     "what a request's drafts may lose (engine/loss_bound.py)")
    rep.add_argument("--bound", action="append", default=[], metavar="SHARE:START",
                     help="also replay with this loss bound (engine/loss_bound.py) instead of the shipped one: "
                     "the share of plain's price of the tokens produced, and the start in plain tokens "
                     "(0.02:2.5); repeat to compare several; with --oracle, the oracle within it too")
    rep.add_argument("--each", action="store_true", help="also print every answer's figure")
    rep.add_argument("--report", action="store_true", help="per suite and for all answers: the median with a "
                     "90%% bootstrap interval, the worst prompt and how many fall below 0.95x")
    rep.add_argument("--gpu-table", action="store_true", help="price the bounds and the model drafts at a "
                     "GPU's shape of costs (replay_trees.GPU_SHAPE) instead of the recorded one")
    rep.add_argument("--model-drafts", type=float, nargs="?", const=0.0, default=None, metavar="RATIO",
                     help="also replay the draft model's chains and two-wide trees (after record-draft), its "
                     "token at RATIO of the target's (default: as recorded)")
    rep.add_argument("--bounds", action="store_true", help="also print the hindsight bound of each kind of "
                     "draft: copies, trees of lookups, and (after record-draft) the draft model's guesses")
    rep.add_argument("--trees", type=float, nargs="*", default=[], metavar="SLACK",
                     help="also replay candidate trees grown to the positions costing at most SLACK more "
                     "than each chain's (0.1: 10%%; benchmarks/replay_trees.py)")
    rep.add_argument("--one-position", type=float, default=None, metavar="RATIO",
                     help="also replay in a world where one position costs RATIO of the table's (live over table, "
                     "as verify_costs.py --live prints it), the planner pricing by the table as recorded and "
                     "by the corrected one")
    rep.add_argument("--vocab", default=None, metavar="GGUF", help="the recorded model's file: spell tokens "
                     "through its vocabulary as live, so that a rename carries to the name's other tokens "
                     "(engine/drafters/respelling.py) and a copy that opens an answer's code is priced as one "
                     "(engine/drafters/copies.py); without it, neither")
    rep.add_argument("--costs", default=None, help="price with the verify costs of another recording (a build "
                     "with other kernels: record once with each build's venv, replay each recording at both)")
    args = parser.parse_args()
    if args.command == "record":
        record(args.entry, args.out, args.suite.split(","), args.max_tokens, args.prompts,
               [k for k in args.sessions.split(",") if k], args.sessions_file)
        return
    if args.command == "record-draft":
        record_draft(args.entry, args.recorded)
        return
    with open(args.recorded, encoding="utf-8") as f:
        data = json.load(f)
    if args.costs:
        with open(args.costs, encoding="utf-8") as f:
            other = json.load(f)
        # a recording's table, or a bench result's (benchmarks/results/bench-*.json keeps it in milliseconds)
        data["verify_s"] = other.get("verify_s") or {n: ms / 1000 for n, ms in other["meta"]["verify_ms"].items()}
    vocab = VocabFile(Path(args.vocab)) if args.vocab else None
    run = functools.partial(replay, respelling=Respelling.of(vocab.vocab) if vocab else None)
    one = float(data["verify_s"]["1"])
    print("verify costs: " + "  ".join(f"{n}:{float(t) / one:.2f}x" for n, t in data["verify_s"].items()))
    runs = [("planner", run(data))] + ([("oracle", oracle(data))] if args.oracle else [])
    runs += [("oracle in bound", oracle(data, bound=(LOSS_SHARE, START_TOKENS)))] if args.oracle else []
    runs += [("unbounded", run(data, bounded=False))] if args.unbounded else []
    runs += [(f"tree+{slack:.0%}", run(data, slack)) for slack in args.trees]
    for setting in args.bound:
        share, start = (float(x) for x in setting.split(":"))
        runs.append((f"{share:.1%}+{start:g}", run(data, bound=(share, start))))
        runs += [(f"oracle in {share:.1%}+{start:g}", oracle(data, bound=(share, start)))] if args.oracle else []
    if args.one_position is not None:  # (the planner's own rounds: `planner` above is the recorded world)
        runs += [(f"one x{args.one_position:g}, table", run(data, one_position=args.one_position)),
                 (f"one x{args.one_position:g}, true", run(data, one_position=args.one_position,
                                                             plan_on_truth=True))]
    if args.report:
        for label, speedups in runs:
            report(label, data, speedups)
        runs = []
    for label, speedups in runs:
        for suite, values in speedups.items():
            print(f"{label:8} {suite:10} median {statistics.median(values):.3f}x  "
                  f"(min {min(values):.2f}, max {max(values):.2f}, mean {statistics.mean(values):.2f}, "
                  f"{len(values)} answers)" + (": " + " ".join(f"{v:.2f}" for v in values) if args.each else ""))
    if args.gpu_table:
        data["verify_s"] = {str(n): one * f for n, f in GPU_SHAPE.items()}
        print("GPU-shaped: " + "  ".join(f"{n}:{f:.2f}x" for n, f in GPU_SHAPE.items()))
    if args.bounds:
        for source, by_suite in bounds(data).items():
            for suite, values in by_suite.items():
                print(f"{'bound':8} {suite:10} median {statistics.median(values):.2f}x  (min {min(values):.2f}, "
                      f"max {max(values):.2f}; {source})" + (": " + " ".join(f"{v:.2f}" for v in values)
                                                            if args.each else ""))
    if args.model_drafts is not None and all("draft_guesses" in item for item in data["answers"]):
        for kind, by_suite in model_drafts(data, args.model_drafts or None).items():
            for suite, values in by_suite.items():
                print(f"{kind:11} {suite:10} median {statistics.median(values):.2f}x  (min {min(values):.2f}, "
                      f"max {max(values):.2f}; best length per answer)")
    if args.age_bound:
        for suite, (lengths, values) in age_bound(data).items():
            named = ", ".join(f"{AGE_CLASS_NAMES[key]} {k}" for key, k in lengths.items())
            print(f"{'by age':8} {suite:10} median {statistics.median(values):.2f}x  (min {min(values):.2f}, "
                  f"max {max(values):.2f}, mean {statistics.mean(values):.2f}; lengths {named})")


if __name__ == "__main__":
    main()

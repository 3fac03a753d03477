"""Candidate trees replayed on recorded greedy answers (`replay_planner.py replay --trees`).

Each round the planner drafts its chain as in `replay_planner.replay`; the tree adds branches where
the chain might break, up to the positions the recorded verify costs make nearly free (the staircase:
on a CPU, 12 or 16 positions can cost what 8 do), and keeps the longest branch the recorded answer goes
on with, for the price of verifying every node. The branches come from lookups only (no hindsight):
at each depth of the chain, the continuations of the context's other matches (the text's ending, with
the chain's tokens so far, found earlier with another next token), the longest matches and the latest
first. The planner is told how its own chain fared, as it is live, so its pricing is today's.

`bound` also replays with hindsight over those same branches: each round keeps whatever branch goes
furthest, with the tree's positions chosen per round as cheaply as the answer allows — what better
pricing of the same trees could reach.
"""

from __future__ import annotations

from localspec.engine.adaptive import CostModel
from localspec.engine.tree import DraftTree

MAX_MATCH = 6   # longest text ending searched for another match
MIN_MATCH = 2   # a one-token match elsewhere is a guess, not a copy
BRANCH_LEN = 6  # tokens of another match's continuation a branch holds


def other_matches(text: list[int], exclude: int | None, longest: int = BRANCH_LEN) -> list[list[int]]:
    """Continuations of earlier occurrences of `text`'s ending whose first token is not `exclude`: one per
    distinct first token, longest match first, then latest."""
    n = len(text)
    found: dict[int, list[int]] = {}
    for length in range(min(MAX_MATCH, n - 1), MIN_MATCH - 1, -1):
        tail = text[n - length:]
        for end in range(n - 2, length - 2, -1):  # `end`: the match's last token, before the text's own
            if text[end] == tail[-1] and text[end - length + 1:end + 1] == tail:
                first = text[end + 1]
                if first != exclude and first not in found:
                    found[first] = text[end + 1:end + 1 + longest]
    return list(found.values())


def grow(chain: list[int], context: list[int], nodes: int) -> DraftTree:
    """The chain, then other matches' continuations at each of its depths (shallowest first), within
    `nodes` nodes in all."""
    branches = [chain]
    used = len(chain)
    for depth in range(len(chain) + 1):
        if used >= nodes:
            break
        prefix = chain[:depth]
        for continuation in other_matches(context + prefix, chain[depth] if depth < len(chain) else None):
            room = nodes - used
            if room <= 0:
                break
            branches.append(prefix + continuation[:room])
            used += min(len(continuation), room)
    return DraftTree.of_branches(branches)


def truth_of(data: dict, item: dict) -> list[int]:
    """The recorded answer, with its end-of-generation token where it ended by itself."""
    return item["answer"] + ([data["eos"]] if item["ended"] else [])


def kept_of(tokens: list[int], truth: list[int], at: int) -> int:
    """How many of `tokens`, drafted at answer position `at`, the recorded answer goes on with."""
    n = 0
    while n < len(tokens) and at + n < len(truth) and tokens[n] == truth[at + n]:
        n += 1
    return n


def kept_on(tree: DraftTree, truth: list[int], at: int) -> int:
    """How many tokens the recorded answer keeps of the tree's best branch, drafted at position `at`."""
    return max((kept_of(branch, truth, at) for branch in tree.branches()), default=0)


def keepable_by_source(data: dict, item: dict, truth: list[int], longest: int = 63) -> dict[str, list[int]]:
    """At each answer position, how many tokens each kind of draft could have had kept (hindsight over
    which to verify): the copy (the lookup's proposal), the copy or another match's continuation (the
    lookup tree), the draft model's own chain, and the copy with the draft model's guess where the copy
    breaks, resumed after it as a replacement or an insertion. Needs `record-draft`'s guesses."""
    from localspec.engine.drafters import NgramDrafter

    guesses = item.get("draft_guesses")
    lookup = NgramDrafter(ends_copy=set(data["control"]).__contains__)
    lookup.reset(prompt_len=len(item["prompt"]))
    context = list(item["prompt"])
    out: dict[str, list[int]] = {"copy": [], "lookup tree": [], "model": [], "copy+model": []}
    for at in range(len(truth)):
        copy = lookup.propose(context, longest).tokens
        copied = kept_of(copy, truth, at)
        out["copy"].append(copied)
        out["lookup tree"].append(kept_on(grow(copy, context, longest), truth, at))
        if guesses is not None:
            model = 0
            while at + model < len(truth) and model < longest and guesses[at + model][0] == truth[at + model]:
                model += 1
            out["model"].append(model)
            best = copied
            if copied < len(copy) and at + copied < len(truth) and truth[at + copied] in guesses[at + copied]:
                for resumed in (copy[copied + 1:], copy[copied:]):  # the guess replaced a token, or came in before it
                    best = max(best, copied + 1 + kept_of(resumed, truth, at + copied + 1))
            out["copy+model"].append(max(best, model))
        context.append(truth[at])
    return out


def hindsight(keepable: list[int], price: CostModel) -> float:
    """The least time to produce the answer when each round drafts exactly what will be kept, up to
    `keepable[i]` tokens at position i (a shortest path over positions, at the calibrated sizes)."""
    n = len(keepable)
    best = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i] = min(price.verify(k + 1) + best[min(n, i + k + 1)] for k in range(keepable[i] + 1)
                      if k == 0 or k + 1 in price.verify_s)
    return best[0]


def hindsight_within(keepable: list[int], price: CostModel, share: float, start: float) -> float:
    """`hindsight` for a planner that obeys the loss bound (engine/loss_bound.py) with `share` and
    `start`: a round drafts k tokens only if verifying them, were none kept, would lose no more than the
    room left. Every round of the oracle keeps all it drafts, so the room after i tokens in time T is
    start + share * i - (T / one - i): the fastest way to a position also leaves the most room there,
    and a forward pass over positions is exact."""
    n, one = len(keepable), price.verify(1)
    best = [0.0] + [float("inf")] * n
    for i in range(n):
        room = (start + share * i - (best[i] / one - i)) * one
        for k in range(keepable[i] + 1):
            if k and (k + 1 not in price.verify_s or price.verify(k + 1) - one > room):
                continue
            j = min(n, i + k + 1)
            best[j] = min(best[j], best[i] + price.verify(k + 1))
    return best[n]


def bounds(data: dict) -> dict[str, dict[str, list[float]]]:
    """Per source (`keepable_by_source`), the hindsight speedup of each answer, by suite (drafting costs
    nothing here: the draft model's time is left out, so its rows are a ceiling)."""
    price = CostModel({int(n): s for n, s in data["verify_s"].items()})
    result: dict[str, dict[str, list[float]]] = {}
    for item in data["answers"]:
        truth = truth_of(data, item)
        for source, keepable in keepable_by_source(data, item, truth).items():
            if keepable:
                plain = len(truth) * price.verify(1)
                result.setdefault(source, {}).setdefault(item["suite"], []).append(plain / hindsight(keepable, price))
    return result


# A GPU's verify costs: every position up to 32 nearly free, then linear (the shape the issue describes
# for a discrete GPU; `--gpu-table` replays at it, scaled to the recording's one-token cost).
GPU_SHAPE = {1: 1.0, 2: 1.01, 3: 1.02, 4: 1.03, 6: 1.04, 8: 1.05, 12: 1.08, 16: 1.1, 24: 1.15, 32: 1.2, 48: 1.8,
             64: 2.4}


def model_drafts(data: dict, draft_ratio: float | None = None) -> dict[str, dict[str, list[float]]]:
    """The draft model's chains against trees of its two likeliest tokens, drafted at every length 1-15
    for a whole answer (the best fixed length per answer: hindsight over one number only) and priced
    with the draft model's one-token time per drafted depth (`draft_ratio` of the target's one-token
    cost, else the recorded `draft_s`). The chain keeps its guesses while they are the answer's; the
    tree adds, at each depth, the runner-up as a leaf beside the chain's token, so a round whose chain
    breaks where the runner-up is right keeps one more token, for a verify of twice the nodes."""
    price = CostModel({int(n): s for n, s in data["verify_s"].items()})
    one = price.verify(1)
    draft_s = one * draft_ratio if draft_ratio is not None else data["draft_s"]
    result: dict[str, dict[str, list[float]]] = {"model chain": {}, "model tree": {}}
    for item in data["answers"]:
        truth = truth_of(data, item)
        guesses = item["draft_guesses"]
        for kind, width in (("model chain", 1), ("model tree", 2)):
            best = 0.0
            for k in range(1, 16):
                at, seconds = 0, 0.0
                while at < len(truth):
                    depth = 0
                    while depth < k and at + depth < len(truth) and guesses[at + depth][0] == truth[at + depth]:
                        depth += 1
                    leaf = width == 2 and depth < k and at + depth < len(truth) and guesses[at + depth][1] == truth[at + depth]
                    seconds += k * draft_s + price.verify(width * k + 1)
                    at += depth + leaf + 1
                best = max(best, len(truth) * one / seconds)
            result[kind].setdefault(item["suite"], []).append(best)
    return result

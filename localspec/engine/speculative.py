"""The speculative round: draft -> verify in one batch -> accept/reject -> roll back -> repeat (the
draft and its length are the planner's: engine/planner.py).

Invariant between rounds: the target's KV cache holds every token of `context` except the last one,
which is *pending*. A round evaluates [pending] + draft in one batch with logits at every position:
row i is the target's distribution after the first i draft tokens, so k draft tokens yield k + 1
rows, the last one giving the bonus token after a full accept. Rejected positions are removed with
one KV truncation; the target's own token becomes the next pending token.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from localspec.engine.adaptive import CostModel
from localspec.engine.constraint import Constraint
from localspec.engine.drafters import Draft
from localspec.engine.events import TokenLogprob
from localspec.engine.kv import KvSequence, extend_together
from localspec.engine.sampling import Sampler, accept_greedy, accept_replayed, accept_sampled, token_logprob
from localspec.engine.tree import DraftTree, accept_greedy_tree, accept_sampled_tree

if TYPE_CHECKING:
    from localspec.engine.planner import Planner

# A verify of at most this many positions runs llama.cpp's one-token kernels on CPUs, so its rows are
# bit-identical to plain decoding's; from 4 rows the repacked K-quant gemm sums in another order and a
# Q4_K_M file's log-probabilities move by a few hundredths. A request that asks
# for log-probabilities drafts within it, so the numbers it gets are plain decoding's.
EXACT_VERIFY_POSITIONS = 3


@dataclass
class Step:
    """The token-level outcome of one round."""

    draft: Draft
    accepted: int
    token: int
    verify_s: float
    shared: int = 0  # other sequences evaluated in the same decode (requests decoded together)
    logprobs: tuple[TokenLogprob, ...] = ()  # the kept tokens' (accepted draft, then the target's), if asked for
    candidates: int = 0  # a candidate tree's nodes, where the round verified one (`draft` is the branch kept)
    took_second: bool = False  # the kept path left the chain for a second candidate

    @property
    def kind(self) -> str:
        if not self.draft.tokens:
            return "plain"
        return "bonus" if self.accepted == len(self.draft.tokens) else "correction"


def speculative_round(target: KvSequence, context: list[int], planner: "Planner", sampler: Sampler,
                      constraint: Constraint | None = None) -> Step | None:
    """One draft/verify round of one sequence: `context` (its tokens, the pending one last) grows in place
    by what the round keeps, and the same invariant holds after; None when the context is full. With a
    `constraint` every token follows its grammar (engine/constraint.py), advanced by the kept tokens."""
    room = draft_room(target, sampler)
    if room < 0:
        return None
    proposal = propose(context, room, planner, sampler, constraint)
    try:
        return verify(target, context, proposal, planner, sampler, constraint, room)
    finally:
        proposal.close()


def draft_room(target: KvSequence, sampler: Sampler) -> int:
    """Draft tokens a round of this sequence may verify after its pending one (-1: its context is full)."""
    room = target.draft_room()
    if sampler.settings.logprobs is not None:
        room = min(room, EXACT_VERIFY_POSITIONS - 1)
    return room


def verify(target: KvSequence, context: list[int], proposal: "Proposal", planner: "Planner", sampler: Sampler,
           constraint: Constraint | None, room: int) -> Step:
    """A sequence's proposal verified in a decode of its own and settled: its candidate tree where it has
    one worth verifying, else the pending token and its chain, padded to the shape held; the planner
    learns the round's cost (the decode was this sequence's alone) and its drafter what was kept."""
    tree = proposal.draft.tree
    if tree is not None and constraint is None and sampler.settings.logprobs is None and tree_fits(tree, room):
        step, chain_kept = tree_round(target, context, proposal.draft, tree, sampler)
        planner.observe(proposal.draft, chain_kept, step.verify_s, 1 + len(tree), step.token)
        return step
    batch = padded(proposal.batch(context), planner.cost, room)
    t0 = time.perf_counter()
    logits = extend_together([(target, batch, len(batch))])[0]
    step = settle(target, context, proposal, logits, sampler, time.perf_counter() - t0, constraint)
    planner.observe(proposal.draft, step.accepted, step.verify_s, len(batch), step.token)
    return step


def padded(batch: list[int], cost: CostModel, room: int) -> list[int]:
    """The verify batch padded up to the shape held where that is cheaper than changing it
    (`CostModel.shape_for`; never on a CPU): the pad repeats the last token, after every row that is
    read, so no read row sees it, and the rollback after the round drops it with the rejected draft."""
    size = cost.shape_for(len(batch))
    if size <= len(batch) or size - 1 > room:
        return batch
    return batch + [batch[-1]] * (size - len(batch))


@dataclass
class Proposal:
    """A round's draft as it will be verified: cut where the grammar forbids it, the grammar's state
    before each verify row (None: free text), and the draft's distribution at the cut."""

    draft: Draft
    rows: list[Constraint | None]
    q_next: np.ndarray | None = None

    @staticmethod
    def plain(constraint: Constraint | None = None) -> "Proposal":
        return Proposal(Draft.empty(), [constraint])

    def batch(self, context: list[int]) -> list[int]:
        """What the verify evaluates: the pending token and the draft."""
        return [context[-1], *self.draft.tokens]

    def close(self) -> None:
        for row in self.rows[1:]:
            if row is not None:
                row.close()


def propose(context: list[int], room: int, planner: "Planner", sampler: Sampler,
            constraint: Constraint | None = None) -> Proposal:
    """The planner's draft after `context` (at most `room` tokens), within the grammar."""
    draft = planner.draft(context, room, sampler, constraint)
    return proposal_of(draft, constraint)


def proposal_of(draft: Draft, constraint: Constraint | None = None) -> Proposal:
    """A draft as it will be verified: cut before the first token the grammar forbids."""
    if constraint is None:
        return Proposal(draft, [None] * (len(draft.tokens) + 1))
    return Proposal(*within_grammar(draft, constraint))


def settle(target: KvSequence, context: list[int], proposal: Proposal, logits: np.ndarray, sampler: Sampler,
           verify_s: float, constraint: Constraint | None = None, shared: int = 0) -> Step:
    """A verified proposal (`logits`: one row per position of `proposal.batch`): the longest acceptable
    draft prefix and the target's next token. `context`, the KV cache and the grammar keep what was
    accepted."""
    draft = proposal.draft
    accepted, token = decide(logits, context, draft, sampler, proposal.rows, proposal.q_next)
    kept = [*draft.tokens[:accepted], token]
    top = sampler.settings.logprobs
    # Row i is the target's distribution before kept token i, drafted or not: the same row plain
    # decoding would have had, so the log-probabilities are plain decoding's.
    logprobs = () if top is None else tuple(token_logprob(logits[i], t, top) for i, t in enumerate(kept))
    target.rewind(len(context) + accepted)  # keep pending + accepted draft tokens
    context.extend(draft.tokens[:accepted])
    context.append(token)
    if constraint is not None:
        for t in kept:
            constraint.accept(t)
    return Step(draft=draft, accepted=accepted, token=token, verify_s=verify_s, shared=shared, logprobs=logprobs)


def tree_fits(tree: DraftTree, room: int) -> bool:
    """Whether a candidate tree is worth verifying as one (more than a chain) and its deepest node fits."""
    return not tree.is_chain() and max(tree.depth(n) for n in range(len(tree))) <= room


def tree_round(target: KvSequence, context: list[int], draft: Draft, tree: DraftTree,
               sampler: Sampler) -> tuple[Step, int]:
    """A round that verifies a candidate tree (engine/tree.py) instead of the draft's chain: the step,
    whose draft is the branch the target followed, and how many of the chain's own tokens were kept (what
    its drafter's acceptance learns from). Free text only: no grammar, no log-probabilities."""
    pending = context[-1]
    t0 = time.perf_counter()
    logits, placement = target.verify_tree(pending, tree)
    verify_s = time.perf_counter() - t0
    tail = sampler.penalty_tail(context)
    if sampler.greedy:
        path, token = accept_greedy_tree(tree, lambda row, drafted: sampler.argmax(logits[row], tail + drafted))
    else:
        path, token = accept_sampled_tree(tree, lambda row, drafted: sampler.probs(logits[row], tail + drafted),
                                          sampler.uniform, sampler.draw)
    target.keep_path(pending, tree, placement, path)
    kept = [tree.tokens[n] for n in path]
    context.extend(kept)
    context.append(token)
    # the chain's tokens are the tree's first nodes (tree.with_alternates): kept while the path is them
    chain_kept = next((i for i, n in enumerate(path) if n != i or i >= len(draft.tokens)), len(path))
    followed = dataclasses.replace(draft, tokens=tree.branch_through(path[-1]) if path else draft.tokens)
    return Step(draft=followed, accepted=len(path), token=token, verify_s=verify_s, candidates=len(tree),
                took_second=chain_kept < len(path)), chain_kept


def within_grammar(draft: Draft, constraint: Constraint) -> tuple[Draft, list[Constraint | None], np.ndarray | None]:
    """The draft cut before its first token the grammar forbids (free: it could only be rejected), the
    grammar's state before each verify row (the first is `constraint` itself), and the draft's
    distribution at the cut, if it has one (`accept_sampled`'s q_next)."""
    rows: list[Constraint | None] = [constraint]
    for i, token in enumerate(draft.tokens):
        state = rows[-1]
        assert state is not None
        if not state.allows([token])[0]:
            q_next = draft.q[i] if draft.q is not None else None
            cut = dataclasses.replace(draft, tokens=draft.tokens[:i], q=draft.q[:i] if draft.q is not None else None)
            return cut, rows, q_next
        nxt = state.fork()
        nxt.accept(token)
        rows.append(nxt)
    return draft, rows, None


def decide(logits: np.ndarray, context: list[int], draft: Draft, sampler: Sampler, rows: list[Constraint | None],
           q_next: np.ndarray | None = None) -> tuple[int, int]:
    """From the verify rows (one per draft token, plus one): how many draft tokens are accepted, and
    the target's next token. With no draft, a plain round's token."""
    tail = sampler.penalty_tail(context)
    if sampler.greedy:
        choices = _LazyChoices(lambda i: sampler.argmax(logits[i], tail + draft.tokens[:i], rows[i]))
        if draft.exact and sampler.settings.replayable:
            accepted, token = accept_replayed(draft.tokens, choices,
                                              lambda i, t: float(logits[i].max() - logits[i][t]))
        else:
            accepted, token = accept_greedy(draft.tokens, choices)
    else:
        p = np.stack([sampler.probs(logits[i], tail + draft.tokens[:i], rows[i])
                      for i in range(len(draft.tokens) + 1)])
        accepted, token = accept_sampled(draft.tokens, p, draft.q, sampler.uniform, sampler.draw, q_next)
    return accepted, token


class _LazyChoices:
    """The target's choice at row i, computed only if the acceptance check gets that far."""

    def __init__(self, choose):
        self._choose = choose

    def __getitem__(self, i: int) -> int:
        return self._choose(i)

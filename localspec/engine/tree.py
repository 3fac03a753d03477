"""Candidate trees: several continuations verified in one batch, and the rules that keep one path.

A tree's nodes follow the pending token: node i is `tokens[i]`, a child of `parents[i]` (-1: of the
pending token). Verified in one batch, row 0 is the target's distribution after the pending token and
row i + 1 its distribution after node i's path, each node attending only to its own ancestors. The
target keeps the longest path it agrees with, then adds its own token, so a tree's round keeps what the
best of its branches would have kept as a chain, for the price of one verify of all its nodes.

The acceptance rules walk down from the pending token:
- greedy (`accept_greedy_tree`): the target's choice at the current node, if a child holds it, is kept
  and the walk goes on from that child; otherwise the choice is the round's own token.
- sampled (`accept_sampled_tree`): the children of the current node are tried in turn (SpecInfer's
  multi-candidate rule, Miao et al. 2024; without replacement as Sequoia, Chen et al. 2024): child x,
  drawn from its draft's distribution q (None: a lookup's token, q one-hot on it), is kept with
  min(1, r(x)/q(x)), where r starts as the target's distribution; each rejection leaves
  r = normalize(max(0, r - q)). If every child is rejected, the round's token is drawn from r. Each step
  is one speculative-sampling step on the residual, so the token kept at every depth is distributed as
  the target's (tests/test_tree.py measures it). A model's sample stays a candidate of its own even
  where a sibling holds the same token: each candidate must be drawn from its q whatever the others
  are, and a sample folded into a copy's node would be drawn from q short of that token. Lookups'
  tokens (one-hot) may share a node: a second try of a rejected token is rejected for certain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

ROOT = -1  # the pending token, as a parent


@dataclass(frozen=True)
class DraftTree:
    """Nodes after the pending token: token, parent and (for a model's sample) its draft distribution."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    q: tuple[np.ndarray | None, ...] = ()  # per node; empty: every node is a lookup's (one-hot)

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.tokens) or (self.q and len(self.q) != len(self.tokens)):
            raise ValueError("a tree needs one parent (and one q, if any) per token")
        if any(not ROOT <= p < i for i, p in enumerate(self.parents)):
            raise ValueError("a node's parent must come before it")

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def of_branches(branches: Sequence[Sequence[int]]) -> "DraftTree":
        """The branches merged where they share a prefix (a trie), in the order given: the first
        branch's nodes first, so a chain is a tree whose node i is its token i."""
        tokens: list[int] = []
        parents: list[int] = []
        child: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for branch in branches:
            at = ROOT
            for token in branch:
                node = child.get((at, token))
                if node is None:
                    node = child[(at, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(at)
                at = node
        return DraftTree(tuple(tokens), tuple(parents))

    def children(self, node: int) -> list[int]:
        """The nodes after `node` (ROOT: after the pending token), in tree order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def depth(self, node: int) -> int:
        """How many nodes its path holds (a child of the pending token: 1)."""
        depth = 0
        while node != ROOT:
            node, depth = self.parents[node], depth + 1
        return depth

    def path(self, node: int) -> list[int]:
        """The nodes from the pending token's child down to `node`."""
        nodes = []
        while node != ROOT:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def ancestors(self, node: int) -> list[int]:
        """`path(node)` without `node`: what the node attends to besides the context."""
        return self.path(node)[:-1]

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def branches(self) -> list[list[int]]:
        """Every root-to-leaf path's tokens."""
        leaves = set(range(len(self))) - set(self.parents)
        return [[self.tokens[n] for n in self.path(leaf)] for leaf in sorted(leaves)]


def row(node: int) -> int:
    """The verify row of the target's distribution after `node` (ROOT: after the pending token)."""
    return node + 1


def accept_greedy_tree(tree: DraftTree, choice: Callable[[int, list[int]], int]) -> tuple[list[int], int]:
    """The kept path (node indexes) and the target's token after it. `choice(row, path_tokens)`: the
    target's greedy token at that verify row, whose context ends with those drafted tokens."""
    path: list[int] = []
    node = ROOT
    while True:
        token = choice(row(node), [tree.tokens[n] for n in path])
        kept = next((c for c in tree.children(node) if tree.tokens[c] == token), None)
        if kept is None:
            return path, token
        path.append(kept)
        node = kept


def accept_sampled_tree(tree: DraftTree, probs: Callable[[int, list[int]], np.ndarray], uniform: Callable[[], float],
                        draw: Callable[[np.ndarray], int]) -> tuple[list[int], int]:
    """The kept path and the token after it, by the multi-candidate rule (module docstring).
    `probs(row, path_tokens)`: the target's distribution at that row."""
    path: list[int] = []
    node = ROOT
    while True:
        residual = np.asarray(probs(row(node), [tree.tokens[n] for n in path]), dtype=np.float64)
        kept = None
        for candidate in tree.children(node):
            token = tree.tokens[candidate]
            q = tree.q[candidate] if tree.q else None
            total = residual.sum()
            if total <= 0.0:
                break
            r = residual / total
            q_x = 1.0 if q is None else float(q[token])
            if q_x > 0 and uniform() < min(1.0, float(r[token]) / q_x):
                kept = candidate
                break
            if q is None:
                residual = r.copy()
                residual[token] = 0.0
            else:
                residual = np.maximum(r - q, 0.0)
        if kept is None:
            if residual.sum() <= 0.0:  # (rounding: every candidate took all the mass)
                residual = np.asarray(probs(row(node), [tree.tokens[n] for n in path]), dtype=np.float64)
            return path, draw(residual / residual.sum())
        path.append(kept)
        node = kept

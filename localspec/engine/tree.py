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

    def branch_through(self, node: int) -> list[int]:
        """The tokens of the first branch through `node`: its path, then first children to a leaf."""
        nodes = self.path(node)
        while kids := self.children(nodes[-1]):
            nodes.append(kids[0])
        return [self.tokens[n] for n in nodes]

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


def with_alternates(chain: Sequence[int], alternates: Sequence[int | None],
                    q: np.ndarray | None = None) -> DraftTree:
    """A chain with a second candidate beside some of its tokens: `alternates[d]` (None: none) is a leaf
    beside `chain[d]`, a child of the same parent; `alternates` may be one longer than the chain, a leaf
    after its last token (where the drafter stopped). `q` (sampling): the draft's distribution at each
    depth, shared by a depth's two candidates (each drawn from it on its own)."""
    if len(alternates) > len(chain) + 1:
        raise ValueError("at most one alternate per depth, and one after the chain")
    tokens, parents = list(chain), [i - 1 for i in range(len(chain))]
    depths = list(range(len(chain)))
    for depth, token in enumerate(alternates):
        if token is not None:
            tokens.append(token)
            parents.append(depth - 1)
            depths.append(depth)
    rows = () if q is None else tuple(q[d] for d in depths)
    return DraftTree(tuple(tokens), tuple(parents), rows)


@dataclass(frozen=True)
class Placement:
    """A tree laid out in a KV cache: the branch ending at each leaf is one sequence, `main` the first
    branch's (the first child at every node, so a chain's own), the others spare ones; a node is held
    by every sequence whose branch goes through it, so it attends to its own ancestors and the context
    only (llama.cpp masks a cell from a token unless they share a sequence)."""

    holders: tuple[tuple[int, ...], ...]  # per node: the sequences that hold it
    sequences: tuple[int, ...]            # every sequence used, main first (all hold the pending token)

    def keeper(self, path: Sequence[int], main: int) -> int:
        """The sequence that holds the whole kept path: main where it can."""
        if not path or main in self.holders[path[-1]]:
            return main
        return self.holders[path[-1]][0]


def place(tree: DraftTree, main: int, spares: Sequence[int]) -> Placement:
    """`tree`'s branches on `main` and as many of `spares` as it needs (one per leaf but the first)."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    first_leaf, node = None, ROOT
    while children.get(node):
        node = first_leaf = children[node][0]
    leaves = [n for n in range(len(tree)) if n not in children]
    others = [n for n in leaves if n != first_leaf]
    if len(others) > len(spares):
        raise ValueError(f"a tree of {len(leaves)} branches needs {len(others)} spare sequences; {len(spares)} given")
    seq_of: dict[int, int] = dict(zip(others, spares))
    if first_leaf is not None:
        seq_of[first_leaf] = main
    holders: list[list[int]] = [[] for _ in range(len(tree))]
    for leaf in sorted(seq_of, key=lambda n: (seq_of[n] != main, n)):
        for n in tree.path(leaf):
            holders[n].append(seq_of[leaf])
    return Placement(tuple(tuple(h) for h in holders), (main, *(seq_of[n] for n in others)))

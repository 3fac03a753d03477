"""Constrained decoding: a grammar decides which tokens may come next, and the target chooses among them.

A `Constraint` is a grammar's state after the tokens accepted so far (llama.cpp's GBNF grammar sampler,
`engine.backend.grammar`; the tests' DFA on the toy model). The speculative loop keeps one per request
and, each round, a fork of it per verify row: the state after the draft prefix that row follows. A
draft token the grammar forbids ends the draft before it is verified (it would be rejected anyway), and
the state advances only by the tokens the round keeps, so rejected drafts need no rollback.

Asking a grammar about every token of a large vocabulary costs a large share of a decode, so each row asks only about the tokens its sampling reads: greedy, the
highest-scoring ones until one is allowed; top-k sampling, the highest until k are allowed; only
otherwise the whole vocabulary. The result is exactly the masked distribution either way.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from localspec.errors import LocalspecError

FIRST_LOOK = 64  # candidates asked about first, in order of score


class Constraint(Protocol):
    def allows(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """For each token, whether it may come next (a bool array)."""
        ...

    def accept(self, token: int) -> None:
        """Advance by a token `allows` said may come next."""
        ...

    def fork(self) -> "Constraint":
        """An independent copy of this state."""
        ...

    def close(self) -> None: ...


# Each live alternative of a grammar is a stack llama.cpp advances on every token: under an alternation
# whose members share a prefix a token costs about n², all of it
# on the engine's thread while every other request waits. The limit keeps a token's grammar work near a
# decode step's time; real schemas stay far below (a country list is 250).
MAX_ALTERNATIVES = 3000


def alternatives(gbnf: str) -> int:
    """The alternatives (`|`) of a GBNF grammar, outside its literals, character classes and comments."""
    count, i, n = 0, 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        elif c == "#":
            while i < n and gbnf[i] != "\n":
                i += 1
        elif c == "|":
            count += 1
        i += 1
    return count


def check_size(gbnf: str, what: str = "The grammar") -> None:
    """A clear refusal for a grammar that would hold the engine for long on every token."""
    found = alternatives(gbnf)
    if found > MAX_ALTERNATIVES:
        raise LocalspecError(f"{what} has {found} alternatives (enum members, anyOf branches, '|'); at most "
                             f"{MAX_ALTERNATIVES} are accepted: each is followed token by token on the engine that "
                             "every request shares.")


class Pieces(Protocol):
    """What finding a trigger token asks of a vocabulary (engine/model.py's Vocabulary has it)."""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def token_bytes(self, token: int) -> bytes: ...


def trigger_token(vocab: Pieces, text: str) -> int | None:
    """The one token whose text is exactly `text` (a lazy grammar's trigger), or None when `text` is
    several tokens here."""
    ids = vocab.tokenize(text, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 and vocab.token_bytes(ids[0]) == text.encode() else None


# The m best logits lie within a few logits of the best one (m = 40 on the default target: 14 below it at
# the median, 23 at most, over 60 positions of code and prose), so only the ids above the best minus the
# first of these margins that lets m through are partitioned, not the whole vocabulary (a partition
# over a 150k-token vocabulary would be paid by every sampled token). Exact: whatever passes holds at
# least m tokens, so the m best are among them.
TOP_MARGINS = (8.0, 12.0, 16.0, 24.0, 32.0)


def top_ids(logits: np.ndarray, m: int) -> np.ndarray:
    """The m highest-scoring token ids, best first."""
    n = len(logits)
    if m >= n:
        return np.argsort(-logits, kind="stable")
    candidates = None
    best = float(np.max(logits))
    for margin in TOP_MARGINS:
        above = (logits >= best - margin).nonzero()[0]
        if len(above) >= m:
            candidates = above
            break
    if candidates is None:
        candidates = np.arange(n)
    if len(candidates) > m:
        candidates = candidates[np.argpartition(-logits[candidates], m - 1)[:m]]
    return candidates[np.argsort(-logits[candidates], kind="stable")]


def masked(logits: np.ndarray, constraint: Constraint) -> np.ndarray:
    """`logits` with -inf wherever the constraint forbids the token (asks about every token)."""
    allowed = constraint.allows(np.arange(len(logits)))
    if not allowed.any():
        raise LocalspecError("The grammar allows no token here (not even the end of the text).")
    return np.where(allowed, logits, -np.inf).astype(logits.dtype, copy=False)


def best_allowed(logits: np.ndarray, constraint: Constraint) -> int:
    """The highest-scoring token the constraint allows (greedy decoding under a grammar)."""
    top = top_ids(logits, FIRST_LOOK)
    ok = constraint.allows(top)
    if ok.any():
        return int(top[int(np.argmax(ok))])
    return int(np.argmax(masked(logits, constraint)))


def top_k_allowed(logits: np.ndarray, constraint: Constraint, k: int) -> np.ndarray:
    """`logits` as top-k sampling under the constraint reads them: the k highest-scoring allowed tokens
    keep their scores, every other token is -inf. With k <= 0 (no top-k), every allowed token."""
    n = len(logits)
    if 0 < k < n:
        top = top_ids(logits, min(n, max(FIRST_LOOK, 4 * k)))
        keep = top[constraint.allows(top)][:k]
        if len(keep) == k:
            out = np.full_like(logits, -np.inf)
            out[keep] = logits[keep]
            return out
    return masked(logits, constraint)

"""The tokens held in one model's KV cache, kept in step with the cache itself.

Works with any model object that has `decode(tokens, start, logits_for)`, `truncate(n)` and `n_ctx`
(the llama.cpp `backend.Model`, or the numpy toy model of the tests).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from localspec.engine.model import LanguageModel
from localspec.engine.tree import DraftTree, Placement, place


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KvSequence:
    """One sequence (slot) of a model's KV cache."""

    def __init__(self, model: LanguageModel, seq: int = 0):
        self.model = model
        self.seq = seq
        self.tokens: list[int] = []
        self.evaluated = 0  # positions run through the model, over this object's life
        self.last_used = -1  # when a request last used it (the engine's request counter)
        self.busy = False    # a request is generating on it now

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def room(self) -> int:
        return self.model.n_ctx - len(self.tokens)

    def draft_room(self) -> int:
        """Draft tokens a verify may add after the pending one: what fits the context, and what a
        recurrent state can take back if all are rejected."""
        room = self.room() - 1
        limit = self.model.max_rollback
        return room if limit is None else min(room, limit)

    def rewind(self, n_keep: int) -> None:
        if n_keep < len(self.tokens):
            held = self.model.truncate(n_keep, seq=self.seq)
            replay = self.tokens[held:n_keep]  # a recurrent state that could not go back is rebuilt
            del self.tokens[held:]
            if replay:
                self.extend(replay)

    def extend(self, tokens: Sequence[int], logits_for: Sequence[int] = ()) -> np.ndarray:
        try:
            logits = self.model.decode(list(tokens), len(self.tokens), list(logits_for), seq=self.seq)
        except BaseException:
            self.drop_unrecorded()
            raise
        self.tokens.extend(tokens)
        self.evaluated += len(tokens)
        return logits

    def verify_tree(self, pending: int, tree: DraftTree) -> tuple[np.ndarray, Placement]:
        """The pending token and a candidate tree in one evaluation, each node after its own ancestors
        (its branches in spare sequences of the model): the logits after the pending token and after
        every node, (1 + len(tree), n_vocab). `keep_path` then keeps one path and drops the rest."""
        placement = place(tree, self.seq, self.model.spare_seqs)
        start = len(self.tokens)
        positions = [start, *(start + tree.depth(n) for n in range(len(tree)))]
        self.model.fork(self.seq, placement.sequences[1:])
        try:
            logits = self.model.decode_placed([pending, *tree.tokens], positions,
                                              [placement.sequences, *placement.holders])
        except BaseException:
            self.model.settle_branches(self.seq, self.seq, placement.sequences[1:], start, start)
            raise
        self.evaluated += 1 + len(tree)
        return logits, placement

    def keep_path(self, pending: int, tree: DraftTree, placement: Placement, path: Sequence[int]) -> None:
        """After `verify_tree`: hold the pending token and the nodes of `path`, nothing else of the tree."""
        start = len(self.tokens)
        keeper = placement.keeper(path, self.seq)
        self.model.settle_branches(self.seq, keeper, placement.sequences[1:], start + 1, start + 1 + len(path))
        self.tokens.extend([pending, *(tree.tokens[n] for n in path)])

    def drop_unrecorded(self) -> None:
        """After a failed decode: a decode that failed after its first chunks left them in the cache;
        forget them, so that what the cache holds is what `tokens` says (the next request on this slot
        would fail)."""
        held = self.model.truncate(len(self.tokens), seq=self.seq)
        del self.tokens[held:]

    def sync(self, context: Sequence[int]) -> np.ndarray:
        """Make the cache hold `context` and return the logits after its last token.

        Reuses the longest cached prefix; the last token is always evaluated (its logits are not kept).
        """
        keep = min(common_prefix(self.tokens, context), len(context) - 1)
        self.rewind(keep)
        missing = list(context[keep:])
        return self.extend(missing, [len(missing) - 1])[0]

    def reuse(self, prompt: Sequence[int], min_chunk: int) -> int:
        """Keep what the cache holds of `prompt`: its common prefix, then each later run of at least
        `min_chunk` cached tokens that the prompt continues with, moved down to where the prompt has
        it (llama-server's --cache-reuse: an editor's prompt is the file around the cursor, and the text
        after the cursor moves by what was typed). Returns how many of the prompt's tokens it holds.
        `min_chunk` 0, or a model whose cache cannot be shifted: the common prefix only."""
        n = common_prefix(self.tokens, prompt)
        if min_chunk <= 0 or not self.model.can_shift:
            return n
        while n < len(prompt) and n < len(self.tokens):
            held = np.asarray(self.tokens[n + 1:], dtype=np.int64)
            moved = None
            for j in np.flatnonzero(held == prompt[n]) + n + 1:
                run = common_prefix(self.tokens[j:j + len(prompt) - n], prompt[n:])
                if run >= min_chunk:
                    moved = int(j)
                    break
            if moved is None:
                break
            self.model.cut(n, moved, seq=self.seq)
            del self.tokens[n:moved]
            n += common_prefix(self.tokens[n:], prompt[n:])
        return n

    def checkpoint(self) -> None:
        """What it holds now is a point `rewind` can go back to at once (a recurrent state's checkpoint)."""
        self.model.checkpoint(self.seq)

    def copy_from(self, other: "KvSequence") -> None:
        """Hold exactly what `other` holds (a prompt evaluated once, shared by several completions)."""
        self.model.copy_seq(other.seq, self.seq)
        self.tokens = list(other.tokens)

    def reset(self) -> None:
        self.rewind(0)


def extend_together(parts: Sequence[tuple[KvSequence, Sequence[int], int]]) -> list[np.ndarray]:
    """Each sequence's tokens appended in one evaluation (the sequences of one model): (sequence, tokens,
    outputs) each; the logits after each of a part's last `outputs` tokens, (outputs, n_vocab)."""
    model = parts[0][0].model
    try:
        rows = model.decode_many([(kv.seq, list(tokens), len(kv.tokens), outputs) for kv, tokens, outputs in parts])
    except BaseException:
        for kv, _tokens, _outputs in parts:
            kv.drop_unrecorded()
        raise
    for kv, tokens, _outputs in parts:
        kv.tokens.extend(tokens)
        kv.evaluated += len(tokens)
    return rows

"""The tokens held in one model's KV cache, kept in step with the cache itself.

Works with any model object that has `decode(tokens, start, logits_for)`, `truncate(n)` and `n_ctx`
(the llama.cpp `backend.Model`, or the numpy toy model of the tests).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KvSequence:
    """One sequence (slot) of a model's KV cache."""

    def __init__(self, model, seq: int = 0):
        self.model = model
        self.seq = seq
        self.tokens: list[int] = []
        self.evaluated = 0  # positions run through the model, over this object's life
        self.last_used = -1  # when a request last used it (the engine's request counter)

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    def room(self) -> int:
        return self.model.n_ctx - len(self.tokens)

    def rewind(self, n_keep: int) -> None:
        if n_keep < len(self.tokens):
            self.model.truncate(n_keep, seq=self.seq)
            del self.tokens[n_keep:]

    def extend(self, tokens: Sequence[int], logits_for: Sequence[int] = ()) -> np.ndarray:
        logits = self.model.decode(list(tokens), len(self.tokens), list(logits_for), seq=self.seq)
        self.tokens.extend(tokens)
        self.evaluated += len(tokens)
        return logits

    def sync(self, context: Sequence[int]) -> np.ndarray:
        """Make the cache hold `context` and return the logits after its last token.

        Reuses the longest cached prefix; the last token is always evaluated (its logits are not kept).
        """
        keep = min(common_prefix(self.tokens, context), len(context) - 1)
        self.rewind(keep)
        missing = list(context[keep:])
        return self.extend(missing, [len(missing) - 1])[0]

    def reset(self) -> None:
        self.rewind(0)

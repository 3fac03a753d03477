"""Drafters: cheap guesses at the target's next tokens.

A drafter proposes up to `max_len` tokens after `context` (every token so far: system prompt,
earlier turns, the answer so far). A drafter with a distribution returns it (`q`, one row per
token) so that sampling can be verified exactly; a lookup drafter returns none (q is one-hot).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from localspec.engine.kv import KvSequence
from localspec.engine.sampling import Sampler, softmax


@dataclass
class Draft:
    tokens: list[int]
    q: np.ndarray | None = None   # (len(tokens), n_vocab) when sampling with a model drafter
    source: str = "none"          # "model", "ngram" or "none"
    evidence: int = 0             # n-gram match length behind the proposal
    continuing: bool = False      # n-gram: the match carries on the previous round's copy
    seconds: float = 0.0
    per_token_s: float | None = None  # steady-state drafting cost, when this draft measured one

    @staticmethod
    def empty() -> "Draft":
        return Draft(tokens=[])


class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], max_len: int, sampler: Sampler) -> Draft: ...

    def reset(self) -> None: ...


# ----------------------------------------------------------------------------- n-gram lookup


class NgramDrafter:
    """Copy what followed the latest earlier occurrence of the text's current ending.

    It looks for the longest suffix of the context (up to `max_ngram` tokens) that occurred before,
    and proposes what came after it. Among equally long matches it prefers the one just after the
    previous copy's source position: after an edit (a renamed variable, an inserted line) the copy
    re-aligns with the same source instead of jumping to an unrelated occurrence.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 6, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._cursor: int | None = None      # source position the copy should continue from
        self._last_start: int | None = None  # where the last proposal was copied from
        self._continuing = False

    def reset(self) -> None:
        self._cursor = self._last_start = None

    def lookup(self, context: Sequence[int], max_len: int) -> tuple[list[int], int]:
        """(continuation, match length); ([], 0) when nothing matches."""
        self._last_start = None
        n_ctx = len(context)
        if n_ctx < 2 or max_len <= 0:
            return [], 0
        arr = np.asarray(context, dtype=np.int64)
        # Every earlier position holding the last token is a candidate end of a match.
        ends = np.flatnonzero(arr[:-1] == arr[-1])
        if ends.size == 0:
            return [], 0
        lengths = np.ones(ends.size, dtype=np.int64)
        alive = np.ones(ends.size, dtype=bool)
        for back in range(1, self.max_ngram):
            idx = ends - back
            ok = alive & (idx >= 0)
            ok[ok] = arr[idx[ok]] == arr[n_ctx - 1 - back]
            lengths += ok
            alive = ok
            if not alive.any():
                break
        best = int(lengths.max())
        if best < self.min_ngram:
            return [], 0
        end, self._continuing = self._pick(ends[lengths == best])
        start = end + 1
        self._last_start = start
        return arr[start:min(start + max_len, n_ctx)].tolist(), best

    def _pick(self, choices: np.ndarray) -> tuple[int, bool]:
        """The match end to copy after, and whether it continues the previous copy."""
        if self._cursor is not None:
            after = choices[choices >= self._cursor]
            if after.size:
                return int(after[0]), True
        return int(choices[-1]), False

    def propose(self, context: Sequence[int], max_len: int, sampler: Sampler) -> Draft:
        t0 = time.perf_counter()
        tokens, evidence = self.lookup(context, max_len)
        return Draft(tokens=tokens, source="ngram", evidence=evidence, continuing=bool(tokens) and self._continuing,
                     seconds=time.perf_counter() - t0)

    def observe(self, draft: Draft, accepted: int) -> None:
        """Remember how far the copy got, so the next lookup continues from the same source."""
        if draft.source == "ngram" and draft.tokens and self._last_start is not None:
            self._cursor = self._last_start + accepted


# ----------------------------------------------------------------------------- draft model


class ModelDrafter:
    """A smaller GGUF with the same vocabulary, drafting token by token in its own KV cache.

    The last drafted token is never decoded here: if the target keeps it, it is evaluated with the
    next round's catch-up, so no position is ever run twice.
    """

    name = "model"

    def __init__(self, model, p_min: float = 0.5):
        self.kv = KvSequence(model)
        self.p_min = p_min  # stop drafting when the draft's top probability falls below this
        self._ready: tuple[int, np.ndarray] | None = None  # logits after a prepared context

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    def reset(self) -> None:
        self.kv.reset()
        self._ready = None

    def prepare(self, context: Sequence[int]) -> None:
        """Bring a new prompt into the draft's cache now (counted as prompt time, not draft time)."""
        self._ready = None
        if 0 < len(context) <= self.kv.n_ctx:
            self._ready = (len(context), self.kv.sync(context))

    def _logits_after(self, context: Sequence[int]) -> tuple[np.ndarray, int]:
        """Logits after the context's last token, and how many tokens had to be evaluated."""
        ready, self._ready = self._ready, None
        if ready is not None and ready[0] == len(context) and self.kv.tokens == list(context):
            return ready[1], 0
        before = self.kv.evaluated
        logits = self.kv.sync(context)
        return logits, self.kv.evaluated - before

    def propose(self, context: Sequence[int], max_len: int, sampler: Sampler) -> Draft:
        if max_len <= 0 or len(context) + max_len > self.kv.n_ctx:
            return Draft.empty()  # a draft context smaller than the target's just stops drafting
        t0 = time.perf_counter()
        logits, caught_up = self._logits_after(context)
        history = list(context)
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        while True:
            if sampler.greedy:
                adjusted = sampler.adjusted(logits, history)
                token = int(np.argmax(adjusted))
                confidence = float(softmax(adjusted)[token]) if self.p_min > 0 else 1.0
            else:
                q = sampler.probs(logits, history)
                token = sampler.draw(q)
                confidence = float(q.max())
                rows.append(q)
            if tokens and confidence < self.p_min:
                break  # not even this one: the draft stops where the model stops being sure
            tokens.append(token)
            history.append(token)
            if len(tokens) >= max_len or confidence < self.p_min:
                break
            logits = self.kv.extend([token], [0])[0]
        seconds = time.perf_counter() - t0
        decodes = len(tokens) - 1 + (1 if caught_up else 0)
        return Draft(
            tokens=tokens,
            q=np.stack(rows[:len(tokens)]) if rows else None,
            source="model",
            seconds=seconds,
            # A long catch-up (a new prompt) says nothing about the steady cost per token.
            per_token_s=seconds / decodes if decodes > 0 and caught_up <= 2 else None,
        )

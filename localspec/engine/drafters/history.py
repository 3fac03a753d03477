"""The "history" drafter: continuations of earlier prompts and answers for the same target.

Users repeat themselves across requests: a regenerated answer retells the last one, a follow-up in a
new conversation asks for the same code again, an editor asks for nearly the same completion while a
line is typed, an agent sends the same tool output again. `SuffixIndex` keeps the text of past
requests (bounded, oldest dropped first) and finds where the current text's ending occurred before;
what followed there, weighted by how long the match runs and how recent it is, is the proposal
(suffix_index.py). The index persists per model file under the cache folder; nothing leaves the machine.

Greedy answers are also kept whole (the latest `REPLAYS`, in memory only) under a digest of their
context: a request with the same context at temperature 0 (a regenerated answer) is offered the
recorded answer as a replay, verified by `sampling.accept_replayed`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np

from localspec.engine.adaptive import (HISTORY_AGE_CLASSES, HISTORY_COPY_PRIORS, CopyAcceptance, best_length,
                                       margin_for)
from localspec.engine.drafters.base import Draft, Drafter, Offer, Plan, Sources, Turn
from localspec.engine.drafters.ngram import Copy, copy_of
from localspec.engine.drafters.suffix_index import (SuffixIndex, context_digest, file_lock, file_stamp, load_index,
                                                    model_key, save_index)

REPLAYS = 32          # greedy answers kept for replay: at most 32 x the context window x 4 bytes
REPLAY_CHANCE = 0.995  # a replayed token is kept (docs/tuning.md, "Replays")


class HistoryDrafter(Drafter):
    """Proposals from `SuffixIndex`, priced like copies by their age (how long the text agrees with
    the earlier occurrence) times the share of earlier occurrences that went on that way.

    `recording` off: lookups continue but requests are not added (the bench's single-request suites,
    where a variant must not draft from another variant's answer to the same prompt)."""

    name = "history"
    max_len = 63  # a regenerated answer is kept whole: a verify batch of 64 (measuring.CALIBRATION_SIZES)
    min_len = 3
    save_every_s = 10.0

    def __init__(self, index: SuffixIndex | None = None, file: Path | None = None, key: str = "memory",
                 warning: str | None = None, n_vocab: int = 0):
        self.index = index or SuffixIndex()
        self.file = file
        self.key = key
        self.n_vocab = n_vocab
        # Several processes (a chat and a server) may keep this target's history: a save merges what the
        # file gained since this one read or wrote it, under a lock (merge_and_save).
        self._pending: list[np.ndarray] = []   # documents added since the last save
        self._stamp = file_stamp(file) if file is not None else None
        self._cleared = False
        self.warning = warning            # why a stored index was not used, for the front doors to show
        self.recording = True
        self.answers: OrderedDict[bytes, np.ndarray] = OrderedDict()  # greedy answers by context digest
        self._dirty = False
        self._saved_at = time.monotonic()

    @classmethod
    def build(cls, sources: Sources) -> "HistoryDrafter | None":
        if not sources.history:
            return None
        n_vocab = sources.target.vocab.n_tokens
        file = Path(str(sources.history_file)) if sources.history_file is not None else None
        key = model_key(sources.target.path if file is not None else None, n_vocab)
        index, warning = load_index(file, key, n_vocab) if file is not None else (SuffixIndex(), None)
        return cls(index, file, key, warning, n_vocab)

    def clear(self) -> None:
        """Forget every earlier request (the stored file too, at the next save)."""
        self.index = SuffixIndex(self.index.max_tokens)
        self.answers.clear()
        self._pending.clear()
        self._cleared = True
        self._dirty = True

    def begin(self, prompt: Sequence[int], plan: Plan) -> "HistoryTurn":
        return HistoryTurn(self, prompt, plan)

    def record(self, prompt: Sequence[int], answer: Sequence[int], digest: bytes | None = None) -> None:
        """Add a request to the index (and, with the `digest` of its context, its greedy answer for replay)."""
        if not self.recording or not answer:
            return
        if digest is not None:
            self._remember_answer(digest, np.asarray(answer, dtype=np.int32))
        if self.index.add([t for t in prompt if t >= 0] + list(answer)):  # (an image's ids are this process's only)
            self._pending.append(self.index.last_document())
            self._dirty = True
            if time.monotonic() - self._saved_at >= self.save_every_s:
                self.save()

    def _remember_answer(self, digest: bytes, answer: np.ndarray) -> None:
        """Keep the latest greedy answer to this context (a cut-short replay keeps the whole one)."""
        known = self.answers.get(digest)
        if known is None or len(known) < len(answer) or not np.array_equal(known[:len(answer)], answer):
            known = answer
        self.answers[digest] = known
        self.answers.move_to_end(digest)
        while len(self.answers) > REPLAYS:
            self.answers.popitem(last=False)

    def save(self) -> None:
        """Write the index; what another process saved to the same file meanwhile is merged in first."""
        if self.file is None or not self._dirty:
            return
        with file_lock(self.file):
            stamp = file_stamp(self.file)
            if not self._cleared and stamp is not None and stamp != self._stamp:
                stored, problem = load_index(self.file, self.key, self.n_vocab, self.index.max_tokens)
                if problem is None:  # a damaged file is replaced by this index, as at load
                    for document in self._pending:
                        stored.append(document)
                    stored._last = self.index._last
                    self.index = stored
            problem = save_index(self.index, self.file, self.key)
            self._stamp = file_stamp(self.file)
        self._saved_at = time.monotonic()
        self._dirty = problem is not None
        if problem:
            self.warning = problem
        else:
            self._pending.clear()
            self._cleared = False

    def close(self) -> None:
        self.save()


class HistoryTurn(Turn):
    """One request's lookups in the shared index: what its copies of each age did, and the recorded
    answer to its context being replayed, while the answer so far is that answer."""

    def __init__(self, drafter: HistoryDrafter, prompt: Sequence[int], plan: Plan):
        self.drafter = drafter
        self.acceptance = CopyAcceptance(priors=HISTORY_COPY_PRIORS, classes=HISTORY_AGE_CLASSES)
        self.prompt_len = len(prompt)
        self.digest = context_digest(prompt) if plan.replayable else None  # its context, if its answer replays
        self.replay: np.ndarray | None = drafter.answers.get(self.digest) if self.digest is not None else None
        self.replayed = 0  # answer tokens checked against it so far

    def offer(self, context: Sequence[int], room: int, plan: Plan) -> Offer | None:
        drafter = self.drafter
        cap = min(plan.fixed_len if plan.fixed_len is not None else drafter.max_len, room)
        if self.replay is not None and (replay := self._replay_offer(context, cap, plan)) is not None:
            return replay
        tokens, chances, age = drafter.index.propose(context, cap)
        if not tokens:
            return None
        draft = Draft(tokens=tokens, source=drafter.name, evidence=age, note=Copy(age=age))
        if plan.fixed_len is not None:
            return Offer(len(tokens), float("inf"), draft)
        longest = min(len(tokens), max(drafter.min_len, 2 * age))
        rates = [r * c for r, c in zip(self.acceptance.rates(age, longest), chances)]
        k, rate = best_length(rates, plan.cost, 0.0, margin_for(self.acceptance.samples(age)), one_off=True)
        return Offer(k, rate, draft, rates)

    def _replay_offer(self, context: Sequence[int], cap: int, plan: Plan) -> Offer | None:
        """The rest of the recorded answer to this context, while the answer so far is that answer."""
        recorded, done = self.replay, len(context) - self.prompt_len
        assert recorded is not None
        new = np.asarray(context[self.prompt_len + self.replayed:], dtype=np.int32)
        if done > len(recorded) or not np.array_equal(recorded[self.replayed:done], new):
            self.replay = None
            return None
        self.replayed = done
        tokens = recorded[done:done + cap].tolist()
        if not tokens:
            return None
        draft = Draft(tokens=tokens, source=self.drafter.name, exact=True, evidence=done, note=Copy(age=done))
        if plan.fixed_len is not None:
            return Offer(len(tokens), float("inf"), draft)
        chances = [REPLAY_CHANCE] * len(tokens)
        k, rate = best_length(chances, plan.cost, 0.0, one_off=True)
        return Offer(k, rate, draft, chances)

    def observe(self, draft: Draft, accepted: int, token: int | None) -> None:
        if draft.exact:  # a replay kept short of its end has parted from the recorded answer
            if accepted < len(draft.tokens):
                self.replay = None
            return
        self.acceptance.observe(copy_of(draft).age, len(draft.tokens), accepted)

    def end(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        replayable = self.digest is not None and len(prompt) == self.prompt_len
        self.drafter.record(prompt, answer, self.digest if replayable else None)

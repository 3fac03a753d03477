"""One request as the engine runs it: what was asked, and the KV slot it holds once prefilled."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

from localspec.engine.constraint import Constraint, check_size, trigger_token
from localspec.engine.contract import unavailable_drafter
from localspec.engine.kv import KvSequence
from localspec.engine.model import LanguageModel
from localspec.engine.sampling import SamplingSettings
from localspec.errors import ContextOverflowError, LocalspecError


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingSettings
    mode: str                        # the drafter setting
    fixed: int | None                # a forced draft length, or None (the planner chooses)
    stop: tuple[str, ...]
    cancel: threading.Event
    constraint: Constraint | None    # the grammar's state, advanced by what each round keeps
    longest: int | None = None       # the longest draft it allows (None: any), and the shortest worth making
    shortest: int = 0
    kv: KvSequence | None = None     # the slot holding its context, once prefilled
    waited_s: float = 0.0            # time it waited while steps left it out (another request stepped alone)

    @property
    def label(self) -> str:
        """The drafter setting as a summary names it."""
        return self.mode if self.fixed is None else f"{self.mode} (fixed {self.fixed})"

    closed: bool = False

    def close(self) -> None:
        """It ended: its slot is free again (once: the slot may be another request's by a second call)."""
        if self.closed:
            return
        self.closed = True
        if self.kv is not None:
            self.kv.busy = False
        if self.constraint is not None:
            self.constraint.close()


def check(target: LanguageModel, drafters: Sequence[str], prompt: str | Sequence[int], *, max_tokens: int,
          sampling: SamplingSettings, mode: str, draft_len: int | None | str, default_len: int | None,
          stop: Sequence[str], cancel: threading.Event, longest: int | None = None, shortest: int = 0) -> Request:
    """A request checked before it takes the engine: a bad one is refused with a clear message (an
    unavailable drafter, an empty prompt or one past the context, a token outside the vocabulary, a
    grammar that does not parse). `draft_len` "default" takes the engine's `default_len`."""
    problem = unavailable_drafter(mode, drafters)
    if problem:
        raise LocalspecError(problem)
    if isinstance(draft_len, str) and draft_len != "default":
        raise LocalspecError(f"draft_len must be a number of tokens, none, or 'default' (got '{draft_len}').")
    if longest is not None and longest < shortest:
        raise LocalspecError(f"The shortest draft asked for ({shortest}) is longer than the longest ({longest}).")
    fixed = default_len if isinstance(draft_len, str) else draft_len
    tokens = list(prompt) if not isinstance(prompt, str) else target.vocab.tokenize(prompt, add_special=True)
    if not tokens:
        raise LocalspecError("The prompt is empty.")
    projector = target.projector  # an image's ids (backend/vision.py) are its to know
    outside = [t for t in tokens if not 0 <= t < target.n_vocab and not (t < 0 and projector and projector.holds(t))]
    if outside and outside[0] < 0 and projector:
        raise LocalspecError("The prompt holds rows of an image the model no longer holds; send the image again.")
    if outside:  # llama.cpp would fail the decode (or read out of bounds) on it
        raise LocalspecError(f"Token id {outside[0]} is outside this model's vocabulary (0 to {target.n_vocab - 1}).")
    if max_tokens < 1:
        raise LocalspecError("max_tokens must be at least 1.")
    if len(tokens) >= target.n_ctx:
        raise ContextOverflowError(
            f"The prompt is {len(tokens)} tokens but the context window holds {target.n_ctx}. "
            "Shorten the prompt or the conversation, or load the model with a larger context (--ctx)."
        )
    return Request(tokens, max_tokens, sampling, mode, fixed, tuple(stop), cancel, _constraint(target, sampling),
                   longest, shortest)


def _constraint(target: LanguageModel, sampling: SamplingSettings) -> Constraint | None:
    """The request's grammar state (a grammar that does not parse is refused here). A lazy grammar
    (tool_choice auto) needs its trigger to be one token (Vocabulary.grammar); where it is several, the
    answer stays free text (as without it)."""
    if sampling.grammar is None:
        return None
    check_size(sampling.grammar)
    trigger, vocab = sampling.grammar_trigger, target.vocab
    if trigger is not None and trigger_token(vocab, trigger) is None:
        return None
    return vocab.grammar(sampling.grammar, trigger)

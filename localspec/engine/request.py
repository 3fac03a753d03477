"""One request as the engine runs it: what was asked, and the KV slot it holds once prefilled."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

from localspec.engine.constraint import Constraint, check_size, trigger_token
from localspec.engine.contract import unavailable_drafter
from localspec.engine.kv import KvSequence
from localspec.engine.model import LanguageModel
from localspec.engine.options import EngineOptions
from localspec.engine.params import GenerationParams
from localspec.engine.sampling import SamplingSettings
from localspec.errors import ContextOverflowError, LocalspecError


@dataclass
class Request:
    """One sequence of a request: its settings are the request's `params` (read, never copied), with the
    drafter setting and draft length resolved against the engine's."""

    prompt: list[int]
    params: GenerationParams
    sequence: int                    # which of params.samplings this one draws with
    mode: str                        # the drafter setting: the request's, else the engine's
    fixed: int | None                # a forced draft length, or None (the planner chooses)
    cancel: threading.Event
    constraint: Constraint | None    # the grammar's state, advanced by what each round keeps
    kv: KvSequence | None = None     # the slot holding its context, once prefilled
    waited_s: float = 0.0            # time it waited while steps left it out (another request stepped alone)

    @property
    def sampling(self) -> SamplingSettings:
        return self.params.samplings[self.sequence]

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens

    @property
    def stop(self) -> tuple[str, ...]:
        return self.params.stop

    @property
    def longest(self) -> int | None:
        """The longest draft it allows (None: any)."""
        return self.params.draft_max

    @property
    def shortest(self) -> int:
        """The shortest draft worth making for it."""
        return self.params.draft_min

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


def check(target: LanguageModel, drafters: Sequence[str], prompt: str | Sequence[int], params: GenerationParams,
          sequence: int, engine: EngineOptions, cancel: threading.Event) -> Request:
    """One sequence of a request, checked against the model before it takes the engine (`params` checked
    themselves): an unavailable drafter, an empty prompt or one past the context, a token outside the
    vocabulary, a grammar that does not parse are refused with a clear message. The drafter setting
    and a "default" draft length are the `engine`'s where the request leaves them."""
    mode = params.drafter or engine.drafter
    problem = unavailable_drafter(mode, drafters)
    if problem:
        raise LocalspecError(problem)
    fixed = engine.draft_len if isinstance(params.draft_len, str) else params.draft_len
    tokens = list(prompt) if not isinstance(prompt, str) else target.vocab.tokenize(prompt, add_special=True)
    check_length(len(tokens), target.n_ctx)
    projector = target.projector  # an image's ids (backend/vision.py) are its to know
    outside = [t for t in tokens if not 0 <= t < target.n_vocab and not (t < 0 and projector and projector.holds(t))]
    if outside and outside[0] < 0 and projector:
        raise LocalspecError("The prompt holds rows of an image the model no longer holds; send the image again.")
    if outside:  # llama.cpp would fail the decode (or read out of bounds) on it
        raise LocalspecError(f"Token id {outside[0]} is outside this model's vocabulary (0 to {target.n_vocab - 1}).")
    sampling = params.samplings[sequence]
    return Request(tokens, params, sequence, mode, fixed, cancel, _constraint(target, sampling))


def check_length(n_tokens: int, n_ctx: int) -> None:
    """A prompt must hold a token and leave the context room for one more."""
    if not n_tokens:
        raise LocalspecError("The prompt is empty.")
    if n_tokens >= n_ctx:
        raise ContextOverflowError(
            f"The prompt is {n_tokens} tokens but the context window holds {n_ctx}. "
            "Shorten the prompt or the conversation, or load the model with a larger context (--ctx)."
        )


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

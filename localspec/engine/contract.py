"""What a front door may call on an engine, and the drafter settings every front door offers.

Three engines implement `ChatEngine`: the in-process `engine.api.Engine`, the chat app's
`tui.remote.RemoteEngine` (a running `localspec serve` over its socket) and the tests' scripted
engine. The chat app and `run` use nothing else; the server and the bench, which need the tokenizer
and the model files, take the local `Engine` itself. Checked by mypy (tests/test_layers.py).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

from localspec.engine.events import Event

if TYPE_CHECKING:
    from localspec.engine.sampling import SamplingSettings

# Every drafter setting, in the order front doors list them. "auto" lets the planner choose per round
# among what the engine has; "model" and "self" need a loaded draft model or self-draft.
DRAFTER_SETTINGS: tuple[str, ...] = ("auto", "model", "self", "ngram", "none")
MODEL_DRAFTERS: tuple[str, ...] = ("model", "self")
DRAFTER_HELP = {
    "auto": "the planner picks per round among what the engine has",
    "model": "the draft model",
    "self": "a self-draft built from the target's own layers",
    "ngram": "copies from the prompt and the answer so far",
    "none": "plain decoding",
}


def available_drafters(has_draft_model: bool, has_self_draft: bool) -> tuple[str, ...]:
    return tuple(d for d in DRAFTER_SETTINGS
                 if (d != "model" or has_draft_model) and (d != "self" or has_self_draft))


def describe_drafters(drafters: Sequence[str]) -> str:
    """What an engine drafts with, for headers and status lines: 'draft model + n-gram'."""
    parts = [name for d, name in (("model", "draft model"), ("self", "self-draft")) if d in drafters]
    return " + ".join([*parts, "n-gram"]) if parts else "n-gram lookup"


def unavailable_drafter(drafter: str, available: Sequence[str]) -> str | None:
    """Why `drafter` cannot be used with an engine offering `available` (None: it can)."""
    if drafter in available:
        return None
    if drafter not in DRAFTER_SETTINGS:
        return f"Unknown drafter '{drafter}'; choose one of {', '.join(DRAFTER_SETTINGS)}."
    if drafter == "model":
        return "The drafter 'model' needs a draft model; this engine has none (choose auto, ngram or none)."
    return ("The drafter 'self' needs a self-draft; build one with `localspec draft make TARGET` "
            "(or choose auto, ngram or none).")


class ChatEngine(Protocol):
    """An engine as the chat app and `run` see it: one generation at a time, events out."""

    @property
    def n_ctx(self) -> int: ...

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafter settings this engine accepts (a subset of DRAFTER_SETTINGS)."""
        ...

    @property
    def baseline_tokens_per_s(self) -> float:
        """Plain decoding of the target on this machine: a one-token decode timed at load, tracked since."""
        ...

    def chat(self, messages: Sequence[dict[str, Any]], *, max_tokens: int = 512, sampling: SamplingSettings | None = None,
             drafter: str | None = None, draft_len: int | None | str = "default", stop: Sequence[str] = (),
             cancel: threading.Event | None = None) -> Iterator[Event]:
        """Prefill, one Round per draft/verify step, then a Summary. Raises LocalspecError for a request
        the engine refuses (an unavailable drafter, a prompt longer than the context)."""
        ...

    def close(self) -> None: ...


class ServedEngine(ChatEngine, Protocol):
    """An engine as `localspec serve` sees it: it also tokenizes (FIM prompts, raw prompts) and
    generates from token ids."""

    @property
    def vocab(self) -> Any:
        """The target's tokenizer: tokenize(), the FIM token ids, bos/add_bos (engine.backend.Vocab)."""
        ...

    @property
    def chat_template(self) -> str:
        """The Jinja chat template in use: the GGUF's, or the fallback when it has none."""
        ...

    def chat_tokens(self, messages: Sequence[dict[str, Any]]) -> list[int]: ...

    def slot_tokens(self) -> list[int]:
        """Tokens held in each KV slot, by slot id."""
        ...

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 512,
                 sampling: SamplingSettings | None = None, drafter: str | None = None,
                 draft_len: int | None | str = "default", stop: Sequence[str] = (),
                 cancel: threading.Event | None = None) -> Iterator[Event]: ...

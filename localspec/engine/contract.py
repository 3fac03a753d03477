"""What a front door may call on an engine, and the drafter settings every front door offers.

Three engines implement `ChatEngine`: the in-process `engine.api.Engine`, the chat app's
`tui.remote.RemoteEngine` (a running `localspec serve` over its socket) and the tests' scripted
engine. The chat app and `run` use nothing else; the server and the bench, which need the tokenizer
and the model files, take the local `Engine` itself. Checked by mypy (tests/test_layers.py).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol, Sequence

from localspec.engine.drafters import REGISTRY
from localspec.engine.driver import Driver
from localspec.engine.events import Event
from localspec.engine.model import ImageInput
from localspec.engine.params import DRAFTER_SETTINGS, GenerationParams, unknown_drafter

Deliver = Callable[[Any], None]  # where a submitted request's events go (or the exception that ended it)

if TYPE_CHECKING:
    from localspec.engine.model import InfillTokenizer
    from localspec.engine.sampling import SamplingSettings

DRAFTER_HELP = {"auto": "the planner picks per round among what the engine has",
                **{r.name: r.help for r in REGISTRY}, "none": "plain decoding"}


def available_drafters(built: Iterable[str]) -> tuple[str, ...]:
    """The settings an engine with these registered drafters accepts."""
    have = set(built)
    return tuple(d for d in DRAFTER_SETTINGS if d in ("auto", "none") or d in have)


def describe_drafters(drafters: Sequence[str]) -> str:
    """What an engine drafts with, for headers and status lines: 'draft model + n-gram + history'."""
    parts = [r.label for r in REGISTRY if r.name in drafters]
    return " + ".join(parts) if parts else "plain decoding"


def unavailable_drafter(drafter: str, available: Sequence[str]) -> str | None:
    """Why `drafter` cannot be used with an engine offering `available` (None: it can)."""
    if drafter in available:
        return None
    if problem := unknown_drafter(drafter):
        return problem
    needs = next(r.needs for r in REGISTRY if r.name == drafter)
    return f"The drafter '{drafter}' {needs} (choose one of {', '.join(available)})."


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

    @property
    def sees_images(self) -> bool:
        """Whether its prompts may carry images (a message's `images`: the model was loaded with a projector)."""
        ...

    @property
    def warnings(self) -> list[str]:
        """What the user should know about this engine (a pair that barely agrees, a self-draft for
        another build …), said once when it is ready."""
        ...

    def chat(self, messages: Sequence[dict[str, Any]], *, max_tokens: int = 512, sampling: SamplingSettings | None = None,
             drafter: str | None = None, draft_len: int | None | str = "default", stop: Sequence[str] = (),
             cancel: threading.Event | None = None, draft_max: int | None = None,
             draft_min: int = 0) -> Iterator[Event]:
        """Prefill, one Round per draft/verify step, then a Summary; no draft longer than `draft_max` (0:
        none) nor shorter than `draft_min`. Raises LocalspecError for a request the engine refuses (the
        settings' own messages: GenerationParams; an unavailable drafter, a prompt longer than the context)."""
        ...

    def maintain(self, interrupt: Callable[[], bool] = ...) -> str:
        """Between answers, never during one: work the engine put off for a quiet moment (measuring
        its costs again, engine/calibration.py). Stops early when `interrupt` says so or a request
        arrives. Returns what was done ("" for nothing)."""
        ...

    def close(self) -> None: ...


class ServedEngine(ChatEngine, Protocol):
    """An engine as `localspec serve` sees it: it also tokenizes (FIM prompts, raw prompts) and
    generates from token ids."""

    @property
    def vocab(self) -> InfillTokenizer:
        """The target's tokenizer: tokenize(), bos/eos and the FIM token ids (engine/model.py)."""
        ...

    @property
    def driver(self) -> Driver:
        """The engine's one thread: `submit`, `step` and every other call into the models run on it, in
        the turns of its policy (the server's scheduler drives it)."""
        ...

    @property
    def chat_template(self) -> str:
        """The Jinja chat template in use: the GGUF's, or the fallback when it has none."""
        ...

    def chat_tokens(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The conversation through the chat template; `tools` (OpenAI's function shape) listed where the
        template lists tools."""
        ...

    @property
    def projector(self) -> ImageInput | None:
        """What makes images prompt ids (None: the model cannot see images)."""
        ...

    def image_tokens(self, text: str, images: Sequence[bytes]) -> list[int]:
        """A raw prompt with a media marker where each image stands (special tokens parsed)."""
        ...

    def slot_tokens(self) -> list[int]:
        """Tokens held in each KV slot, by slot id."""
        ...

    def slots_busy(self) -> list[bool]:
        """Whether a request is generating on each KV slot now, by slot id."""
        ...

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 512,
                 sampling: SamplingSettings | None = None, drafter: str | None = None,
                 draft_len: int | None | str = "default", stop: Sequence[str] = (),
                 cancel: threading.Event | None = None, draft_max: int | None = None,
                 draft_min: int = 0) -> Iterator[Event]: ...

    def generate_many(self, prompt: str | Sequence[int], samplings: Sequence[SamplingSettings], *,
                      max_tokens: int = 512, stop: Sequence[str] = (), drafter: str | None = None,
                      cancel: threading.Event | None = None,
                      cancels: Sequence[threading.Event] | None = None) -> Iterator[tuple[int, Event]]:
        """One completion of `prompt` per sampling setting: (which completion, event), each completion's
        events those of `generate`. `cancel` ends them all, `cancels` each."""
        ...

    @property
    def concurrent(self) -> bool:
        """Whether requests can be decoded side by side (`submit` while others run)."""
        ...

    def free_slots(self) -> int:
        """KV slots no request is generating on."""
        ...

    def submit(self, prompt: str | Sequence[int], params: GenerationParams, deliver: Deliver, *,
               cancel: threading.Event | None = None, cancels: Sequence[threading.Event] | None = None,
               sequences: Sequence[int] | None = None, urgent: bool = False) -> Sequence[object]:
        """A request's `sequences` (of its `params.n`; all by default) decoded in the engine's steps from
        the next on: (sequence, event) to `deliver` (or the exception that ended them, where their own
        evaluation failed); `cancel` ends them all at the next step, `cancels` (one per sequence) each.
        Returns their handles, for `step(only=...)`. Raises LocalspecError for a request refused, or
        for more sequences than slots are free."""
        ...

    def step(self, only: Sequence[Any] | None = None) -> bool:
        """One step of the submitted requests (`only` those handles, else all); False once none is left."""
        ...

"""What one request asks of the engine, fixed at the front door: every dialect of the server and the
Python API map their fields to one `GenerationParams`, which checks them once (its messages are the
ones every front door answers with), and nothing downstream copies or changes it."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.drafters import REGISTRY
from localspec.engine.sampling import SamplingSettings
from localspec.errors import LocalspecError

# Every drafter setting, in the order front doors list them: "auto" lets the planner choose per round
# among what the engine has, then each registered drafter, then plain decoding.
DRAFTER_SETTINGS: tuple[str, ...] = ("auto", *(r.name for r in REGISTRY), "none")

# Stop strings are searched for after every token, each prefix of each one against the text's tail: a
# client's list stays far below these (editors send a handful, of a few characters).
MAX_STOPS = 64
MAX_STOP_CHARS = 500


def unknown_drafter(drafter: str) -> str | None:
    """Why `drafter` is no drafter setting at all (None: it is one)."""
    if drafter in DRAFTER_SETTINGS:
        return None
    return f"Unknown drafter '{drafter}'; choose one of {', '.join(DRAFTER_SETTINGS)}."


@dataclass(frozen=True)
class GenerationParams:
    """A request's settings. It is `n` sequences of one prompt (OpenAI's `n`, llama.cpp's `n_cmpl`),
    one sampling setting each: the prompt is evaluated once and copied, and each sequence's events
    come as (sequence, event). The token budget is each sequence's; the answer counts it down.
    A longest draft of 0 is plain decoding (Ollama's `draft_num_predict: 0`)."""

    max_tokens: int = 512
    samplings: tuple[SamplingSettings, ...] = (SamplingSettings(),)
    stop: tuple[str, ...] = ()
    drafter: str | None = None               # None: the engine's drafter setting
    draft_len: int | None | str = "default"  # "default": the engine's; None: the planner chooses
    draft_max: int | None = None             # the longest draft the planner may make (None: any)
    draft_min: int = 0                       # drafts shorter than this are not made

    def __post_init__(self) -> None:
        object.__setattr__(self, "samplings", tuple(self.samplings))
        object.__setattr__(self, "stop", tuple(s for s in self.stop if s))  # an empty one stops nothing
        if self.draft_max == 0:
            object.__setattr__(self, "drafter", "none")
            object.__setattr__(self, "draft_max", None)
        problem = self._problem()
        if problem:
            raise LocalspecError(problem)

    def _problem(self) -> str | None:
        """What makes these settings no request (None: nothing)."""
        if not self.samplings:
            return "Ask for at least one completion."
        if self.max_tokens < 1:
            return "max_tokens must be at least 1."
        if len(self.stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            return (f"stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters "
                    f"(got {len(self.stop)}, the longest {max(map(len, self.stop))}).")
        if self.drafter is not None and (problem := unknown_drafter(self.drafter)):
            return problem
        if isinstance(self.draft_len, str) and self.draft_len != "default" or (
                isinstance(self.draft_len, int) and self.draft_len < 0):
            return f"draft_len must be a number of tokens, none, or 'default' (got '{self.draft_len}')."
        if self.draft_min < 0 or self.draft_max is not None and self.draft_max < 0:
            return f"Draft bounds are numbers of tokens (got {self.draft_min} to {self.draft_max})."
        if self.draft_max is not None and self.draft_max < self.draft_min:
            return f"The shortest draft asked for ({self.draft_min}) is longer than the longest ({self.draft_max})."
        return None

    @classmethod
    def one(cls, sampling: SamplingSettings | None = None, **fields) -> "GenerationParams":
        """One sequence with `sampling` (greedy by default)."""
        return cls(samplings=(sampling or SamplingSettings(),), **fields)

    @property
    def n(self) -> int:
        return len(self.samplings)

"""What one request asks of the engine, fixed at the front door: every dialect of the server and the
Python API map their fields to one `GenerationParams`, and nothing downstream copies or changes it."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.sampling import SamplingSettings
from localspec.errors import LocalspecError


@dataclass(frozen=True)
class GenerationParams:
    """A request's settings. It is `n` sequences of one prompt (OpenAI's `n`, llama.cpp's `n_cmpl`),
    one sampling setting each: the prompt is evaluated once and copied, and each sequence's events
    come as (sequence, event). The token budget is each sequence's; the answer counts it down."""

    max_tokens: int = 512
    samplings: tuple[SamplingSettings, ...] = (SamplingSettings(),)
    stop: tuple[str, ...] = ()
    drafter: str | None = None               # None: the engine's drafter setting
    draft_len: int | None | str = "default"  # "default": the engine's; None: the planner chooses
    draft_max: int | None = None             # the longest draft the planner may make (None: any)
    draft_min: int = 0                       # drafts shorter than this are not made

    def __post_init__(self) -> None:
        object.__setattr__(self, "samplings", tuple(self.samplings))
        object.__setattr__(self, "stop", tuple(self.stop))
        if not self.samplings:
            raise LocalspecError("Ask for at least one completion.")

    @classmethod
    def one(cls, sampling: SamplingSettings | None = None, **fields) -> "GenerationParams":
        """One sequence with `sampling` (greedy by default)."""
        return cls(samplings=(sampling or SamplingSettings(),), **fields)

    @property
    def n(self) -> int:
        return len(self.samplings)

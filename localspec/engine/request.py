"""One request as the engine runs it: what was asked, and the KV slot it holds once prefilled."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from localspec.engine.constraint import Constraint
from localspec.engine.kv import KvSequence
from localspec.engine.sampling import SamplingSettings


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
    kv: KvSequence | None = None     # the slot holding its context, once prefilled
    waited_s: float = 0.0            # time it waited between two rounds while interjections ran

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

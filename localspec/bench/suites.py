"""The bench's prompt suites (bench_prompts/*.yaml): single prompts, and sessions of related requests."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterable

import yaml

from localspec.errors import LocalspecError

SUITES = ("code", "edit", "chat", "creative")
SESSIONS = "sessions"   # the session suites: related requests in order (bench_prompts/sessions.yaml)
SESSION_KINDS = ("follow-up", "regenerate", "quote", "tool-output")
FIRST_REQUEST = "session-start"  # the runs of each session's first request (no history to draft from yet)


@dataclass(frozen=True)
class Prompt:
    suite: str
    index: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.suite}-{self.index + 1}"


@dataclass(frozen=True)
class Session:
    """Related requests replayed in order. Each request is a user message continuing the conversation
    after the previous answer, "regenerate" (the previous request's messages again), or {"new": text}
    (a new conversation)."""

    kind: str
    index: int
    requests: tuple[Any, ...]

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.index + 1}"


def load_sessions() -> list[Session]:
    text = resources.files("localspec").joinpath("bench_prompts", f"{SESSIONS}.yaml").read_text()
    counts: dict[str, int] = {}
    out = []
    for item in yaml.safe_load(text)["sessions"]:
        kind = item["kind"]
        out.append(Session(kind, counts.get(kind, 0), tuple(item["requests"])))
        counts[kind] = counts.get(kind, 0) + 1
    return out


def load_suites(names: Iterable[str]) -> list[Prompt]:
    prompts = []
    for name in names:
        if name == SESSIONS:
            continue  # run by bench_sessions
        if name not in SUITES:
            raise LocalspecError(f"Unknown suite '{name}'; choose from {', '.join((*SUITES, SESSIONS))}.")
        text = resources.files("localspec").joinpath("bench_prompts", f"{name}.yaml").read_text()
        prompts.extend(parse_prompts(text, name))
    return prompts


def parse_prompts(text: str, suite: str | None = None) -> list[Prompt]:
    """The prompts of one suite file (`prompts:`), named after `suite` or the file's own `name:`."""
    data = yaml.safe_load(text)
    return [Prompt(suite or data["name"], i, p) for i, p in enumerate(data["prompts"])]

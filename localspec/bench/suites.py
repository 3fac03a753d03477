"""The bench's prompt suites (bench_prompts/*.yaml): single prompts, and sessions of related requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from localspec.errors import LocalspecError

SUITES = ("code", "edit", "chat", "creative", "structured")
SESSIONS = "sessions"   # the session suites: related requests in order (bench_prompts/sessions.yaml)
SESSION_KINDS = ("follow-up", "regenerate", "quote", "tool-output")
FIRST_REQUEST = "session-start"  # the runs of each session's first request (no history to draft from yet)


@dataclass(frozen=True)
class Prompt:
    suite: str
    index: int
    text: str
    grammar: str | None = field(default=None, compare=False)  # the structured suite: GBNF the answer follows
    tools: tuple[dict, ...] | None = field(default=None, compare=False, hash=False)  # listed by the chat template

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
    source: str = ""  # the sessions file's name, for sessions of your own ("" for the shipped ones)

    @property
    def suite(self) -> str:
        """What its runs are reported under: the kind, apart for each file of your own."""
        return f"{self.source}:{self.kind}" if self.source else self.kind

    @property
    def id(self) -> str:
        return f"{self.suite}-{self.index + 1}"


def load_sessions(names: Iterable[str] = (SESSIONS,)) -> list[Session]:
    """The shipped sessions (`sessions` among `names`) and those of session files named there (a YAML
    file with `sessions:`, as bench_prompts/sessions.yaml)."""
    out = []
    for name in names:
        if name == SESSIONS:
            text = resources.files("localspec").joinpath("bench_prompts", f"{SESSIONS}.yaml").read_text()
            out.extend(_sessions(yaml.safe_load(text)["sessions"]))
        elif _is_file(name):
            out.extend(_sessions_file(Path(name)))
    return out


def _sessions(items: list[dict], source: str = "") -> list[Session]:
    counts: dict[str, int] = {}
    out = []
    for item in items:
        kind = item["kind"]
        if kind not in SESSION_KINDS:
            raise LocalspecError(f"Unknown session kind '{kind}'; choose from {', '.join(SESSION_KINDS)}.")
        out.append(Session(kind, counts.get(kind, 0), tuple(item["requests"]), source))
        counts[kind] = counts.get(kind, 0) + 1
    return out


def _is_file(name: str) -> bool:
    return name.endswith((".yaml", ".yml"))


def _sessions_file(path: Path) -> list[Session]:
    """The sessions a suite file lists under `sessions:` (none for a file of prompts, or one that cannot
    be read: `_suite_file` says what is wrong with it)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []
    if not (isinstance(data, dict) and "sessions" in data):
        return []
    try:
        return _sessions(data["sessions"], path.stem)
    except (KeyError, TypeError) as e:
        raise LocalspecError(f"{path} is not a sessions file (a list of `sessions:` with `kind` and `requests`): "
                             f"{e}") from None


def load_suites(names: Iterable[str]) -> list[Prompt]:
    prompts = []
    for name in names:
        if name == SESSIONS:
            continue  # run by bench_sessions
        if _is_file(name):
            if not _sessions_file(Path(name)):  # a sessions file runs with the sessions
                prompts.extend(_suite_file(Path(name)))
            continue
        if name not in SUITES:
            raise LocalspecError(f"Unknown suite '{name}'; choose from {', '.join((*SUITES, SESSIONS))}.")
        text = resources.files("localspec").joinpath("bench_prompts", f"{name}.yaml").read_text()
        prompts.extend(parse_prompts(text, name))
    return prompts


def _suite_file(path: Path) -> list[Prompt]:
    """A suite of your own (a YAML file), in the shipped
    suites' format: `name:` and `prompts:`."""
    try:
        prompts = parse_prompts(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise LocalspecError(f"Cannot read the suite file {path}: {e.strerror or e}.") from None
    except (yaml.YAMLError, KeyError, TypeError) as e:
        raise LocalspecError(f"{path} is not a suite file (a `name:` and a list of `prompts:`): {e}") from None
    if not prompts:
        raise LocalspecError(f"{path} lists no prompts.")
    return prompts


def parse_prompts(text: str, suite: str | None = None) -> list[Prompt]:
    """The prompts of one suite file (`prompts:`), named after `suite` or the file's own `name:`. A
    structured prompt is a mapping: its `kind` says what the answer must be (extract: an object of its
    `schema`; tool: a call of one of its `tools`; rewrite: any JSON)."""
    data = yaml.safe_load(text)
    name = suite or data["name"]
    return [_prompt(name, i, p) for i, p in enumerate(data["prompts"])]


def _prompt(suite: str, index: int, item: Any) -> Prompt:
    if isinstance(item, str):
        return Prompt(suite, index, item)
    from localspec.structured import call_grammar, json_grammar, schema_grammar, tools_of

    kind = item["kind"]
    if kind == "extract":
        return Prompt(suite, index, item["text"], grammar=schema_grammar(item["schema"], f"{suite}-{index + 1}"))
    if kind == "tool":
        return Prompt(suite, index, item["text"], grammar=call_grammar(tools_of(item["tools"])), tools=tuple(item["tools"]))
    if kind == "rewrite":
        return Prompt(suite, index, item["text"], grammar=json_grammar())
    raise LocalspecError(f"{suite}-{index + 1}: unknown kind '{kind}' (extract, tool or rewrite).")

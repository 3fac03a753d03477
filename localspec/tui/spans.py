"""Rounds of the engine as coloured spans of text: accepted draft, rejected draft, the target's own.

Pure functions (no widgets) so the chat view, the details screen and the history share one rendering.
"""

from __future__ import annotations

import json

from textual.content import Content

from localspec.engine.events import Round

ACCEPTED, REJECTED, TARGET = "accepted", "rejected", "target"

STYLES = {
    ACCEPTED: "$text-success",
    REJECTED: "$text-error strike dim",
    TARGET: "",
}

Span = tuple[str, str]  # (kind, text)


def round_spans(event: Round) -> list[Span]:
    """Accepted draft, then what the target threw away, then the token the target chose itself."""
    if event.text != event.accepted_text + event.token_text:
        # A stop string cut or held back text: show what the answer really gained, uncoloured.
        spans = [(TARGET, event.text)] if event.text else []
        return spans + ([(REJECTED, event.rejected_text)] if event.rejected_text else [])
    spans = []
    if event.accepted_text:
        spans.append((ACCEPTED, event.accepted_text))
    if event.rejected_text:
        spans.append((REJECTED, event.rejected_text))
    if event.token_text:
        spans.append((TARGET, event.token_text))
    return spans


def merge(spans: list[Span], more: list[Span]) -> list[Span]:
    """Append, joining neighbours of one kind (keeps stored spans and rendered content small)."""
    for kind, text in more:
        if not text:
            continue
        if spans and spans[-1][0] == kind:
            spans[-1] = (kind, spans[-1][1] + text)
        else:
            spans.append((kind, text))
    return spans


def answer_text(spans: list[Span]) -> str:
    return "".join(text for kind, text in spans if kind != REJECTED)


def render(spans: list[Span], show_rejected: bool = True) -> Content:
    parts = [(text, STYLES[kind]) for kind, text in spans if show_rejected or kind != REJECTED]
    return Content.assemble(*parts)


def split_at_last_line(spans: list[Span], show_rejected: bool = True) -> tuple[list[Span] | None, list[Span]]:
    """Cut at the last newline shown: (the finished lines, without that newline; the line being written).
    No later token changes how the finished lines look. None: no line is finished yet."""
    for i in range(len(spans) - 1, -1, -1):
        kind, text = spans[i]
        if kind == REJECTED and not show_rejected:
            continue
        cut = text.rfind("\n")
        if cut != -1:
            head = spans[:i] + ([(kind, text[:cut])] if text[:cut] else [])
            tail = ([(kind, text[cut + 1:])] if text[cut + 1:] else []) + spans[i + 1:]
            return head, tail
    return None, spans


def as_markdown(text: str) -> str:
    """An answer as the log shows it: a whole-JSON answer (the "json" output setting) as an indented JSON
    block, anything else as the Markdown it is."""
    if not text:
        return "*(no text)*"
    if text.lstrip()[:1] in ("{", "["):
        try:
            return "```json\n" + json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n```"
        except ValueError:
            pass
    return text

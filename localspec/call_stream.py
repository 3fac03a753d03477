"""Tool calls out of an answer while it streams: text is passed on as it comes, except what may still
become a call; a call's name is sent once it is known and its arguments as they are generated (the
OpenAI SDK's streamed `tool_calls` deltas). The same answer, complete, gives the calls `parse_calls`
finds (tests/test_call_stream.py feeds answers in every split)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from localspec.structured import CALL_CLOSE, CALL_OPEN, Call, Tool, new_call_id, parse_calls

# A call's JSON up to its arguments' value, in the order the call grammar (and Qwen's template) writes it.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_BARE_STARTS = ("{", "```json")  # an answer that may be a call's JSON alone: held until it is complete


@dataclass
class Text:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class Arguments:
    index: int
    text: str


Piece = Text | CallStart | Arguments


class _ObjectEnd:
    """Where a JSON object ends, read a character at a time (strings and escapes skipped)."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped = 0, False, False

    def ends_at(self, c: str) -> bool:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
            return False
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


class CallStream:
    """Feed it an answer's text in pieces; it returns what may be passed on so far."""

    def __init__(self, tools: list[Tool]):
        self.tools = tools
        self.known = {t.name for t in tools}
        self.calls = 0            # calls begun
        self._buffer = ""         # text not passed on yet
        self._mode = "start"      # start (nothing passed on yet), text, head, arguments, tail
        self._end = _ObjectEnd()
        self._steps = {"start": self._start, "text": self._text, "head": self._head, "arguments": self._arguments,
                       "tail": self._tail}

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[Piece]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            before = (self._mode, len(self._buffer))
            self._steps[self._mode](out, final)
            if (self._mode, len(self._buffer)) == before:
                return out

    def _start(self, out: list[Piece], final: bool) -> None:
        head = self._buffer.lstrip()
        undecided = any(s.startswith(head) for s in _BARE_STARTS)
        if any(head.startswith(s) for s in _BARE_STARTS) or undecided and head:
            if not final:
                return
            content, calls = parse_calls(self._buffer, self.tools)
            for call in calls:
                self._whole(out, call)
            self._buffer = content if calls else self._buffer
            self._mode = "text"
            return
        if head or final:
            self._mode = "text"

    def _text(self, out: list[Piece], final: bool) -> None:
        at = self._buffer.find(CALL_OPEN)
        if at >= 0:
            self._pass(out, self._buffer[:at].rstrip())
            self._buffer = self._buffer[at + len(CALL_OPEN):]
            self._mode = "head"
            return
        keep = 0 if final else next((n for n in range(len(CALL_OPEN) - 1, 0, -1)
                                     if self._buffer.endswith(CALL_OPEN[:n])), 0)
        text, self._buffer = self._buffer[:len(self._buffer) - keep], self._buffer[len(self._buffer) - keep:]
        if text.strip() or final and not self.calls:
            self._pass(out, text)
        elif text:
            self._buffer = text + self._buffer  # whitespace alone waits: it may only separate calls

    def _pass(self, out: list[Piece], text: str) -> None:
        if text:
            out.append(Text(text))

    def _head(self, out: list[Piece], final: bool) -> None:
        match = _HEAD.match(self._buffer)
        if match is not None and match.group(1) in self.known:
            out.append(CallStart(self.calls, new_call_id(), match.group(1)))
            self._buffer = self._buffer[match.end():]
            self._end = _ObjectEnd()
            self._mode = "arguments"
            return
        close = self._buffer.find(CALL_CLOSE)
        if close < 0 and not final:
            return
        # Not the call format streamed piece by piece (another key order, an unknown tool): whole, or text.
        block = self._buffer if close < 0 else self._buffer[:close]
        self._buffer = "" if close < 0 else self._buffer[close + len(CALL_CLOSE):]
        _content, calls = parse_calls(CALL_OPEN + block + CALL_CLOSE, self.tools)
        if calls:
            self._whole(out, calls[0])
        else:
            self._pass(out, CALL_OPEN + block + (CALL_CLOSE if close >= 0 else ""))
        self._mode = "text"

    def _whole(self, out: list[Piece], call: Call) -> None:
        """A call passed on at once (parsed from its complete text)."""
        out += [CallStart(self.calls, call.id, call.name), Arguments(self.calls, json.dumps(call.arguments))]
        self.calls += 1

    def _arguments(self, out: list[Piece], final: bool) -> None:
        for i, c in enumerate(self._buffer):
            if self._end.ends_at(c):
                out.append(Arguments(self.calls, self._buffer[:i + 1]))
                self._buffer = self._buffer[i + 1:]
                self.calls += 1
                self._mode = "tail"
                return
        if self._buffer:
            out.append(Arguments(self.calls, self._buffer))
            self._buffer = ""

    def _tail(self, out: list[Piece], final: bool) -> None:
        close = self._buffer.find(CALL_CLOSE)
        if close >= 0:
            self._buffer = self._buffer[close + len(CALL_CLOSE):]
            self._mode = "text"
        elif final:
            self._buffer = ""

"""Structured output and tool calls, as every dialect (and the bench) asks for them: the grammar a request's fields
mean (a JSON schema is converted by llama.cpp's own converter, through llama-cpp-python), the tools a
chat template is rendered with, and the calls parsed back out of the answer.

Tool calls use the model's own template (the GGUF's Jinja, as llama.cpp's `--jinja` renders it) and
its own call format; localspec knows Qwen2.5's (and Hermes') `<tool_call>{"name", "arguments"}</tool_call>`
and refuses tools for a template without it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from localspec.engine.constraint import check_size
from localspec.errors import LocalspecError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


def llama_cpp_grammar(grammar: str | None, json_schema: dict | None) -> str | None:
    """llama.cpp's `grammar` (GBNF) or `json_schema` (converted), on any endpoint that takes sampling fields."""
    if grammar is not None and json_schema is not None:
        raise LocalspecError("Give grammar or json_schema, not both.")
    return schema_grammar(json_schema, "json_schema") if json_schema is not None else grammar


def json_grammar() -> str:
    """Any JSON object (OpenAI's `json_object`, Ollama's `format: "json"`)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def schema_grammar(schema: Any, field: str, root: str = "") -> str:
    """The GBNF of a JSON schema; a 400 naming `field` when it is not one the converter takes."""
    from llama_cpp.llama_grammar import SchemaConverter

    if not isinstance(schema, dict):
        raise LocalspecError(f"{field} must be a JSON schema (an object).")
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        converter.visit(converter.resolve_refs(schema, "request"), root)
        grammar = converter.format_grammar()
    except Exception as exc:  # the converter raises what it meets: KeyError, ValueError, AssertionError …
        raise LocalspecError(f"{field}: this JSON schema cannot be turned into a grammar ({type(exc).__name__}: "
                            f"{exc}).") from None
    check_size(grammar, field)
    return grammar


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def as_template_value(self) -> dict:
        """The OpenAI shape chat templates expect (`{"type": "function", "function": {...}}`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def tools_of(raw: list[Any] | None, field: str = "tools") -> list[Tool]:
    """OpenAI's and Ollama's `tools` (the same function shape), checked."""
    tools = []
    for i, item in enumerate(raw or []):
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(item, dict) or item.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise LocalspecError(f"{field}[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": …, "
                                "\"parameters\": {…}}}}.")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise LocalspecError(f"{field}[{i}].function.parameters must be a JSON schema (an object).")
        tools.append(Tool(fn["name"], str(fn.get("description") or ""), params))
    return tools


def check_template(template: str) -> None:
    """Tools need a template that lists them and a call format localspec parses."""
    if "tools" not in template or CALL_OPEN not in template:
        raise LocalspecError("tools: this model's chat template has no tool-call format localspec knows (it parses "
                            "Qwen2.5's <tool_call> calls); send the request without tools.")


def call_grammar(tools: list[Tool], only: str | None = None, several: bool = False) -> str:
    """One call of one of `tools` (or of the tool named `only`), in the template's call format;
    `several`: one or more calls, a line apart (parallel tool calls)."""
    chosen = [t for t in tools if only is None or t.name == only]
    if not chosen:
        raise LocalspecError(f"tool_choice names '{only}', which is not among the tools.")
    calls = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
              "required": ["name", "arguments"]} for t in chosen]
    schema = calls[0] if len(calls) == 1 else {"oneOf": calls}
    body = schema_grammar(schema, "tools", root="call")
    block = f'"{CALL_OPEN}\\n" call "\\n{CALL_CLOSE}"'
    root = f'{block} ("\\n" {block})*' if several else block
    return body.rstrip("\n") + f"\nroot ::= {root}\n"


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict


def parse_calls(text: str, tools: list[Tool]) -> tuple[str, list[Call]]:
    """(the text outside the calls, the calls) of an answer; a block that is not a call of a known tool
    with an object of arguments stays text. Small models sometimes answer with the call's JSON alone,
    bare or in a ```json fence, instead of the template's format: a whole answer that is exactly a call
    of a known tool counts as one."""
    if not tools:
        return text, []
    known = {t.name for t in tools}
    calls: list[Call] = []
    kept: list[str] = []
    last = 0
    for start, end in _blocks(text):
        call = _call(text[start + len(CALL_OPEN):end - len(CALL_CLOSE)], known)
        if call is not None:
            kept.append(text[last:start])
            last = end
            calls.append(call)
    kept.append(text[last:])
    if not calls and (bare := _call(_unfenced(text.strip()), known)) is not None:
        return "", [bare]
    return ("".join(kept).strip(), calls) if calls else (text, [])


def _blocks(text: str):
    """(start, end) of each CALL_OPEN … CALL_CLOSE block, each open closed by the first close after it.
    By `str.find`, not a regular expression: a lazy `.*?` between whitespace runs backtracks in cubic
    time on an answer of spaces (2,000 took seconds)."""
    pos = 0
    while (start := text.find(CALL_OPEN, pos)) >= 0:
        close = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if close < 0:
            return
        pos = close + len(CALL_CLOSE)
        yield start, pos


def _unfenced(text: str) -> str:
    """The inside of a ```json … ``` (or ``` … ```) fence around the whole text, else the text."""
    if len(text) >= 6 and text.startswith("```") and text.endswith("```"):
        inner = text[3:-3]
        return (inner[4:] if inner.startswith("json") else inner).strip()
    return text


def _call(text: str, known: set[str]) -> Call | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in known or not isinstance(data.get("arguments", {}), dict):
        return None
    return Call(new_call_id(), data["name"], data.get("arguments", {}))


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates read them: a call's arguments as an object (OpenAI sends a JSON
    string), content never None."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise LocalspecError("tool_calls must be a list of calls.")
            m["tool_calls"] = [_call_for_template(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _call_for_template(call: dict) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        raise LocalspecError('Each of tool_calls must be {"function": {"name": ..., "arguments": ...}}.')
    fn = dict(fn)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args) if args.strip() else {}
        except ValueError:
            raise LocalspecError("tool_calls[].function.arguments must be a JSON object (as a string).") from None
    return {**call, "function": fn}

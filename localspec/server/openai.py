"""The OpenAI dialect (the openai SDK, Continue, llama.vscode chat): chat and legacy completions, models."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any, Iterable, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from localspec.call_stream import CallStart, CallStream, Piece, Text
from localspec.engine.events import Prefill, Round, Summary
from localspec.engine.session import MEDIA_MARKER
from localspec.server import logprobs as lp
from localspec.server.images import ImageSources, from_url
from localspec.server.common import (ApiError, Loose, SamplingFields, Served, StreamFormat, collect,
                                     compact, fim_tokens, finish_reason, speculation, stream)
from localspec.structured import (Tool, call_grammar, check_template, json_grammar, llama_cpp_grammar,
                                         parse_calls, schema_grammar, template_messages, tools_of)

DEFAULT_TEMPERATURE = 1.0  # OpenAI's


class StreamOptions(Loose):
    include_usage: bool = False


class ChatMessage(Loose):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = None
    tool_calls: list[dict] | None = None   # an assistant's earlier calls
    tool_call_id: str | None = None        # a tool's result: which call it answers
    name: str | None = None

    def for_template(self, sources: ImageSources = ImageSources()) -> dict:
        text, images = _content(self.content, sources)
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": text}
        if images:
            out["images"] = images
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n_predict: int | None = Field(None, ge=-1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16)
    response_format: dict | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict] | None = None
    function_call: str | dict | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(SamplingFields):
    model: str | None = None
    prompt: str | list[str]
    suffix: str | None = None
    max_tokens: int | None = Field(16, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    n: int = Field(1, ge=1, le=16)
    logprobs: int | None = None   # legacy completions: the alternatives per token (0: the token's own only)


def _content(content, sources: ImageSources) -> tuple[str, list[bytes]]:
    """A message's text, with MEDIA_MARKER where each of its `image_url` parts stands, and those images."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    parts, images = [], []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append(str(part.get("text", "")))
        elif kind == "image_url":
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            images.append(from_url(str(url or ""), sources, f"content[{i}].image_url"))
            parts.append(MEDIA_MARKER)
        else:
            raise ApiError(400, f"Message parts of type '{kind}' are not supported; send text or image_url.")
    return "".join(parts), images


def router(served: Served) -> APIRouter:
    api = APIRouter(prefix="/v1")

    @api.get("/models")
    def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                            "owned_by": "localspec"}]}

    @api.post("/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        served.check_model(body.model)
        if body.functions or body.function_call:
            raise ApiError(400, "functions and function_call are OpenAI's deprecated form; send tools and tool_choice.")

        def prepare() -> tuple[list[Tool], str | None, list[int]]:  # (on a thread: schemas, template, tokenizing)
            tools, grammar = _structure(served, body)
            messages = template_messages([m.for_template(ImageSources(served.images_from_files, served.images_from_urls)) for m in body.messages])
            listed = [t.as_template_value() for t in tools] or None
            return tools, grammar, served.chat_tokens(messages, listed)

        tools, grammar, tokens = await asyncio.to_thread(prepare)
        limit = body.max_completion_tokens or body.max_tokens or body.n_predict
        return await _answer(served, request, body, tokens, limit, chat=True, grammar=grammar, tools=tools)

    @api.post("/completions")
    async def completions(body: CompletionRequest, request: Request):
        served.check_model(body.model)
        if isinstance(body.prompt, list):
            if len(body.prompt) != 1:
                raise ApiError(400, "Send one prompt per request (a list of several is not supported).")
            prompt = body.prompt[0]
        else:
            prompt = body.prompt

        def prepare() -> tuple[list[int], str | None]:
            if body.suffix is not None:
                tokens = fim_tokens(served, prompt, body.suffix, [], n_predict=body.max_tokens or 16)
            else:
                tokens = served.text_tokens(prompt, special=False)
            return tokens, llama_cpp_grammar(body.grammar, body.json_schema)

        tokens, grammar = await asyncio.to_thread(prepare)
        return await _answer(served, request, body, tokens, max(1, body.max_tokens or 16), chat=False,
                             echo=prompt if body.echo else "", grammar=grammar, urgent=body.suffix is not None)

    return api


def _structure(served: Served, body: ChatRequest) -> tuple[list[Tool], str | None]:
    """The tools the template lists (none for tool_choice "none") and the grammar the request's
    structured-output fields ask for."""
    tools = tools_of(body.tools)
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    function = choice.get("function") if isinstance(choice, dict) else None
    named = function.get("name") if isinstance(function, dict) else None
    if not (choice in ("auto", "none", "required") or isinstance(named, str)):
        raise ApiError(400, 'tool_choice must be "auto", "none", "required" or {"type": "function", '
                            '"function": {"name": …}}.')
    if choice == "none":
        tools = []
    elif tools:
        check_template(served.engine.chat_template)
    elif choice != "auto":
        raise ApiError(400, "tool_choice asks for a call, but the request has no tools.")
    forced = call_grammar(tools, named, several=choice == "required" and _parallel(body)) \
        if choice == "required" or named else None
    asked = [g for g in (forced, _response_format(body.response_format), llama_cpp_grammar(body.grammar, body.json_schema))
             if g is not None]
    if len(asked) > 1:
        raise ApiError(400, "Ask for one structure: a forced tool call, response_format, or grammar/json_schema.")
    return tools, asked[0] if asked else None


def _response_format(fmt: dict | None) -> str | None:
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar()
    if kind == "json_schema":
        spec = (fmt or {}).get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ApiError(400, 'response_format.json_schema must be {"name": …, "schema": {…}}.')
        return schema_grammar(spec["schema"], "response_format.json_schema.schema")
    raise ApiError(400, f"response_format.type must be text, json_object or json_schema (got '{kind}').")


async def _answer(served: Served, request: Request, body: ChatRequest | CompletionRequest, tokens: list[int],
                  limit: int | None, *, chat: bool, echo: str = "", grammar: str | None = None,
                  tools: list[Tool] | None = None, urgent: bool = False) -> Response:
    """The rest of both endpoints: queue the job, then stream it (SSE) or answer once with the whole text.
    With tools, the answer's calls are parsed out of it (and streamed once the answer is complete)."""
    endpoint = "chat" if chat else "completions"
    top = _top(body, echo)
    n = body.n  # choices of one prompt: its sequences, seeded with the request's seed plus each one's index
    job = await asyncio.to_thread(served.job, tokens, limit, body, DEFAULT_TEMPERATURE, endpoint, grammar=grammar,
                                  urgent=urgent, tools=tools, parallel_calls=_parallel(body), logprobs=top, n=n)
    prefill, events = await served.start(job, request)
    ident, created = _ident(chat), int(time.time())
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        kind = "chat.completion.chunk" if chat else "text_completion"
        return _sse(served, events, prefill, ident, created, kind, usage, chat=chat, tools=tools, n=n,
                    logprobs=top is not None)
    kept = [lp.Pending() for _ in range(n)]
    _prefills, summaries = await collect(request, job, events, lambda i, event: kept[i].add(event))
    return JSONResponse({
        "id": ident, "object": "chat.completion" if chat else "text_completion", "created": created,
        "model": served.name,
        "choices": [_choice(i, summaries[i], tools or [], chat, echo, _logprobs(served, chat, kept[i], top, len(echo)))
                    for i in range(n)],
        "usage": _usage(prefill, summaries),
        "localspec": speculation(summaries[0]),
    })


def _parallel(body: ChatRequest | CompletionRequest) -> bool:
    """Several calls in one answer only when asked for (llama.cpp's server's default too: small models
    asked for one call tend to repeat it)."""
    return isinstance(body, ChatRequest) and body.parallel_tool_calls is True


def _top(body: ChatRequest | CompletionRequest, echo: str) -> int | None:
    """Alternatives per token when log-probabilities are asked for, else None."""
    if isinstance(body, ChatRequest):
        return lp.top_count(body.logprobs, body.top_logprobs)
    if body.logprobs is None:
        return None
    if echo:
        raise ApiError(400, "echo with logprobs (the prompt's log-probabilities) is not supported; send one of them.")
    return lp.checked_top(body.logprobs, "logprobs")


def _logprobs(served: Served, chat: bool, kept: lp.Pending, top: int | None, offset: int) -> dict | None:
    if top is None:
        return None
    piece = served.vocab.token_bytes
    return lp.openai_content(piece, kept.take()) if chat else lp.openai_legacy(piece, kept.take(), offset)


def _choice(index: int, summary: Summary, tools: list[Tool], chat: bool, echo: str,
            logprobs: dict | None = None) -> dict[str, Any]:
    """One choice of a finished answer: its message (with the tool calls parsed out of it) or text."""
    content, calls = parse_calls(summary.text, tools)
    finish = "tool_calls" if calls else finish_reason(summary)
    if not chat:
        return {"index": index, "text": echo + summary.text, "logprobs": logprobs, "finish_reason": finish}
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}


def _usage(prefill: Prefill, summaries: Iterable[Summary]) -> dict:
    """OpenAI's usage of one prompt and its answers (several for `n`)."""
    generated = sum(s.generated_tokens for s in summaries)
    return {"prompt_tokens": prefill.prompt_tokens, "completion_tokens": generated,
            "total_tokens": prefill.prompt_tokens + generated}


def _ident(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def _sse(served: Served, events, prefill: Prefill, ident: str, created: int, kind: str, usage: bool,
         chat: bool, tools: list[Tool] | None = None, n: int = 1, logprobs: bool = False) -> StreamingResponse:
    """A streamed answer, or `n` answers of one prompt (events as (choice, event)), each chunk naming its
    choice. With `tools`, an answer's tool calls are sent as `tool_calls` deltas as they are generated
    (the call's id and name, then its arguments in pieces) and the rest as content. With `logprobs`,
    each chunk carries those of the tokens since the one before (the last chunk any left)."""
    def chunk(choices: list, **extra) -> bytes:
        return b"data: " + compact({"id": ident, "object": kind, "created": created, "model": served.name,
                                    "choices": choices, **extra}) + b"\n\n"

    summaries: dict[int, Summary] = {}

    def one(index: int) -> StreamFormat:
        calls = CallStream(tools) if tools and chat else None
        pending, offset = lp.Pending(), [0]

        def logprobs_now() -> dict | None:
            if not logprobs:
                return None
            items, piece = pending.take(), served.vocab.token_bytes
            if chat:
                return lp.openai_content(piece, items)
            out = lp.openai_legacy(piece, items, offset[0])
            offset[0] += sum(len(token) for token in out["tokens"])
            return out

        def choice(text: str | None, finish: str | None) -> dict:
            if chat:
                delta = {} if text is None else {"content": text}
                return {"index": index, "delta": delta, "logprobs": logprobs_now(), "finish_reason": finish}
            return {"index": index, "text": text or "", "logprobs": logprobs_now(), "finish_reason": finish}

        def delta(piece: Piece) -> bytes:
            if isinstance(piece, Text):
                return chunk([choice(piece.text, None)])
            call: dict[str, Any] = {"index": piece.index}
            if isinstance(piece, CallStart):
                call.update(id=piece.id, type="function", function={"name": piece.name, "arguments": ""})
            else:
                call["function"] = {"arguments": piece.text}
            return chunk([{"index": index, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}])

        def text(event: Round) -> bytes | None:
            pending.add(event)
            if not event.text:
                return None
            if calls is None:
                return chunk([choice(event.text, None)])
            return b"".join(delta(p) for p in calls.feed(event.text)) or None

        def summary(event: Summary) -> list[bytes]:
            summaries[index] = event
            rest = [delta(p) for p in calls.finish()] if calls is not None else []
            finish = "tool_calls" if calls is not None and calls.calls else finish_reason(event)
            last = [chunk([choice(None, finish)], localspec=speculation(event))]
            totals = [chunk([], usage=_usage(prefill, summaries.values()))] if usage and len(summaries) == n else []
            return rest + last + totals

        return StreamFormat(media_type="text/event-stream", round=text, summary=summary, error=error)

    def error(exc: ApiError) -> bytes:
        return b"data: " + compact({"error": {"message": exc.message, "type": exc.kind}}) + b"\n\n"

    roles = [chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}]) for i in range(n)] if chat else []
    formats = [one(i) for i in range(n)]
    return stream(events, dataclasses.replace(formats[0], opening=roles, closing=[b"data: [DONE]\n\n"],
                                              choices=formats if n > 1 else ()))

"""The OpenAI dialect (the openai SDK, Continue, llama.vscode chat): chat and legacy completions, models."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from localspec.engine.events import Prefill, Summary
from localspec.server.common import (ApiError, Loose, SamplingFields, Served, StreamFormat, collect, compact,
                                     fim_tokens, finish_reason, speculation, stream)

DEFAULT_TEMPERATURE = 1.0  # OpenAI's


class StreamOptions(Loose):
    include_usage: bool = False


class ChatMessage(Loose):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = None


class ChatRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n_predict: int | None = Field(None, ge=-1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)


class CompletionRequest(SamplingFields):
    model: str | None = None
    prompt: str | list[str]
    suffix: str | None = None
    max_tokens: int | None = Field(16, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    n: int = Field(1, ge=1, le=1)


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        else:
            raise ApiError(400, f"Message parts of type '{part.get('type')}' are not supported; send text.")
    return "".join(parts)


def router(served: Served) -> APIRouter:
    api = APIRouter(prefix="/v1")

    @api.get("/models")
    def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                            "owned_by": "localspec"}]}

    @api.post("/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        served.check_model(body.model)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}
                    for m in body.messages]
        limit = body.max_completion_tokens or body.max_tokens or body.n_predict
        return await _answer(served, request, body, served.chat_tokens(messages), limit, chat=True)

    @api.post("/completions")
    async def completions(body: CompletionRequest, request: Request):
        served.check_model(body.model)
        if isinstance(body.prompt, list):
            if len(body.prompt) != 1:
                raise ApiError(400, "Send one prompt per request (a list of several is not supported).")
            prompt = body.prompt[0]
        else:
            prompt = body.prompt
        if body.suffix is not None:
            tokens = fim_tokens(served, prompt, body.suffix, [], n_predict=body.max_tokens or 16)
        else:
            tokens = served.text_tokens(prompt, special=False)
        return await _answer(served, request, body, tokens, max(1, body.max_tokens or 16), chat=False,
                             echo=prompt if body.echo else "")

    return api


async def _answer(served: Served, request: Request, body: ChatRequest | CompletionRequest, tokens: list[int],
                  limit: int | None, *, chat: bool, echo: str = "") -> Response:
    """The rest of both endpoints: queue the job, then stream it (SSE) or answer once with the whole text."""
    job = served.job(tokens, limit, body, DEFAULT_TEMPERATURE, "chat" if chat else "completions")
    prefill, events = await served.start(job, request)
    ident, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        kind = "chat.completion.chunk" if chat else "text_completion"
        return _sse(served, events, prefill, ident, created, kind, usage, chat=chat)
    summary = await collect(request, job, events)
    choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": summary.text}} if chat
                              else {"index": 0, "text": echo + summary.text})
    return JSONResponse({
        "id": ident, "object": "chat.completion" if chat else "text_completion", "created": created,
        "model": served.name, "choices": [choice | {"logprobs": None, "finish_reason": finish_reason(summary)}],
        "usage": _usage(prefill, summary),
        "localspec": speculation(summary),
    })


def _usage(prefill: Prefill, summary: Summary) -> dict:
    return {"prompt_tokens": prefill.prompt_tokens, "completion_tokens": summary.generated_tokens,
            "total_tokens": prefill.prompt_tokens + summary.generated_tokens}


def _sse(served: Served, events, prefill: Prefill, ident: str, created: int, kind: str, usage: bool,
         chat: bool) -> StreamingResponse:
    def chunk(choices: list, **extra) -> bytes:
        return b"data: " + compact({"id": ident, "object": kind, "created": created, "model": served.name,
                                    "choices": choices, **extra}) + b"\n\n"

    def choice(text: str | None, finish: str | None) -> dict:
        if chat:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def summary(event: Summary) -> list[bytes]:
        last = [chunk([choice(None, finish_reason(event))], localspec=speculation(event))]
        return last + ([chunk([], usage=_usage(prefill, event))] if usage else [])

    role = chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
    return stream(events, StreamFormat(
        media_type="text/event-stream",
        opening=[role] if chat else [],
        round=lambda event: chunk([choice(event.text, None)]) if event.text else None,
        summary=summary,
        closing=[b"data: [DONE]\n\n"],
        error=lambda exc: b"data: " + compact({"error": {"message": exc.message, "type": exc.kind}}) + b"\n\n",
    ))

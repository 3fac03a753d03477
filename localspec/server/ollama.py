"""The Ollama dialect (Continue's "ollama" provider and many plugins): /api/tags, show, version, generate, chat."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from localspec import __version__
from localspec.engine.events import Prefill, Summary
from localspec.server.common import (ApiError, Loose, SamplingFields, Served, StreamFormat, collect, compact,
                                     fim_tokens, finish_reason, speculation)
from localspec.server.common import stream as stream_events  # `stream` is also a request field here

DEFAULT_TEMPERATURE = 0.8  # Ollama's


class Options(SamplingFields):
    num_predict: int | None = Field(None, ge=-2)
    num_ctx: int | None = Field(None, ge=1)


class GenerateRequest(Loose):
    model: str
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    raw: bool = False
    stream: bool = True
    options: Options = Options()
    keep_alive: str | int | None = None


class ChatMessage(Loose):
    role: str
    content: str = ""


class ChatRequest(Loose):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = True
    options: Options = Options()


class ShowRequest(Loose):
    model: str | None = None
    name: str | None = None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def router(served: Served) -> APIRouter:
    api = APIRouter(prefix="/api")

    def details() -> dict:
        return {"format": "gguf", "family": served.family, "families": [served.family] if served.family else None,
                "parameter_size": "", "quantization_level": served.quantization}

    @api.get("/version")
    def version():
        return {"version": f"0.6.0-localspec-{__version__}"}

    @api.get("/tags")
    def tags():
        modified = datetime.fromtimestamp(served.created or time.time(), timezone.utc).isoformat()
        return {"models": [{"name": f"{served.name}:latest", "model": f"{served.name}:latest", "modified_at": modified,
                            "size": served.size, "digest": "", "details": details()}]}

    @api.post("/show")
    def show(body: ShowRequest):
        name = body.model or body.name
        if not name:
            raise ApiError(400, "model is required")
        served.check_model(name)
        fim = served.vocab.fim_pre >= 0
        return {
            "modelfile": "",
            "parameters": f"num_ctx {served.n_ctx}\ntemperature {DEFAULT_TEMPERATURE}",
            # Continue decides FIM support by `.Suffix` in the template.
            "template": "{{ if .Suffix }}<fim>{{ .Prompt }}{{ .Suffix }}{{ else }}{{ .Prompt }}{{ end }}" if fim
                        else "{{ .Prompt }}",
            "details": details(),
            "model_info": {"general.architecture": served.family, "general.context_length": served.n_ctx},
            "capabilities": ["completion", "insert"] if fim else ["completion"],
        }

    @api.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        served.check_model(body.model)
        if body.suffix is not None and not body.raw:
            tokens = fim_tokens(served, body.prompt, body.suffix, [], n_predict=body.options.num_predict or 128)
        elif body.raw:
            tokens = served.text_tokens(body.prompt, special=True)
        else:
            if not body.prompt:
                # Ollama loads the model and answers done for an empty prompt.
                return Response(compact({"model": body.model, "created_at": _now(), "response": "", "done": True,
                                         "done_reason": "load"}) + b"\n", media_type="application/x-ndjson")
            messages = ([{"role": "system", "content": body.system}] if body.system else []) + \
                [{"role": "user", "content": body.prompt}]
            tokens = served.chat_tokens(messages)
        return await _respond(served, request, body.model, body.options, tokens, body.stream, "generate", chat=False)

    @api.post("/chat")
    async def chat(body: ChatRequest, request: Request):
        served.check_model(body.model)
        tokens = served.chat_tokens([{"role": m.role, "content": m.content} for m in body.messages])
        return await _respond(served, request, body.model, body.options, tokens, body.stream, "api_chat", chat=True)

    return api


async def _respond(served: Served, request: Request, model: str, options: Options, tokens: list[int], stream: bool,
                   endpoint: str, chat: bool):
    limit = options.num_predict if options.num_predict is not None and options.num_predict >= 0 else None
    job = served.job(tokens, limit, options, DEFAULT_TEMPERATURE, endpoint)
    prefill, events = await served.start(job, request)

    def line(text: str | None, summary: Summary | None = None) -> bytes:
        out: dict = {"model": model, "created_at": _now()}
        if chat:
            out["message"] = {"role": "assistant", "content": text or ""}
        else:
            out["response"] = text or ""
        out["done"] = summary is not None
        if summary is not None:
            out.update(_final(prefill, summary))
        return compact(out) + b"\n"

    if not stream:
        summary = await collect(request, job, events)
        return Response(line(summary.text, summary), media_type="application/json")
    return stream_events(events, StreamFormat(
        media_type="application/x-ndjson",
        round=lambda event: line(event.text) if event.text else None,
        summary=lambda event: [line("", event)],
        error=lambda exc: compact({"error": exc.message}) + b"\n",
    ))


def _final(prefill: Prefill, summary: Summary) -> dict:
    ns = 1_000_000_000
    return {
        "done_reason": finish_reason(summary),
        "total_duration": int((prefill.seconds + summary.wall_s) * ns),
        "load_duration": 0,
        "prompt_eval_count": prefill.evaluated,
        "prompt_eval_duration": int(prefill.seconds * ns),
        "eval_count": summary.generated_tokens,
        "eval_duration": int(summary.wall_s * ns),
        "localspec": speculation(summary),
    }

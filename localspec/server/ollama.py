"""The Ollama dialect (Continue's "ollama" provider and many plugins): /api/tags, show, version, generate, chat."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from localspec import __version__
from localspec.engine.events import Prefill, Round, Summary
from localspec.engine.session import with_images
from localspec.server import logprobs as lp
from localspec.server.images import from_base64
from localspec.server.common import (ApiError, Loose, SamplingFields, Served, StreamFormat, collect, compact,
                                     fim_tokens, finish_reason, speculation)
from localspec.server.common import stream as stream_events  # `stream` is also a request field here
from localspec.structured import (CALL_OPEN, Call, Tool, check_template, json_grammar, parse_calls, schema_grammar,
                                         template_messages, tools_of)

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
    format: str | dict | None = None     # "json" or a JSON schema the answer must follow
    logprobs: bool = False
    top_logprobs: int | None = None
    images: list[str] | None = None      # base64, placed before the prompt


class ChatMessage(Loose):
    role: str
    content: str = ""
    tool_calls: list[dict] | None = None  # an assistant's earlier calls (arguments as objects, Ollama's way)
    images: list[str] | None = None       # base64, placed before the text (as Ollama's clients expect)

    def for_template(self, where: str) -> dict:
        message = {"role": self.role, "content": self.content,
                   **({"tool_calls": self.tool_calls} if self.tool_calls else {})}
        images = [from_base64(image, f"{where}.images[{i}]") for i, image in enumerate(self.images or ())]
        return with_images(message, images)


class ChatRequest(Loose):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = True
    options: Options = Options()
    format: str | dict | None = None
    tools: list[dict] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None


class ShowRequest(Loose):
    model: str | None = None
    name: str | None = None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def router(served: Served) -> APIRouter:
    api = APIRouter(prefix="/api")

    @api.get("/version")
    def version():
        return {"version": f"0.6.0-localspec-{__version__}"}

    @api.get("/tags")
    def tags():
        modified = datetime.fromtimestamp(served.created or time.time(), timezone.utc).isoformat()
        return {"models": [{"name": f"{served.name}:latest", "model": f"{served.name}:latest", "modified_at": modified,
                            "size": served.size, "digest": "", "details": _details(served)}]}

    @api.post("/show")
    def show(body: ShowRequest):
        return _show(served, body)

    @api.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        served.check_model(body.model)
        _refuse(body, ("template", "context"))
        if not body.prompt and body.suffix is None and not body.raw:
            # Ollama loads the model and answers done for an empty prompt.
            return Response(compact({"model": body.model, "created_at": _now(), "response": "", "done": True,
                                     "done_reason": "load"}) + b"\n", media_type="application/x-ndjson")

        def prepare() -> tuple[list[int], str | None]:  # (on a thread: templates, tokenizing, schemas take a while)
            images = [from_base64(image, f"images[{i}]") for i, image in enumerate(body.images or ())]
            if body.suffix is not None and not body.raw:
                if images:
                    raise ApiError(400, "images are not taken with a suffix (fill-in-the-middle).")
                tokens = fim_tokens(served, body.prompt, body.suffix, [], n_predict=body.options.num_predict or 128)
            elif body.raw:
                prompt = with_images({"role": "user", "content": body.prompt}, images)["content"]
                tokens = served.text_tokens(prompt, special=True, images=images)
            else:
                messages = ([{"role": "system", "content": body.system}] if body.system else []) + \
                    [with_images({"role": "user", "content": body.prompt}, images)]
                tokens = served.chat_tokens(messages)
            return tokens, _format(body.format)

        tokens, grammar = await asyncio.to_thread(prepare)
        return await _respond(served, request, body.model, body.options, tokens, body.stream, "generate", chat=False,
                              grammar=grammar, urgent=body.suffix is not None and not body.raw,
                              top=lp.top_count(body.logprobs, body.top_logprobs))

    @api.post("/chat")
    async def chat(body: ChatRequest, request: Request):
        served.check_model(body.model)
        def prepare() -> tuple[list[Tool], list[int], str | None]:
            tools = tools_of(body.tools)
            if tools:
                check_template(served.engine.chat_template)
            messages = template_messages([m.for_template(f"messages[{i}]") for i, m in enumerate(body.messages)])
            tokens = served.chat_tokens(messages, [t.as_template_value() for t in tools] or None)
            return tools, tokens, _format(body.format)

        tools, tokens, grammar = await asyncio.to_thread(prepare)
        return await _respond(served, request, body.model, body.options, tokens, body.stream, "api_chat", chat=True,
                              grammar=grammar, tools=tools,
                              top=lp.top_count(body.logprobs, body.top_logprobs))

    return api


def _refuse(body: Loose, names: tuple[str, ...]) -> None:
    """Ollama fields localspec does not implement (a custom template, the deprecated token `context`): a 400
    naming them when they are used, never silently ignored."""
    for name in names:
        if (body.model_extra or {}).get(name):
            raise ApiError(400, f"{name} is not supported by localspec; send the request without it.")


def _details(served: Served) -> dict:
    return {"format": "gguf", "family": served.family, "families": [served.family] if served.family else None,
            "parameter_size": "", "quantization_level": served.quantization}


def _show(served: Served, body: ShowRequest) -> dict:
    name = body.model or body.name
    if not name:
        raise ApiError(400, "model is required")
    served.check_model(name)
    fim = served.vocab.fim_pre >= 0
    tools = CALL_OPEN in served.engine.chat_template
    return {
        "modelfile": "",
        "parameters": f"num_ctx {served.n_ctx}\ntemperature {DEFAULT_TEMPERATURE}",
        # Continue decides FIM support by `.Suffix` in the template.
        "template": "{{ if .Suffix }}<fim>{{ .Prompt }}{{ .Suffix }}{{ else }}{{ .Prompt }}{{ end }}" if fim
                    else "{{ .Prompt }}",
        "details": _details(served),
        "model_info": {"general.architecture": served.family, "general.context_length": served.n_ctx},
        "capabilities": ["completion", *(["insert"] if fim else []), *(["tools"] if tools else [])],
    }


def _format(fmt: str | dict | None) -> str | None:
    """Ollama's `format`: "json" (any JSON) or a JSON schema; "" or absent: free text."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return json_grammar()
    if isinstance(fmt, dict):
        return schema_grammar(fmt, "format")
    raise ApiError(400, f'format must be "json" or a JSON schema (got {fmt!r}).')


async def _respond(served: Served, request: Request, model: str, options: Options, tokens: list[int], stream: bool,
                   endpoint: str, chat: bool, grammar: str | None = None, tools: list[Tool] | None = None,
                   urgent: bool = False, top: int | None = None):
    """With tools, the answer's calls are parsed out of it, and a stream sends them in its last line.
    `top`: log-probabilities asked for, with this many alternatives per token; each line carries those
    of its tokens."""
    limit = options.num_predict if options.num_predict is not None and options.num_predict >= 0 else None
    job = await asyncio.to_thread(served.job, tokens, limit, options, DEFAULT_TEMPERATURE, endpoint, grammar=grammar,
                                  urgent=urgent, tools=tools, logprobs=top,
                                  parallel_calls=True)  # Ollama has no field for it and returns every call
    prefill, events = await served.start(job, request)
    pending = lp.Pending()

    def line(text: str | None, summary: Summary | None = None, calls: list[Call] | None = None) -> bytes:
        out: dict = {"model": model, "created_at": _now()}
        if chat:
            out["message"] = {"role": "assistant", "content": text or ""}
            if calls:
                out["message"]["tool_calls"] = [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        else:
            out["response"] = text or ""
        if top is not None:
            out["logprobs"] = lp.token_entries(served.vocab.token_bytes, pending.take())
        out["done"] = summary is not None
        if summary is not None:
            out.update(_final(prefill, summary))
        return compact(out) + b"\n"

    if not stream or tools:
        _, [summary] = await collect(request, job, events, lambda _i, event: pending.add(event))
        content, calls = parse_calls(summary.text, tools or [])
        if not stream:
            return Response(line(content, summary, calls), media_type="application/json")
        return Response(line(content) + line("", summary, calls), media_type="application/x-ndjson")

    def streamed(event: Round) -> bytes | None:
        pending.add(event)
        return line(event.text) if event.text else None

    return stream_events(events, StreamFormat(
        media_type="application/x-ndjson",
        round=streamed,
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

"""localspec's own stream: every engine event as one NDJSON line (for `localspec chat --connect` and tools).

    POST /localspec/v1/generate {"messages": [...]} or {"prompt": "..."}, plus max_tokens and sampling fields
    -> {"type":"prefill",...}\\n {"type":"round",...}\\n ... {"type":"summary",...}\\n
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from localspec.engine.events import Prefill, Round, Summary
from localspec.engine.session import with_images
from localspec.server.images import from_base64
from localspec.server.common import Loose, SamplingFields, Served, StreamFormat, compact, stream
from localspec.structured import llama_cpp_grammar


class Message(Loose):
    role: str
    content: str
    images: list[str] = []  # base64; standing where the content marks each, else before it


class GenerateRequest(SamplingFields):
    messages: list[Message] | None = None
    prompt: str | None = None
    max_tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def one_input(self):
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("send exactly one of messages or prompt")
        return self


def router(served: Served) -> APIRouter:
    api = APIRouter(prefix="/localspec/v1")

    @api.get("/info")
    def info():
        engine = served.engine
        return {"model": served.name, "n_ctx": served.n_ctx, "has_draft": "model" in engine.drafters,
                "drafters": list(engine.drafters), "baseline_tokens_per_s": engine.baseline_tokens_per_s,
                "sees_images": engine.projector is not None}

    @api.post("/generate")
    async def generate(body: GenerateRequest, request: Request):

        def prepare():  # (on a thread: the template, tokenizing and a schema take a while)
            if body.messages is not None:
                tokens = served.chat_tokens([
                    with_images({"role": m.role, "content": m.content},
                                [from_base64(data, f"messages[{i}].images[{j}]") for j, data in enumerate(m.images)])
                    for i, m in enumerate(body.messages)])
            else:
                tokens = served.text_tokens(body.prompt or "", special=False)
            return served.job(tokens, body.max_tokens, body, 0.0, "native",
                              grammar=llama_cpp_grammar(body.grammar, body.json_schema))

        job = await asyncio.to_thread(prepare)
        first, events = await served.start(job, request)

        def line(event: Prefill | Round | Summary) -> bytes:
            return compact(event.to_dict()) + b"\n"

        return stream(events, StreamFormat(
            media_type="application/x-ndjson",
            opening=[line(first)],
            round=line,
            summary=lambda event: [line(event)],
            error=lambda exc: compact({"type": "error", "message": exc.message}) + b"\n",
        ))

    return api

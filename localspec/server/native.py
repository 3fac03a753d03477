"""localspec's own stream: every engine event as one NDJSON line (for `localspec chat --connect` and tools).

    POST /localspec/v1/generate {"messages": [...]} or {"prompt": "..."}, plus max_tokens and sampling fields
    -> {"type":"prefill",...}\\n {"type":"round",...}\\n ... {"type":"summary",...}\\n
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import Field, model_validator

from localspec.engine.events import Prefill
from localspec.server.common import ApiError, Loose, SamplingFields, Served, compact


class Message(Loose):
    role: str
    content: str


class GenerateRequest(SamplingFields):
    messages: list[Message] | None = None
    prompt: str | None = None
    max_tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def one_input(self):
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("send exactly one of messages or prompt")
        return self


def event_dict(event) -> dict:
    if isinstance(event, Prefill):
        return {"type": "prefill", **asdict(event)}
    return event.to_dict()


def router(served: Served) -> APIRouter:
    api = APIRouter(prefix="/localspec/v1")

    @api.get("/info")
    def info():
        cost = getattr(served.engine, "cost", None)
        return {"model": served.name, "n_ctx": served.n_ctx, "has_draft": served.engine.draft is not None,
                "baseline_tokens_per_s": getattr(cost, "plain_tokens_per_s", 0.0)}

    @api.post("/generate")
    async def generate(body: GenerateRequest):
        if body.messages is not None:
            tokens = served.chat_tokens([{"role": m.role, "content": m.content} for m in body.messages])
        else:
            tokens = served.vocab.tokenize(body.prompt or "", add_special=True, parse_special=False)
        job = served.job(tokens, body.max_tokens, body, 0.0, "native")
        first, events = await served.start(job)

        async def lines():
            try:
                yield compact(event_dict(first)) + b"\n"
                async for event in events:
                    yield compact(event_dict(event)) + b"\n"
            except ApiError as exc:
                yield compact({"type": "error", "message": exc.message}) + b"\n"
            finally:
                await events.aclose()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return api

"""The llama.cpp server dialect (llama.vim, llama.vscode): /health, /props, /completion, /infill."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import Field

from localspec.engine.events import Prefill, Round, Summary
from localspec.server.common import (ApiError, Loose, SamplingFields, Served, StreamFormat, collect, compact,
                                     fim_tokens, speculation, stream)

DEFAULT_TEMPERATURE = 0.8  # llama.cpp's


class ExtraChunk(Loose):
    filename: str = "tmp"
    text: str = ""


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    n_predict: int = Field(-1, ge=-1, le=1_000_000)
    stream: bool = False
    n_indent: int = Field(0, ge=0)
    t_max_predict_ms: int | None = Field(None, ge=0)
    response_fields: list[str] | None = None
    n_cmpl: int | None = Field(None, ge=1, le=16)
    n: int | None = Field(None, ge=1, le=16)
    model: str | None = None


class InfillRequest(CompletionRequest):
    prompt: str = ""
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraChunk] = []


def router(served: Served) -> APIRouter:
    api = APIRouter()

    @api.get("/health")
    def health() -> Response:
        return Response(compact({"status": "ok"}), media_type="application/json")

    @api.get("/props")
    def props() -> Response:
        return Response(compact({
            "default_generation_settings": {"n_ctx": served.n_ctx, "temperature": DEFAULT_TEMPERATURE,
                                            "model": served.name},
            "total_slots": 1,
            "model_path": served.name,
            "chat_template": served.engine.template_source,
            "build_info": "localspec",
        }), media_type="application/json")

    @api.post("/completion")
    @api.post("/completions")
    async def completion(body: CompletionRequest, request: Request):
        served.check_model(body.model)
        if isinstance(body.prompt, list):
            tokens = list(body.prompt)
        else:
            tokens = served.text_tokens(body.prompt, special=True)
        return await _respond(served, request, body, tokens, "completion")

    @api.post("/infill")
    async def infill(body: InfillRequest, request: Request):
        served.check_model(body.model)
        extra = [(c.filename or "tmp", c.text) for c in body.input_extra]
        tokens = fim_tokens(served, body.input_prefix, body.input_suffix, extra, body.prompt,
                            n_predict=body.n_predict if body.n_predict > 0 else 128)
        return await _respond(served, request, body, tokens, "infill")

    return api


async def _respond(served: Served, request: Request, body: CompletionRequest, tokens: list[int], endpoint: str):
    n_predict = body.n_predict
    warm_up = n_predict == 0
    count = body.n_cmpl or body.n or 1
    if body.stream:
        if count > 1:
            raise ApiError(400, "n_cmpl > 1 is not supported with stream; ask for one completion per request.")
        return await _stream(served, body, tokens, endpoint)
    results = []
    for i in range(count):
        job = served.job(tokens, 1 if warm_up else n_predict, body, DEFAULT_TEMPERATURE, endpoint,
                         seed=None if body.seed is None else body.seed + i)
        prefill, events = await served.start(job)
        limits = Limits(body.n_indent, body.t_max_predict_ms)
        text: list[str] = []

        def on_round(event: Round) -> None:
            text.append(limits.feed(event.text))
            if limits.hit:
                job.cancel.set()

        summary = await collect(request, job, events, on_round)
        content = "" if warm_up else "".join(text)
        results.append(_shape(_result(served, content, prefill, summary, limits.hit, warm_up), body.response_fields))
    body_out = results[0] if count == 1 else results
    return Response(compact(body_out), media_type="application/json")


async def _stream(served: Served, body: CompletionRequest, tokens: list[int], endpoint: str) -> StreamingResponse:
    job = served.job(tokens, 1 if body.n_predict == 0 else body.n_predict, body, DEFAULT_TEMPERATURE, endpoint)
    prefill, events = await served.start(job)
    limits = Limits(body.n_indent, body.t_max_predict_ms)

    def chunk(event: Round) -> bytes | None:
        piece = limits.feed(event.text)
        if limits.hit:
            job.cancel.set()
        return b"data: " + compact({"content": piece, "stop": False, "index": 0}) + b"\n\n" if piece else None

    def final(event: Summary) -> list[bytes]:
        result = _result(served, "", prefill, event, limits.hit, body.n_predict == 0)
        return [b"data: " + compact(_shape(result, body.response_fields)) + b"\n\n"]

    return stream(events, StreamFormat(
        media_type="text/event-stream",
        round=chunk,
        summary=final,
        error=lambda exc: b"data: " + compact({"error": {"code": exc.status, "message": exc.message,
                                                         "type": exc.kind}}) + b"\n\n",
    ))


def _result(served: Served, content: str, prefill: Prefill, summary: Summary, limited: bool, warm_up: bool) -> dict:
    predicted = 0 if warm_up else summary.generated_tokens
    predicted_ms = summary.wall_s * 1000
    prompt_ms = prefill.seconds * 1000
    timings = {
        "prompt_n": prefill.evaluated,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prefill.evaluated, 3) if prefill.evaluated else 0.0,
        "prompt_per_second": round(prefill.evaluated / prefill.seconds, 3) if prefill.seconds > 0 else 0.0,
        "predicted_n": predicted,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted, 3) if predicted else 0.0,
        "predicted_per_second": round(summary.tokens_per_s, 3),
        # Not a llama.cpp field: from the request reaching the engine to the first answer token
        # (prompt_ms plus the first draft/verify round).
        "first_token_ms": round(summary.first_token_s * 1000, 3),
    }
    if summary.drafted:
        timings["draft_n"] = summary.drafted
        timings["draft_n_accepted"] = summary.accepted
    return {
        "content": content,
        "index": 0,
        "model": served.name,
        "tokens_predicted": predicted,
        "tokens_evaluated": prefill.prompt_tokens,
        "tokens_cached": prefill.cached,
        "truncated": False,
        "stop": True,
        "stop_type": stop_type(summary, limited),
        "generation_settings": {"n_ctx": served.n_ctx, "model": served.name},
        "timings": timings,
        "localspec": speculation(summary),
    }


def _shape(result: dict, fields: list[str] | None) -> dict:
    """`response_fields`: a flat object keyed by the requested paths; paths that resolve to nothing are left out."""
    if fields is None:
        return result
    out: dict[str, Any] = {}
    for path in fields:
        node: Any = result
        for part in path.split("/") if path else []:
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                node = None
                break
        else:
            if path:
                out[path] = node
                continue
        # unresolved (or empty) path: omitted
    return out


def stop_type(summary: Summary, limited: bool) -> str:
    """llama.cpp's names for why a generation ended."""
    if limited:
        return "limit"
    return {"eog": "eos", "stop": "word", "length": "limit"}.get(summary.stop_reason, "limit")


class Limits:
    """llama.cpp's editor limits on a completion: `n_indent` and `t_max_predict_ms`.

    n_indent: once a line starts with less indentation than this, the completion ends before it.
    t_max_predict_ms: after this long (from the first token) and once a newline was produced, end.
    """

    def __init__(self, n_indent: int = 0, t_max_predict_ms: int | None = None):
        self.n_indent = n_indent
        self.t_max = t_max_predict_ms / 1000 if t_max_predict_ms else None
        self.text = ""
        self.hit = False
        self._started: float | None = None

    def feed(self, piece: str) -> str:
        """The part of `piece` to emit; sets `hit` when the completion must end."""
        if self.hit or not piece:
            return ""
        if self._started is None:
            self._started = time.perf_counter()
        before = len(self.text)
        self.text += piece
        if self.n_indent > 0:
            offset = 0
            for i, line in enumerate(self.text.split("\n")):
                stripped = line.lstrip(" \t")
                if i > 0 and stripped and len(line) - len(stripped) < self.n_indent:
                    self.hit = True
                    self.text = self.text[:offset]
                    return self.text[before:] if len(self.text) > before else ""
                offset += len(line) + 1
        if self.t_max and "\n" in self.text and time.perf_counter() - self._started > self.t_max:
            self.hit = True
        return self.text[before:]

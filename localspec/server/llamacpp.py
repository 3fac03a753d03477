"""The llama.cpp server dialect (llama.vim, llama.vscode): /health, /props, /completion, /infill."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import Field

from localspec import __version__
from localspec.engine.events import Prefill, Round, Summary
from localspec.engine.sampling import SamplingSettings
from localspec.server import logprobs as lp
from localspec.server.images import from_base64
from localspec.server.common import (ApiError, Loose, SamplingFields, Served, StreamFormat, collect,
                                     compact, fim_tokens, speculation, stream)
from localspec.structured import llama_cpp_grammar

DEFAULT_TEMPERATURE = 0.8  # llama.cpp's


class ExtraChunk(Loose):
    filename: str = "tmp"
    text: str = ""


class MultimodalPrompt(Loose):
    """llama-server's prompt with media: the text with a `<__media__>` marker where each image stands, and
    the images as base64, in order."""
    prompt_string: str
    multimodal_data: list[str] = []


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | MultimodalPrompt
    n_predict: int = Field(-1, ge=-1, le=1_000_000)
    stream: bool = False
    n_indent: int = Field(0, ge=0)
    t_max_predict_ms: int | None = Field(None, ge=0)
    response_fields: list[str] | None = None
    n_cmpl: int | None = Field(None, ge=1, le=16)
    n: int | None = Field(None, ge=1, le=16)
    model: str | None = None
    samplers: list[str] | str | None = None  # llama.cpp's chain, e.g. llama.vim's ["top_k", "top_p", "infill"]
    n_probs: int = 0  # each token's log-probability and this many alternatives' (0: none)


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
        # llama.cpp's shape (server-context.cpp, get_res_props); llama.vscode reads default_generation_settings.n_ctx.
        d = SamplingSettings()
        vocab = served.vocab
        return Response(compact({
            "default_generation_settings": {
                "params": {"n_predict": -1, "temperature": DEFAULT_TEMPERATURE, "top_k": d.top_k, "top_p": d.top_p,
                           "min_p": d.min_p, "repeat_penalty": d.repeat_penalty, "repeat_last_n": d.repeat_last_n,
                           "n_indent": 0, "t_max_predict_ms": -1, "stop": [], "seed": -1},
                "n_ctx": served.n_ctx,
            },
            "total_slots": len(served.engine.slot_tokens()),
            "model_alias": served.name,
            "model_path": served.name,
            "chat_template": served.engine.chat_template,
            "bos_token": vocab.text(vocab.bos) if vocab.bos >= 0 else "",
            "eos_token": vocab.text(vocab.eos) if vocab.eos >= 0 else "",
            "build_info": f"localspec {__version__}",
        }), media_type="application/json")

    @api.get("/slots")
    def slots() -> Response:
        """llama.cpp's /slots, in part: each slot's id, context, whether a request generates on it now,
        and the tokens its cache holds."""
        busy = served.engine.slots_busy()
        return Response(compact([{"id": i, "id_task": -1, "n_ctx": served.n_ctx, "speculative": True,
                                  "is_processing": busy[i], "n_tokens_cached": n}
                                 for i, n in enumerate(served.engine.slot_tokens())]),
                        media_type="application/json")

    @api.post("/completion")
    @api.post("/completions")
    async def completion(body: CompletionRequest, request: Request):
        served.check_model(body.model)
        if isinstance(body.prompt, list):
            tokens = list(body.prompt)
        elif isinstance(body.prompt, MultimodalPrompt):
            prompt = body.prompt
            images = [from_base64(data, f"prompt.multimodal_data[{i}]") for i, data in enumerate(prompt.multimodal_data)]
            tokens = await asyncio.to_thread(served.text_tokens, prompt.prompt_string, special=True, images=images)
        else:  # (off the event loop: a large body takes a while to tokenize, and /health must answer meanwhile)
            tokens = await asyncio.to_thread(served.text_tokens, body.prompt, special=True)
        return await _respond(served, request, body, tokens, "completion")

    @api.post("/infill")
    async def infill(body: InfillRequest, request: Request):
        served.check_model(body.model)
        extra = [(c.filename or "tmp", c.text) for c in body.input_extra]
        tokens = await asyncio.to_thread(fim_tokens, served, body.input_prefix, body.input_suffix, extra, body.prompt,
                                         n_predict=body.n_predict if body.n_predict > 0 else 128)
        return await _respond(served, request, body, tokens, "infill")

    return api


async def _respond(served: Served, request: Request, body: CompletionRequest, tokens: list[int], endpoint: str):
    n_predict = body.n_predict
    warm_up = n_predict == 0
    count = body.n_cmpl or body.n or 1
    grammar = await asyncio.to_thread(llama_cpp_grammar, body.grammar, body.json_schema)
    if body.stream:
        if count > 1:
            raise ApiError(400, "n_cmpl > 1 is not supported with stream; ask for one completion per request.")
        return await _stream(served, request, body, tokens, endpoint, grammar)
    if count > 1 and not warm_up:
        return await _respond_each(served, request, body, tokens, endpoint, grammar, count)
    job = served.job(tokens, 1 if warm_up else n_predict, body, DEFAULT_TEMPERATURE, endpoint, seed=body.seed,
                     grammar=grammar, urgent=endpoint == "infill" and not warm_up,  # (a warm-up only fills a cache)
                     logprobs=_top(body))
    prefill, events = await served.start(job, request)
    limits = Limits(body.n_indent, body.t_max_predict_ms)
    kept = lp.Pending()

    def on_round(_i: int, event: Round) -> None:
        kept.add(event)
        limits.feed(event)
        if limits.hit:
            job.limit(0)

    _, [summary] = await collect(request, job, events, on_round)
    content = "" if warm_up else limits.text
    result = _shape({**_result(served, content, prefill, summary, limits.hit, warm_up),
                     **_probabilities(served, body, kept)}, body.response_fields)
    return Response(compact(result if count == 1 else [result]), media_type="application/json")


async def _respond_each(served: Served, request: Request, body: CompletionRequest, tokens: list[int], endpoint: str,
                        grammar: str | None, count: int) -> Response:
    """`n_cmpl` completions of one prompt, its sequences decoded together: one array."""
    job = served.job(tokens, body.n_predict, body, DEFAULT_TEMPERATURE, endpoint, seed=body.seed, grammar=grammar,
                     urgent=endpoint == "infill", logprobs=_top(body), n=count)
    first, events = await served.start(job, request)
    limits = [Limits(body.n_indent, body.t_max_predict_ms) for _ in range(count)]
    kept = [lp.Pending() for _ in range(count)]

    def on_round(i: int, event: Round) -> None:
        kept[i].add(event)
        limits[i].feed(event)
        if limits[i].hit:
            job.limit(i)

    prefills, summaries = await collect(request, job, events, on_round)
    prefills[0] = first
    results = [_shape({**_result(served, limits[i].text, prefills[i], summaries[i], limits[i].hit, False), "index": i,
                       **_probabilities(served, body, kept[i])}, body.response_fields) for i in range(count)]
    return Response(compact(results), media_type="application/json")


async def _stream(served: Served, request: Request, body: CompletionRequest, tokens: list[int],
                  endpoint: str, grammar: str | None) -> StreamingResponse:
    job = served.job(tokens, 1 if body.n_predict == 0 else body.n_predict, body, DEFAULT_TEMPERATURE, endpoint,
                     grammar=grammar, urgent=endpoint == "infill" and body.n_predict != 0, logprobs=_top(body))
    prefill, events = await served.start(job, request)
    limits = Limits(body.n_indent, body.t_max_predict_ms)
    pending = lp.Pending()

    def chunk(event: Round) -> bytes | None:
        pending.add(event)
        piece = limits.feed(event)
        if limits.hit:
            job.limit(0)
        if not piece:
            return None
        return b"data: " + compact({"content": piece, "stop": False, "index": 0,
                                    **_probabilities(served, body, pending)}) + b"\n\n"

    def final(event: Summary) -> list[bytes]:
        result = {**_result(served, "", prefill, event, limits.hit, body.n_predict == 0),
                  **_probabilities(served, body, pending)}
        return [b"data: " + compact(_shape(result, body.response_fields)) + b"\n\n"]

    return stream(events, StreamFormat(
        media_type="text/event-stream",
        round=chunk,
        summary=final,
        error=lambda exc: b"data: " + compact({"error": {"code": exc.status, "message": exc.message,
                                                         "type": exc.kind}}) + b"\n\n",
    ))


def _top(body: CompletionRequest) -> int | None:
    """llama.cpp's n_probs: alternatives per token, log-probabilities asked for when above 0."""
    return lp.checked_top(body.n_probs, "n_probs") if body.n_probs else None


def _probabilities(served: Served, body: CompletionRequest, kept: lp.Pending) -> dict:
    """`completion_probabilities` of the tokens since the last chunk, when n_probs asks for them."""
    if not body.n_probs:
        return {}
    return {"completion_probabilities": lp.llama_cpp(served.vocab.token_bytes, kept.take())}


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
        "tokens_cached": summary.kv_tokens,  # llama.cpp: the slot's cache after the request, not the reuse
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
    """llama.cpp's names for why a generation ended (server-task.cpp, stop_type_to_str)."""
    if limited:
        return "limit"
    return {"eog": "eos", "stop": "word", "length": "limit", "context": "limit"}.get(summary.stop_reason, "none")


class Limits:
    """llama.cpp's editor limits, applied token by token as its server does (tools/server/
    server-context.cpp, process_token):

    - n_indent: once a newline has been generated, each later line must start with at least this much
      indentation; the first that does not is cut where its text starts (its indentation stays) and
      the completion ends.
    - t_max_predict_ms: once this long has passed since the first token, the completion ends with the
      next token whose text contains a newline (that token included): it ends at a line boundary.
    """

    def __init__(self, n_indent: int = 0, t_max_predict_ms: int | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.n_indent = n_indent
        self.t_max = t_max_predict_ms / 1000 if t_max_predict_ms else None
        self.clock = clock
        self.generated = ""            # every token's text (llama.cpp's generated_text)
        self.visible = ""              # the engine's visible text (stop strings held back)
        self.sent = 0                  # characters of it passed on
        self.cut: int | None = None    # where the completion ends, in `generated`
        self._has_new_line = False
        self._last_nl_pos = 0
        self._started: float | None = None

    @property
    def hit(self) -> bool:
        return self.cut is not None

    @property
    def text(self) -> str:
        """The completion as it ends: llama.cpp erases a line cut by n_indent even where parts of it were
        already streamed."""
        return self.visible if self.cut is None else self.visible[:self.cut]

    def feed(self, event: Round) -> str:
        """The part of this round's text to pass on; sets `hit` when the completion ends in it."""
        if self.hit:
            return ""
        if self._started is None:
            self._started = self.clock()
        # A round that only releases text held back for a stop string has no tokens of its own.
        tokens = event.pieces or ((event.text,) if event.accepted or event.token is not None else ())
        for piece in tokens:
            self._token(piece)
            if self.hit:
                break
        self.visible += event.text
        end = len(self.visible) if self.cut is None else min(self.cut, len(self.visible))
        out = self.visible[self.sent:end]
        self.sent = max(self.sent, end)
        return out

    def _token(self, piece: str) -> None:
        self.generated += piece
        if self._has_new_line and self.n_indent > 0:
            if self._last_nl_pos > 0:
                pos, indent = self._last_nl_pos, 0
                while pos < len(self.generated) and self.generated[pos] in " \t":
                    pos, indent = pos + 1, indent + 1
                if pos < len(self.generated) and indent < self.n_indent:
                    self.cut = pos
                    return
            newline = self.generated.find("\n", self._last_nl_pos)
            if newline != -1:
                self._last_nl_pos = newline + 1
        if "\n" in piece:
            self._has_new_line = True
            assert self._started is not None
            if self.t_max is not None and self.clock() - self._started > self.t_max:
                self.cut = len(self.generated)

"""Embeddings in every dialect: OpenAI's /v1/embeddings, Ollama's /api/embed and /api/embeddings,
llama.cpp's /embedding and /embeddings.

They come from `serve --embedding-model` when it is given, else from the served target's own weights
(llama.cpp pools any model, as `llama-server --embeddings` does). Each text is evaluated on the engine's
thread between the steps of the generations running (Scheduler.call), so indexing a codebase never
stalls a chat for more than one step."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import Field

from localspec.errors import LocalspecError
from localspec.server.common import ApiError, Loose, Served, answers_to, compact

MAX_INPUTS = 2048  # texts in one request (OpenAI's limit)


@dataclass
class EmbeddingModel:
    """What answers embedding requests, and the names it answers to. `open` makes its embedder
    (backend/embedding.py) on the engine's thread, on first use."""

    name: str
    aliases: frozenset[str]
    open: Callable[[], Any]
    _embedder: Any = field(default=None, repr=False)

    def embedder(self):
        if self._embedder is None:
            self._embedder = self.open()
        return self._embedder


def target_embeddings(served: Served) -> EmbeddingModel | None:
    """The served target's weights pooled, where the engine holds them in this process."""
    from localspec.engine.backend import Model
    from localspec.engine.backend.embedding import Embedder

    target = getattr(served.engine, "target", None)
    if not isinstance(target, Model):  # (an engine in another process: its weights are not here)
        return None
    return EmbeddingModel(served.name, served.aliases, lambda: Embedder.borrowing(target))


def embedding_model(id_or_path: str, n_gpu_layers: int | None = None) -> EmbeddingModel:
    """`serve --embedding-model`: a catalog id or a GGUF path, loaded now (a bad file fails the start)."""
    from localspec.engine.backend import ModelOptions
    from localspec.engine.backend.embedding import Embedder
    from localspec.names import is_path, resolve

    path = resolve(id_or_path)[0]
    if not path.exists():
        raise LocalspecError(f"No such file: {path}" if is_path(id_or_path) else
                             f"'{id_or_path}' is not pulled yet. Run: localspec pull {id_or_path}")
    embedder = Embedder.load(path, ModelOptions(n_gpu_layers=n_gpu_layers))
    name = path.stem if is_path(id_or_path) else id_or_path
    return EmbeddingModel(name, frozenset({name, path.name, path.stem}), lambda: embedder, embedder)


def _chosen(served: Served, requested: str | None) -> EmbeddingModel:
    """The embedding model a request names (any of its names; none: the first one served)."""
    models = served.embeddings
    if not models:
        raise ApiError(501, "This server cannot compute embeddings: its engine runs in another process; "
                            "start it with --embedding-model FILE.", "not_supported_error")
    if not requested:
        return models[0]
    for model in models:
        if answers_to(model.aliases, requested):
            return model
    names = sorted({m.name for m in models})
    raise ApiError(404, f"Unknown model '{requested}'. Embeddings here come from {', '.join(names)}.",
                   "not_found_error")


def _inputs(value: Any, field_name: str) -> list[str | list[int]]:
    """A text, a list of texts, a list of token ids, or a list of lists of token ids."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) or (isinstance(v, list) and v and all(
            isinstance(t, int) and not isinstance(t, bool) for t in v)) for v in value):
        if not value:
            raise ApiError(400, f"{field_name} is an empty list; send at least one text.")
        if len(value) > MAX_INPUTS:
            raise ApiError(400, f"{field_name} has {len(value)} entries; at most {MAX_INPUTS} per request.")
        return list(value)
    raise ApiError(400, f"{field_name} must be a text, a list of texts, or token ids.")


def normalized(vector: np.ndarray, norm: int = 2) -> np.ndarray:
    """llama.cpp's embd_normalize: -1 none, 0 max absolute (to an int16 range), 1 taxicab, 2 Euclidean, p > 2 p-norm."""
    v = vector.astype(np.float64)
    if norm == -1:
        scale = 1.0
    elif norm == 0:
        scale = float(np.abs(v).max()) / 32760.0
    elif norm == 2:
        scale = float(np.sqrt((v * v).sum()))
    else:
        scale = float((np.abs(v) ** norm).sum() ** (1.0 / norm))
    return (v / scale if scale > 0 else v * 0).astype(np.float32)


async def embed(served: Served, model: EmbeddingModel, inputs: list[str | list[int]], *, truncate: bool,
                endpoint: str) -> list[tuple[np.ndarray, int]]:
    """Each input's pooled, unnormalized vector and its token count, in order."""
    scheduler = served.scheduler
    try:
        embedder = model._embedder or await scheduler.call(_opening(model))
        tokens = await asyncio.to_thread(lambda: [embedder.tokens(x) if isinstance(x, str) else list(x) for x in inputs])
        out = []
        for i, ids in enumerate(tokens):
            if len(ids) > embedder.max_tokens:
                if not truncate:
                    raise ApiError(400, f"Input {i} is {len(ids)} tokens; {model.name} embeds at most "
                                        f"{embedder.max_tokens} (send shorter texts, or truncate: true).")
                ids = ids[:embedder.max_tokens]
            if not ids:
                raise ApiError(400, f"Input {i} is empty.")
            vector = await scheduler.call(embedder.steps(ids), endpoint=endpoint if i == 0 else "")
            out.append((vector, len(ids)))
        return out
    except LocalspecError as exc:
        raise ApiError(400, str(exc)) from None


def _opening(model: EmbeddingModel):
    """Its embedder, made on the engine's thread (a llama.cpp context beside the engine's)."""
    yield model.embedder()


def _dimensions(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    """OpenAI's and Ollama's `dimensions`: the first n components (for models trained to be cut, as
    Matryoshka ones are), normalized again."""
    if dimensions is None or dimensions == len(vector):
        return vector
    if not 1 <= dimensions <= len(vector):
        raise ApiError(400, f"dimensions must be between 1 and {len(vector)} for this model (got {dimensions}).")
    return normalized(vector[:dimensions])


class OpenAIRequest(Loose):
    input: Any = None
    content: Any = None  # llama.cpp's field
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    embd_normalize: int = 2


class OllamaEmbed(Loose):
    model: str = ""
    input: Any = None
    truncate: bool = True
    dimensions: int | None = None


class OllamaEmbeddings(Loose):
    model: str = ""
    prompt: str = Field("", min_length=1)


def router(served: Served) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/embeddings")
    async def openai(body: OpenAIRequest):
        if body.input is None:
            if body.content is not None:
                return await llama_cpp(body)
            raise ApiError(400, '"input" must be provided.')
        if body.encoding_format not in ("float", "base64"):
            raise ApiError(400, f"encoding_format must be float or base64 (got '{body.encoding_format}').")
        model = _chosen(served, body.model)
        results = await embed(served, model, _inputs(body.input, "input"), truncate=False, endpoint="embeddings")
        data = []
        for i, (vector, _n) in enumerate(results):
            v = _dimensions(normalized(vector, body.embd_normalize), body.dimensions)
            value: Any = base64.b64encode(v.astype("<f4").tobytes()).decode() if body.encoding_format == "base64" \
                else v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": value})
        used = sum(n for _v, n in results)
        return _json({"object": "list", "data": data, "model": body.model or model.name,
                      "usage": {"prompt_tokens": used, "total_tokens": used}})

    @api.post("/embedding")
    @api.post("/embeddings")
    async def llama_cpp(body: OpenAIRequest):
        value = body.content if body.content is not None else body.input
        if value is None:
            raise ApiError(400, '"input" or "content" must be provided.')
        model = _chosen(served, body.model)
        results = await embed(served, model, _inputs(value, "content"), truncate=False, endpoint="embedding")
        return _json([{"index": i, "embedding": [normalized(v, body.embd_normalize).tolist()]}
                      for i, (v, _n) in enumerate(results)])

    @api.post("/api/embed")
    async def ollama_embed(body: OllamaEmbed):
        model = _chosen(served, body.model)
        if body.input is None or body.input == "":
            raise ApiError(400, "input is required.")
        results = await embed(served, model, _inputs(body.input, "input"), truncate=body.truncate,
                              endpoint="api_embed")
        vectors = [_dimensions(normalized(v), body.dimensions).tolist() for v, _n in results]
        return _json({"model": body.model or model.name, "embeddings": vectors,
                      "prompt_eval_count": sum(n for _v, n in results)})

    @api.post("/api/embeddings")
    async def ollama_embeddings(body: OllamaEmbeddings):
        """Ollama's older endpoint: one text, its vector not normalized (as Ollama answers it)."""
        model = _chosen(served, body.model)
        [(vector, _n)] = await embed(served, model, [body.prompt], truncate=True, endpoint="api_embeddings")
        return _json({"embedding": vector.tolist()})

    return api


def _json(obj: Any) -> Response:
    return Response(compact(obj), media_type="application/json")

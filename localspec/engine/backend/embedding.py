"""Pooled text embeddings from a GGUF's weights: a llama.cpp context of its own, with embeddings on.

On the served target it borrows the target's loaded weights (no second copy); `serve --embedding-model`
loads a file of its own. The pooling is the file's (`{arch}.pooling_type`: CLS, mean, last), or the
mean of the tokens' final hidden states for a file that names none (a chat model), which is what
llama.cpp's mean pooling computes (`Llama(embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN)`).

With causal attention (chat models, Qwen3-Embedding) a text is evaluated in chunks of `chunk` tokens,
each a separate decode over the KV cache the chunks before it left, and the pooling is done here over
the chunks' per-token states: a server runs one chunk between two steps of its generations instead of
stalling them for a whole text. Bidirectional encoders (BERT and its kin) see the whole text in one
micro-batch, as llama.cpp requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import llama_cpp as L
import numpy as np

from localspec.engine.backend.gguf import Vocab, _load_model, _Metadata
from localspec.engine.backend.llama import Model, free_context
from localspec.engine.backend.options import ModelOptions
from localspec.engine.backend.system import problems_mark, problems_since
from localspec.errors import LocalspecError

POOLINGS = {L.LLAMA_POOLING_TYPE_MEAN: "mean", L.LLAMA_POOLING_TYPE_CLS: "cls", L.LLAMA_POOLING_TYPE_LAST: "last"}
# Tokens one text may have (the file's own training context when smaller): a causal model's KV cache for
# it stays small beside the engine's; an encoder evaluates it in one micro-batch, whose output buffer
# holds a row per token.
MAX_TOKENS = 2048
# Tokens per decode of a causal model: one Scheduler.call step, kept near a generation step's time on a
# CPU so that a text never holds a chat for long.
CHUNK = 128


class Embedder(_Metadata):
    """One text at a time, in one sequence (the caller serializes: a server runs it on its engine thread)."""

    def __init__(self, model_ptr, name: str, options: ModelOptions, owned: bool, chunk: int = CHUNK):
        self._model = model_ptr
        self._owned = owned
        self._ctx = None
        self._batch = None
        self.name = name
        self.vocab = Vocab(model_ptr)
        arch = self.meta("general.architecture") or ""
        self.causal = _causal(model_ptr, options)
        declared = _int(self.meta(f"{arch}.pooling_type"))
        if declared == L.LLAMA_POOLING_TYPE_RANK:
            self.close()
            raise LocalspecError(f"{name} is a reranker (rank pooling), not an embedding model.")
        self.pooling = declared if declared in POOLINGS else L.LLAMA_POOLING_TYPE_MEAN
        train = L.llama_model_n_ctx_train(model_ptr)
        self.max_tokens = min(MAX_TOKENS, train) if train > 0 else MAX_TOKENS
        self.dimensions = L.llama_model_n_embd_out(model_ptr)
        self.chunk = chunk if self.causal else self.max_tokens
        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.max_tokens
        cparams.n_batch = cparams.n_ubatch = self.chunk
        cparams.n_seq_max = 1
        cparams.embeddings = True
        # Causal: per-token states, pooled here across chunks; an encoder: llama.cpp pools its one batch.
        cparams.pooling_type = L.LLAMA_POOLING_TYPE_NONE if self.causal else self.pooling
        cparams.n_threads = cparams.n_threads_batch = options.threads()
        cparams.no_perf = True
        # Off unless asked for: llama.cpp's CPU flash attention rounds the queries to F16, which moves a
        # pooled vector visibly; off, the vectors are llama.cpp's reference pooling's (Llama(embedding=True):
        # tests/test_embeddings.py).
        cparams.flash_attn_type = options.attention_type() if options.flash_attn is not None \
            else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        mark = problems_mark()
        self._ctx = L.llama_init_from_model(model_ptr, cparams)
        if not self._ctx:
            why = problems_since(mark) or "out of memory?"
            self.close()
            raise LocalspecError(f"Cannot create an embedding context for {name}: {why}")
        self._memory = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(self.chunk, 0, 1)

    @classmethod
    def borrowing(cls, model: Model) -> "Embedder":
        """On a loaded model's weights (closed with the model, if not before)."""
        embedder = cls(model._model, model.path.name, model.options, owned=False)
        model.attach(embedder.close)
        return embedder

    @classmethod
    def load(cls, path: Path | str, options: ModelOptions | None = None) -> "Embedder":
        """A file of its own (`serve --embedding-model`)."""
        options = options or ModelOptions()
        path = Path(path)
        model = _load_model(path, vocab_only=False, n_gpu_layers=options.gpu_layers(), load_mode=options.load_mode())
        return cls(model, path.name, options, owned=True)

    @property
    def pooling_name(self) -> str:
        return POOLINGS[self.pooling]

    def tokens(self, text: str) -> list[int]:
        """A text as the model reads it for an embedding (its BOS, or an encoder's CLS and SEP)."""
        return self.vocab.tokenize(text, add_special=True, parse_special=False)

    def embed(self, tokens: list[int]) -> np.ndarray:
        """The pooled, unnormalized embedding of `tokens` (all at once)."""
        for vector in self.steps(tokens):
            if vector is not None:
                return vector
        raise AssertionError("steps() ends with the vector")

    def steps(self, tokens: list[int]) -> Iterator[np.ndarray | None]:
        """One decode per `next`: None after each chunk but the last, then the pooled embedding. The
        sequence is cleared first, so an abandoned text leaves nothing behind for the next."""
        if not tokens:
            raise LocalspecError("Nothing to embed: the text is empty.")
        if len(tokens) > self.max_tokens:
            raise LocalspecError(f"The text is {len(tokens)} tokens; {self.name} embeds at most {self.max_tokens}.")
        if not all(0 <= t < self.vocab.n_tokens for t in tokens):
            raise LocalspecError(f"A token id is outside {self.name}'s vocabulary (0 to {self.vocab.n_tokens - 1}).")
        L.llama_memory_clear(self._memory, True)
        total = np.zeros(self.dimensions, dtype=np.float64)
        last = None
        for start in range(0, len(tokens), self.chunk):
            chunk = tokens[start:start + self.chunk]
            self._decode(chunk, start)
            if not self.causal:
                pooled = L.llama_get_embeddings_seq(self._ctx, 0)
                yield np.ctypeslib.as_array(pooled, shape=(self.dimensions,)).astype(np.float32)
                return
            rows = np.stack([np.ctypeslib.as_array(L.llama_get_embeddings_ith(self._ctx, j), shape=(self.dimensions,))
                             for j in range(len(chunk))])
            total += rows.sum(axis=0, dtype=np.float64)
            last = rows[-1].copy()
            if start + self.chunk < len(tokens):
                yield None
        assert last is not None
        yield (total / len(tokens)).astype(np.float32) if self.pooling == L.LLAMA_POOLING_TYPE_MEAN else last

    def _decode(self, chunk: list[int], start: int) -> None:
        batch = self._batch
        assert batch is not None, "embed after close()"
        batch.n_tokens = len(chunk)
        for j, token in enumerate(chunk):
            batch.token[j] = token
            batch.pos[j] = start + j
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = 0
            batch.logits[j] = True  # every token's state is an output of an embedding context
        rc = L.llama_decode(self._ctx, batch)
        if rc != 0:
            L.llama_memory_clear(self._memory, True)
            raise LocalspecError(f"llama_decode failed with code {rc} while embedding with {self.name}.")

    def close(self) -> None:
        free_context(self._ctx, self._batch)
        self._ctx = self._batch = None
        if self._owned and self._model:
            L.llama_model_free(self._model)
        self._model = None

    def __del__(self) -> None:
        self.close()


def _causal(model_ptr, options: ModelOptions) -> bool:
    """Whether the model attends causally, as llama.cpp decides it (the GGUF's key, or the architecture's
    code for embedding models that ignore it): asked of a small context made for the question."""
    cparams = L.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 16
    cparams.embeddings = True
    cparams.pooling_type = L.LLAMA_POOLING_TYPE_NONE
    cparams.n_threads = cparams.n_threads_batch = 1
    ctx = L.llama_init_from_model(model_ptr, cparams)
    if not ctx:
        raise LocalspecError("Cannot create a context to read how this model attends (out of memory?).")
    try:
        return bool(L.llama_get_causal_attn(ctx))
    finally:
        L.llama_free(ctx)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None

"""What drafts that run beside a target share (EAGLE-3 and DFlash files, backend/eagle3.py and dflash.py):
their own weights in a context of their own, sized from the target's, using the target's token embeddings
and output head where the file has none (llama.cpp's `ctx_other`), checked against the target before
their context is made."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as L

from localspec.engine.backend.gguf import _load_model, _Metadata
from localspec.engine.backend.llama import Model
from localspec.engine.backend.staging import CALLS
from localspec.errors import LocalspecError


class BesideTarget(_Metadata):
    kind = "hidden-state"  # the kind of draft, in messages ("EAGLE-3", "DFlash")

    def __init__(self, path: Path | str, target: Model):
        self.path = Path(path)
        self._model = self._ctx = self._batch = self._memory = None
        if not CALLS:
            raise LocalspecError(f"{self.path.name} ({self.kind} draft): this llama.cpp build cannot run such drafts.")
        self._model = _load_model(self.path, vocab_only=False, n_gpu_layers=target.options.gpu_layers())
        try:
            self.layers = self._check(target)
            self._open(target)
        except BaseException:
            self.close()
            raise

    def _check(self, target: Model) -> list[int]:
        """The target layers the draft reads, once it is sure the draft was made for this target."""
        raise NotImplementedError

    def _context_params(self, target: Model):
        cparams = L.llama_context_default_params()
        cparams.ctx_other = target._ctx  # its token embeddings and output head, where the draft has none
        cparams.n_ctx = L.llama_n_ctx(target._ctx)
        cparams.n_batch = L.llama_n_batch(target._ctx)  # a whole mirrored decode
        cparams.n_seq_max = L.llama_n_seq_max(target._ctx)
        cparams.kv_unified = target.options.kv_unified
        cparams.n_threads = cparams.n_threads_batch = target.options.threads()
        cparams.flash_attn_type = target.options.attention_type()
        cparams.no_perf = True
        return cparams

    def _open(self, target: Model, cparams=None) -> None:
        self._ctx = L.llama_init_from_model(self._model, cparams or self._context_params(target))
        if not self._ctx:
            raise LocalspecError(f"Cannot create a context for the {self.kind} draft {self.path.name}.")
        CALLS["set_embeddings_nextn"](self._ctx, True, True)
        self._memory = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_ext_init(self._ctx)

    def copy_seq(self, src: int, dst: int) -> None:
        L.llama_memory_seq_rm(self._memory, dst, -1, -1)
        L.llama_memory_seq_cp(self._memory, src, dst, -1, -1)

    def close(self) -> None:
        if self._batch is not None:
            L.llama_batch_ext_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            L.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            L.llama_model_free(self._model)
            self._model = None


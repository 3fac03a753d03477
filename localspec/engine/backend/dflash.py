"""A DFlash draft: a small decoder GGUF (architecture `dflash`) trained on a target's hidden states that
drafts a whole block in one pass, run as llama.cpp's `draft-dflash` runs it (common/speculative.cpp,
`common_speculative_impl_draft_dflash`; tests/test_dflash.py holds the drafts to it).

For each target position P, the target's inputs to some of its layers (the file's `dflash.target_layers`)
are concatenated, fused by the draft's `fc` and written into the draft's cache at P as keys and values:
so the cache follows the target's, every decode and every truncation, position for position. A draft is
one decode of the pending token and `block - 1` mask tokens after it, attending to the cache and to each
other both ways (non-causal); the outputs at the masks are the block's tokens. The block's positions are
dropped again before the verify writes the target's states there. Its calls are llama.cpp's staging API
(backend/staging.py).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Sequence

import llama_cpp as L
import numpy as np

from localspec.engine.backend.beside import BesideTarget
from localspec.engine.backend.llama import Model
from localspec.engine.backend.staging import CALLS, FLOATS, logits_rows, rows
from localspec.errors import LocalspecError, ModelFileError


class DFlashDraft(BesideTarget):
    """A DFlash GGUF in a context beside a target `Model`'s, its cache following the target's sequence by
    sequence. The target's token embeddings and output head are used where the file has none of its own
    (llama.cpp's `ctx_other`)."""

    kind = "DFlash"

    def __init__(self, path: Path | str, target: Model):
        super().__init__(path, target)
        self.n_vocab = target.n_vocab
        self.mask = L.llama_vocab_mask(L.llama_model_get_vocab(self._model))
        # the block it was trained to fill: the pending token and block_size - 1 masks
        self.block_size = int(self.meta("dflash.block_size") or 16)
        self._target_ctx = target._ctx
        self._target_width = L.llama_model_n_embd(target._model)
        for lid in self.layers:  # the target keeps the inputs of these layers for every token it decodes
            CALLS["set_embeddings_layer_inp"](target._ctx, lid, True)
        target.add_follower(self)

    def _check(self, target: Model) -> list[int]:
        """The target layers the draft reads, once it is sure the draft was made for this target."""
        name, meta = self.path.name, target.meta
        architecture = self.meta("general.architecture")
        if architecture != "dflash":
            raise ModelFileError(f"{name} is not a DFlash draft (its architecture is {architecture}).")
        variant = ("DFlash2 (a selector lattice, no logits)" if int(self.meta("dflash.selector_top_k") or 0)
                   else "DSpark (a Markov head)" if self.meta("dflash.has_confidence_head") is not None
                   or self.meta("dflash.sample_from_anchor") is not None else "")
        if variant:
            raise ModelFileError(f"{name} is a {variant} draft, which localspec does not run; plain DFlash "
                                 "drafts only.")
        n = CALLS["target_layer_ids_n"](self._model)
        ids = CALLS["target_layer_ids"](self._model)
        layers = [int(ids[i]) for i in range(n)]
        width, wanted = L.llama_model_n_embd(target._model), L.llama_model_n_embd(self._model)
        if wanted != width:  # its encoder reads len(layers) rows of its own width
            raise ModelFileError(f"{name} is a DFlash draft for a target of hidden size {wanted}; "
                                 f"{target.path.name} ({meta('general.architecture')}) has {width}.")
        if not layers or max(layers) >= target.n_layer:
            raise ModelFileError(f"{name} reads layer {max(layers, default=-1)} of its target; "
                                 f"{target.path.name} has {target.n_layer} layers.")
        vocab = L.llama_model_get_vocab(self._model)
        if L.llama_vocab_n_tokens(vocab) != target.n_vocab:
            raise ModelFileError(f"{name} has a vocabulary of {L.llama_vocab_n_tokens(vocab)} tokens; "
                                 f"{target.path.name} has {target.n_vocab}.")
        if L.llama_vocab_mask(vocab) < 0:
            raise ModelFileError(f"{name} names no mask token (tokenizer.ggml.mask_token_id), which a DFlash "
                                 "draft fills its block with.")
        return layers

    def _open(self, target: Model, cparams=None) -> None:
        super()._open(target, cparams)
        L.llama_set_causal_attn(self._ctx, False)  # the block attends both ways

    # ------------------------------------------------------------------ following the target

    def follow(self, parts: Sequence[tuple[int, Sequence[int], int, Sequence[int]]]) -> None:
        width = self._target_width
        n_rows = max(max(indices) for *_rest, indices in parts) + 1
        layers = [rows(CALLS["get_embeddings_layer_inp"](self._target_ctx, lid), n_rows, width) for lid in self.layers]
        for seq, _tokens, start, indices in parts:  # one call per sequence, as llama.cpp's process()
            features = np.ascontiguousarray(np.concatenate([layer[list(indices)] for layer in layers], axis=1))
            L.llama_batch_ext_clear(self._batch)
            for j, row in enumerate(features):
                idx = L.llama_batch_ext_add_embd(self._batch, seq, L.llama_embd(row.ctypes.data_as(FLOATS), 1, len(row)))
                if idx < 0:
                    raise LocalspecError(f"The DFlash draft's batch refused a row ({idx}).")
                L.llama_batch_ext_set_pos(self._batch, idx, (ctypes.c_int32 * 1)(start + j))
            if L.llama_process(self._ctx, L.LLAMA_PROCESS_TYPE_DECODE, self._batch) != 0:
                self.truncate(seq, start)
                raise LocalspecError("The DFlash draft could not follow the target's decode.")
            del features

    def truncate(self, seq: int, n_keep: int) -> None:
        L.llama_memory_seq_rm(self._memory, seq, n_keep, -1)

    def clear(self) -> None:
        L.llama_memory_clear(self._memory, True)

    # ------------------------------------------------------------------ drafting

    def predict_block(self, seq: int, token: int, pos: int, n: int) -> np.ndarray:
        """The draft's logits for the n tokens after `token` (the pending one, at `pos`): one decode of it
        and n masks. The cache is left as it was (the block's positions dropped)."""
        L.llama_batch_ext_clear(self._batch)
        for i in range(n + 1):
            idx = L.llama_batch_ext_add_token(self._batch, seq, token if i == 0 else self.mask)
            if idx < 0:
                raise LocalspecError(f"The DFlash draft's batch refused a token ({idx}).")
            L.llama_batch_ext_set_pos(self._batch, idx, (ctypes.c_int32 * 1)(pos + i))
            L.llama_batch_ext_set_output_logits(self._batch, idx, True)
        rc = L.llama_process(self._ctx, L.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        try:
            if rc != 0:
                raise LocalspecError(f"The DFlash draft failed to draft (llama_process returned {rc}).")
            return logits_rows(self._ctx, range(1, n + 1), self.n_vocab)
        finally:
            L.llama_memory_seq_rm(self._memory, seq, pos, -1)

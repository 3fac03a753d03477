"""A target's multi-token-prediction (MTP) head: the next-token block Qwen3.5-style files carry after
their trunk (`{arch}.nextn_predict_layers`), run in a llama.cpp context of its own on the target's
weights (context type MTP), as llama.cpp's `draft-mtp` does (common/speculative.cpp,
`common_speculative_impl_draft_mtp`, the reference tests/test_mtp.py checks proposals against).

The head at position p reads the token there and the trunk's last hidden state one position earlier
(llama.cpp's `h_nextn`), and predicts the token at p + 1. So its own KV cache follows the target's:
every target decode is mirrored into it (`follow`, each token paired with the hidden state before it),
every truncation too; drafting (`predict`) chains the head on its own hidden states from the pending
token, and `forget` drops those draft positions again before the target verifies them.

A file with several heads (Step-3.5's) chains them, as llama.cpp does for such files: head k drafts the
k-th token (`llama_set_nextn_layer_offset`), so a draft is at most as long as the heads are many. Each
head attends through its own layer of the cache: following the target writes the decoded positions once
per head, and draft step k writes the whole draft so far again under head k, each row paired with the
state the step before it computed.

The calls it needs are llama.cpp's staging API (backend/staging.py).
"""

from __future__ import annotations

from typing import Sequence

import llama_cpp as L
import numpy as np

from localspec.engine.backend.staging import CALLS, LastRows, add_token, hidden_states, predictions
from localspec.errors import LocalspecError


def record_hidden(ctx) -> None:
    """Make a target context keep the trunk's hidden state of every token it decodes."""
    CALLS["set_embeddings_nextn"](ctx, True, False)


class MtpHead:
    """The MTP head's context beside a target's (`target_ctx`, on the same `weights`): its KV cache mirrors
    the target's, sequence by sequence. Made by `backend.Model` when the file has heads and the build can
    run them, with the target context's settings."""

    def __init__(self, weights, target_ctx, *, n_layers: int, n_vocab: int, kv_unified: bool, threads: int,
                 attention_type: int, name: str):
        self.n_layers = n_layers
        self.chained = n_layers > 1
        self.max_steps = n_layers if self.chained else None  # one head per draft token
        self.n_embd = L.llama_model_n_embd(weights)
        self.n_vocab = n_vocab
        self._target = target_ctx
        cparams = L.llama_context_default_params()
        cparams.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        cparams.ctx_other = target_ctx
        cparams.n_ctx = L.llama_n_ctx(target_ctx)
        cparams.n_batch = cparams.n_ubatch = L.llama_n_batch(target_ctx)  # a whole mirrored chunk
        cparams.n_seq_max = L.llama_n_seq_max(target_ctx)
        cparams.kv_unified = kv_unified
        # one draft token a call (the mirror takes no logits); llama.cpp reserves a row per sequence
        cparams.n_outputs_max = max(1, cparams.n_seq_max)
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.flash_attn_type = attention_type
        cparams.no_perf = True
        self._ctx = L.llama_init_from_model(weights, cparams)
        if not self._ctx:
            raise LocalspecError(f"Cannot create the MTP head's context for {name}.")
        CALLS["set_embeddings_nextn"](self._ctx, True, True)
        self._memory = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_ext_init(self._ctx)
        self._last = LastRows(self.n_embd)  # the trunk's states of the target's last decode of each sequence
        # chained heads: per sequence, the draft being written (its first position, and each step's
        # token with the state before it), which every step decodes again under its own head
        self._drafts: dict[int, tuple[int, list[tuple[int, np.ndarray]]]] = {}

    # ------------------------------------------------------------------ following the target

    def follow(self, parts: Sequence[tuple[int, Sequence[int], int, Sequence[int]]]) -> None:
        """The target just decoded these parts, (seq, tokens, start, batch indices of the tokens): read
        their hidden states and run the head over the same tokens, each paired with the state before it."""
        rows = [(seq, tokens, start, hidden_states(self._target, indices, self.n_embd))
                for seq, tokens, start, indices in parts]
        keep = []  # the rows' memory must outlive the process call
        batch = self._batch
        L.llama_batch_ext_clear(batch)
        for seq, tokens, start, hidden in rows:
            before = self.hidden_at(seq, start - 1)
            for k, token in enumerate(tokens):
                keep.append(add_token(batch, seq, token, start + k, before if k == 0 else hidden[k - 1], output=False))
        rc = 0
        for head in range(self.n_layers) if self.chained else (0,):
            if self.chained:  # each head's layer is written at the same cells, from the same state
                for seq, _tokens, start, _hidden in rows:
                    L.llama_memory_seq_rm(self._memory, seq, start, -1)
            rc = self._run(batch, head)
            if rc != 0:
                break
        if rc != 0:
            for seq, _tokens, start, _hidden in rows:  # drafts after these positions would read a gap
                self.truncate(seq, start)
            raise LocalspecError("The MTP head could not follow the target's decode.")
        for seq, _tokens, start, hidden in rows:
            self._last.set(seq, start, hidden)

    def hidden_at(self, seq: int, pos: int) -> np.ndarray:
        """The trunk's hidden state at `pos` from the target's last decode of `seq` (`LastRows`)."""
        return self._last.at(seq, pos)

    def truncate(self, seq: int, n_keep: int) -> None:
        L.llama_memory_seq_rm(self._memory, seq, n_keep, -1)
        self._last.cut(seq, n_keep)
        self._drafts.pop(seq, None)

    def copy_seq(self, src: int, dst: int) -> None:
        L.llama_memory_seq_rm(self._memory, dst, -1, -1)
        L.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
        self._last.copy(src, dst)
        self._drafts.pop(dst, None)

    def clear(self) -> None:
        L.llama_memory_clear(self._memory, True)
        self._last.clear()
        self._drafts.clear()

    # ------------------------------------------------------------------ drafting

    def predict(self, seq: int, token: int, pos: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The head's logits for the token after `token` at `pos` (paired with `hidden`, the state before
        it), and its own hidden state there, for the next step. Writes position `pos` of its cache; with
        chained heads, a step right after the last one continues its draft (and runs the next head), any
        other starts one."""
        return self.predict_many([(seq, token, pos, hidden)])[0]

    def predict_many(self, steps: Sequence[tuple[int, int, int, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`predict` for several sequences in one decode, (seq, token, pos, hidden) each; chained heads
        step every sequence at the same depth of its draft (one head runs the decode)."""
        L.llama_batch_ext_clear(self._batch)
        keep: list[np.ndarray] = []
        outputs: list[int] = []  # each sequence's one row with outputs, by its index in the batch
        depth = 1
        for seq, token, pos, hidden in steps:
            start, chain = pos, [(token, hidden.copy())]
            if self.chained:
                start, earlier = self._drafts.get(seq, (pos, []))
                if pos != start + len(earlier):
                    start, earlier = pos, []
                chain = earlier + chain
                if len(chain) > self.n_layers:
                    raise LocalspecError(f"The file has {self.n_layers} MTP heads; a draft cannot chain more.")
                if outputs and len(chain) != depth:
                    raise LocalspecError("Chained MTP heads step every sequence at one depth of its draft.")
                self._drafts[seq] = (start, chain)
                L.llama_memory_seq_rm(self._memory, seq, start, -1)  # the draft so far, written again
            depth = len(chain)
            keep += [add_token(self._batch, seq, t, start + k, h, output=k == len(chain) - 1)
                     for k, (t, h) in enumerate(chain)]
            outputs.append(len(keep) - 1)
        rc = self._run(self._batch, depth - 1)
        del keep
        if rc != 0:
            raise LocalspecError(f"The MTP head failed to draft (llama_process returned {rc}).")
        return predictions(self._ctx, outputs, self.n_vocab, self.n_embd)

    def forget(self, seq: int, pos: int) -> None:
        """Drop the head's cache from `pos` on (its draft positions): the target's verify decode writes
        them again, paired with the target's own states."""
        L.llama_memory_seq_rm(self._memory, seq, pos, -1)
        self._drafts.pop(seq, None)

    # ------------------------------------------------------------------ internals

    def _run(self, batch, head: int) -> int:
        """Decode `batch` through head `head` (the only one when the heads are not chained): llama_process's
        return code."""
        if self.chained:
            CALLS["set_nextn_layer_offset"](self._ctx, head)
        try:
            return L.llama_process(self._ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch)
        finally:
            if self.chained:
                CALLS["set_nextn_layer_offset"](self._ctx, 0)  # llama.cpp's default between drafts

    def close(self) -> None:
        if getattr(self, "_batch", None):
            L.llama_batch_ext_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None

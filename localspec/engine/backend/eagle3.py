"""An EAGLE-3 draft: a one-layer decoder GGUF (architecture `eagle3`) trained on a target's hidden states,
run as llama.cpp's `draft-eagle3` runs it (common/speculative.cpp, `common_speculative_impl_draft_eagle3`;
tests/test_eagle3.py holds the drafts to it).

For each target position P, the target's inputs to three of its layers (the file's `eagle3.target_layers`)
are concatenated and fused by the draft's encoder into g[P]. The decoder's cache holds at P the pair
(token at P+1, g[P]), so its output there predicts the token at P+2. So the cache follows the target's:
every target decode is encoded and written (its last position waits for the token after it: written
when drafting starts, or with the next decode), every truncation too. Drafting starts at the target's
last position with the pending token and g there, then chains the decoder on its own pre-norm states.
Its calls are llama.cpp's staging API (backend/staging.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import llama_cpp as L
import numpy as np

from localspec.engine.backend.beside import BesideTarget
from localspec.engine.backend.llama import Model
from localspec.engine.backend.staging import CALLS, LastRows, add_state, add_token, predictions, rows
from localspec.engine.backend.system import problems_mark, problems_since
from localspec.errors import LocalspecError, ModelFileError

ENCODER_CHUNK = 64  # positions the encoder fuses per call (its outputs are rows of the draft's width)


class Eagle3Draft(BesideTarget):
    """An EAGLE-3 GGUF in a context beside a target `Model`'s, its cache following the target's
    sequence by sequence. The target's token embeddings and output head are used where the file has
    none of its own (llama.cpp's `ctx_other`)."""

    kind = "EAGLE-3"
    max_steps = None  # its one decoder layer steps on as long as a draft goes

    def __init__(self, path: Path | str, target: Model):
        super().__init__(path, target)
        self.n_embd = L.llama_model_n_embd(self._model)
        self.n_vocab = target.n_vocab
        self._target_ctx = target._ctx
        self._target_width = L.llama_model_n_embd(target._model)
        self._held: dict[int, int] = {}  # per sequence: positions the decoder's cache holds (0…held-1)
        self._g = LastRows(self.n_embd)  # g of the target's last decode of each sequence
        for lid in self.layers:  # the target keeps the inputs of these layers for every token it decodes
            CALLS["set_embeddings_layer_inp"](target._ctx, lid, True)
        target.add_follower(self)

    def _check(self, target: Model) -> list[int]:
        """The target layers the draft reads, once it is sure the draft was made for this target."""
        name = self.path.name
        meta = target.meta
        architecture = self.meta("general.architecture")
        if architecture != "eagle3":
            raise ModelFileError(f"{name} is not an EAGLE-3 draft (its architecture is {architecture}).")
        n = CALLS["target_layer_ids_n"](self._model)
        ids = CALLS["target_layer_ids"](self._model)
        layers = [int(ids[i]) for i in range(n)]
        hidden = int(self.meta("eagle3.target_hidden_size") or 0)
        width = L.llama_model_n_embd(target._model)
        if hidden != width:
            raise ModelFileError(f"{name} is an EAGLE-3 draft for a target of hidden size {hidden}; "
                                 f"{target.path.name} ({meta('general.architecture')}) has {width}.")
        if max(layers) >= target.n_layer:
            raise ModelFileError(f"{name} reads layer {max(layers)} of its target; {target.path.name} has "
                                 f"{target.n_layer} layers.")
        vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self._model))
        if vocab != target.n_vocab:
            raise ModelFileError(f"{name} has a vocabulary of {vocab} tokens; {target.path.name} has {target.n_vocab}.")
        return layers

    def _open(self, target: Model, cparams=None) -> None:
        cparams = self._context_params(target)
        cparams.n_ubatch = ENCODER_CHUNK
        cparams.n_outputs_max = ENCODER_CHUNK
        super()._open(target, cparams)

    # ------------------------------------------------------------------ following the target

    def follow(self, parts: Sequence[tuple[int, Sequence[int], int, Sequence[int]]]) -> None:
        width = self._target_width
        n_rows = max(max(indices) for *_rest, indices in parts) + 1
        layers = [rows(CALLS["get_embeddings_layer_inp"](self._target_ctx, lid), n_rows, width) for lid in self.layers]
        encoded = [(seq, tokens, start, self._encode(np.concatenate([layer[list(indices)] for layer in layers], axis=1)))
                   for seq, tokens, start, indices in parts]
        batch, keep = self._batch, []
        L.llama_batch_ext_clear(batch)
        for seq, tokens, start, g in encoded:
            if start > 0 and self._held.get(seq, 0) == start - 1:  # the pair that waited for this token
                keep.append(add_token(batch, seq, tokens[0], start - 1, self.hidden_at(seq, start - 1), output=False))
            for k in range(len(tokens) - 1):
                keep.append(add_token(batch, seq, tokens[k + 1], start + k, g[k], output=False))
        if keep and L.llama_process(self._ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch) != 0:
            for seq, _tokens, start, _g in encoded:
                self.truncate(seq, start)
            raise LocalspecError("The EAGLE-3 draft could not follow the target's decode.")
        for seq, tokens, start, g in encoded:
            self._held[seq] = start + len(tokens) - 1
            self._g.set(seq, start, g)

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """g for each row of target features, ENCODER_CHUNK rows a call."""
        out = np.empty((len(features), self.n_embd), dtype=np.float32)
        for first in range(0, len(features), ENCODER_CHUNK):
            chunk = features[first:first + ENCODER_CHUNK]
            L.llama_batch_ext_clear(self._batch)
            # The encoder reads no positions, but a batch's must continue sequence 0's (llama.cpp's check)
            after = L.llama_memory_seq_pos_max(self._memory, 0) + 1
            keep = [add_state(self._batch, row, after + j) for j, row in enumerate(chunk)]
            mark = problems_mark()
            rc = L.llama_process(self._ctx, L.LLAMA_PROCESS_TYPE_ENCODE, self._batch)
            del keep
            if rc != 0:
                raise LocalspecError(f"The EAGLE-3 draft's encoder failed (llama_process returned {rc}): "
                                     f"{problems_since(mark) or 'no reason given'}.")
            out[first:first + len(chunk)] = rows(CALLS["get_embeddings_nextn"](self._ctx), len(chunk), self.n_embd)
        return out

    def hidden_at(self, seq: int, pos: int) -> np.ndarray:
        """g at `pos` from the target's last decode of `seq` (`LastRows`)."""
        return self._g.at(seq, pos)

    def truncate(self, seq: int, n_keep: int) -> None:
        keep = max(n_keep - 1, 0)  # the pair at n_keep - 1 waits for the token after it
        L.llama_memory_seq_rm(self._memory, seq, keep, -1)
        self._held[seq] = min(self._held.get(seq, 0), keep)
        self._g.cut(seq, n_keep)

    def copy_seq(self, src: int, dst: int) -> None:
        super().copy_seq(src, dst)
        self._held[dst] = self._held.get(src, 0)
        self._g.copy(src, dst)

    def clear(self) -> None:
        L.llama_memory_clear(self._memory, True)
        self._held.clear()
        self._g.clear()

    # ------------------------------------------------------------------ drafting

    def predict(self, seq: int, token: int, pos: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The draft's logits for the token after `token` (at `pos`, paired with `hidden`, the state of
        the position before), and its pre-norm state, for the next step. Writes position pos - 1."""
        return self.predict_many([(seq, token, pos, hidden)])[0]

    def predict_many(self, steps: Sequence[tuple[int, int, int, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`predict` for several sequences in one decode, (seq, token, pos, hidden) each."""
        L.llama_batch_ext_clear(self._batch)
        keep = []
        for seq, token, pos, hidden in steps:
            L.llama_memory_seq_rm(self._memory, seq, pos - 1, -1)
            keep.append(add_token(self._batch, seq, token, pos - 1, hidden, output=True))
        rc = L.llama_process(self._ctx, L.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        del keep
        if rc != 0:
            raise LocalspecError(f"The EAGLE-3 draft failed to draft (llama_process returned {rc}).")
        for seq, _token, pos, _hidden in steps:
            self._held[seq] = pos
        return predictions(self._ctx, range(len(steps)), self.n_vocab, self.n_embd)

    def forget(self, seq: int, pos: int) -> None:
        """Drop the draft's positions from `pos` on; the pair at pos - 1 (the pending token's) stays."""
        L.llama_memory_seq_rm(self._memory, seq, pos, -1)
        self._held[seq] = min(self._held.get(seq, 0), pos)

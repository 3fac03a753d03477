"""A Gemma 4 assistant: the small drafter Gemma 4 ships beside its targets (architecture
`gemma4-assistant`, llama.cpp's src/models/gemma4-assistant.cpp), run as llama.cpp's `draft-mtp` runs it
(common/speculative.cpp, `is_mem_shared`; tests/test_assistant.py checks our drafts against it).

Its layers have queries only: they attend through the target's own cache (its last sliding-window and
last full-attention layers' keys and values), so it keeps no cache of its own and follows no decode but
by keeping the target's hidden states (`h_nextn`), which it reads beside each token. A draft step is fed
the last token and a state (the target's for the pending token, then the assistant's own), and every
step of a draft sits at the pending token's position, the next one the target's cache lacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import llama_cpp as L
import numpy as np

from localspec.engine.backend.beside import BesideTarget
from localspec.engine.backend.llama import Model
from localspec.engine.backend.mtp import record_hidden
from localspec.engine.backend.staging import LastRows, add_token, hidden_states, predictions
from localspec.errors import LocalspecError, ModelFileError

ARCHITECTURE = "gemma4-assistant"


class Gemma4Assistant(BesideTarget):
    """A Gemma 4 assistant GGUF in a context beside its Gemma 4 target's, reading the target's cache and
    hidden states. The `mtp` drafter drafts with it (given to the engine as `assistant`), as llama.cpp's
    `draft-mtp` does."""

    kind = "Gemma 4 assistant"
    max_steps = None  # every step reads the same cache: a draft goes on as long as asked

    def __init__(self, path: Path | str, target: Model):
        super().__init__(path, target)
        self.n_embd = L.llama_model_n_embd(target._model)  # the states it reads and returns: the target's
        self.n_vocab = target.n_vocab
        self._target_ctx = target._ctx
        self._last = LastRows(self.n_embd)  # the target's states of its last decode of each sequence
        self._drafts: dict[int, int] = {}  # per sequence: the position the draft being written sits at
        record_hidden(target._ctx)
        target.add_follower(self)

    def _check(self, target: Model) -> list[int]:
        name, meta = self.path.name, target.meta
        architecture = self.meta("general.architecture")
        if architecture != ARCHITECTURE:
            raise ModelFileError(f"{name} is not a Gemma 4 assistant (its architecture is {architecture}).")
        target_architecture = meta("general.architecture")
        if target_architecture != "gemma4":
            raise ModelFileError(f"{name} is a Gemma 4 assistant, which reads a Gemma 4 target's cache; "
                                 f"{target.path.name} is {target_architecture}.")
        width = int(self.meta(f"{ARCHITECTURE}.embedding_length_out") or 0)
        target_width = L.llama_model_n_embd(target._model)
        if width != target_width:
            raise ModelFileError(f"{name} is a Gemma 4 assistant for a target of hidden size {width}; "
                                 f"{target.path.name} has {target_width}.")
        vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self._model))
        if vocab != target.n_vocab:
            raise ModelFileError(f"{name} has a vocabulary of {vocab} tokens; {target.path.name} has {target.n_vocab}.")
        return []

    def _open(self, target: Model, cparams=None) -> None:
        cparams = self._context_params(target)
        cparams.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP  # (llama.cpp makes a draft-mtp context so)
        # one draft token a call (the mirror takes no logits); llama.cpp reserves a row per sequence
        cparams.n_outputs_max = max(1, cparams.n_seq_max)
        super()._open(target, cparams)

    # ------------------------------------------------------------------ following the target

    def follow(self, parts: Sequence[tuple[int, Sequence[int], int, Sequence[int]]]) -> None:
        for seq, _tokens, start, indices in parts:
            self._last.set(seq, start, hidden_states(self._target_ctx, indices, self.n_embd))

    def hidden_at(self, seq: int, pos: int) -> np.ndarray:
        """The target's hidden state at `pos` from its last decode of `seq` (`LastRows`)."""
        return self._last.at(seq, pos)

    def truncate(self, seq: int, n_keep: int) -> None:
        self._last.cut(seq, n_keep)
        self._drafts.pop(seq, None)

    def copy_seq(self, src: int, dst: int) -> None:  # (the cache is the target's: nothing to copy)
        self._last.copy(src, dst)
        self._drafts.pop(dst, None)

    def clear(self) -> None:
        self._last.clear()
        self._drafts.clear()

    # ------------------------------------------------------------------ drafting

    def predict(self, seq: int, token: int, pos: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The assistant's logits for the token after `token` (paired with `hidden`), and its state for the
        next step. A draft's first step is at the pending token's position `pos`; every later one (at
        pos + k) is run at that same position, as the assistant was trained."""
        return self.predict_many([(seq, token, pos, hidden)])[0]

    def predict_many(self, steps: Sequence[tuple[int, int, int, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`predict` for several sequences in one decode, (seq, token, pos, hidden) each."""
        L.llama_batch_ext_clear(self._batch)
        keep = []
        for seq, token, pos, hidden in steps:
            start = self._drafts.get(seq)
            if start is None or pos <= start:
                start = self._drafts[seq] = pos
            keep.append(add_token(self._batch, seq, token, start, hidden, output=True))
        rc = L.llama_process(self._ctx, L.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        del keep
        if rc != 0:
            raise LocalspecError(f"The Gemma 4 assistant failed to draft (llama_process returned {rc}).")
        return predictions(self._ctx, range(len(steps)), self.n_vocab, self.n_embd)

    def forget(self, seq: int, pos: int) -> None:
        """The draft is over (it wrote nothing: the cache is the target's)."""
        self._drafts.pop(seq, None)

"""Images in a model's prompts (`ImageDecoding`, a part of backend/llama.py's `Model`): a prompt's runs of
text and of image rows (backend/media.py's ids) evaluated in turn, an image's rows as its embeddings
(backend/vision.py's projector) at the positions its grid gives them (backend/grids.py), and what a model
without a projector sees of an image (a newline at each of its rows)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Callable, Sequence

import llama_cpp as L
import numpy as np

from localspec.engine.backend.grids import Grids
from localspec.engine.backend.media import media_row, media_runs
from localspec.errors import ContextOverflowError, LocalspecError

if TYPE_CHECKING:
    from localspec.engine.backend.vision import Projector


class ImageDecoding:
    """The image side of `Model`; the model's context, batch sizes and decoding are its own."""

    _ctx: Any
    _grids: Grids
    _blank: int
    _embd_batch: Any
    projector: "Projector | None"
    n_vocab: int
    n_ctx: int
    n_batch: int

    if TYPE_CHECKING:
        def decode(self, tokens: list[int], start: int, logits_for: list[int] | tuple[int, ...] = (),
                   seq: int = 0) -> np.ndarray: ...

        def decode_many(self, parts: Sequence[tuple[int, list[int], int, int]]) -> list[np.ndarray]: ...

        def _run(self, parts: list[tuple[int, list[int], int]], batch=None) -> None: ...

        def attach(self, close: Callable[[], None]) -> None: ...

    def _decode_runs(self, tokens: list[int], start: int, logits_for: Sequence[int], seq: int) -> np.ndarray:
        """`decode` of a prompt with images (engine/backend/vision.py): each run of text tokens as text,
        each run of one image's ids as its embeddings (a model without a projector, as a draft model beside
        the target, sees a newline at each of an image's positions: the text around it, in place)."""
        out = np.zeros((len(logits_for), self.n_vocab), dtype=np.float32)
        for first, run in media_runs(tokens):
            if run[0] >= 0 or self.projector is None:
                text = self._as_text(run)
                wanted = [(row, index - first) for row, index in enumerate(logits_for) if first <= index < first + len(run)]
                rows = self.decode(text, start + first, [index for _row, index in wanted], seq)
                for (row, _index), logits in zip(wanted, rows):
                    out[row] = logits
            else:
                if any(first <= index < first + len(run) for index in logits_for):
                    raise ValueError("logits asked for an image's position")
                self._decode_image(run, start + first, seq)
        return out

    def _decode_image(self, ids: list[int], start: int, seq: int) -> None:
        """One image's rows at positions start…, n_batch at a time (an image whose attention is
        non-causal, as Gemma 3's, must fit one batch: llama.cpp attends within a batch)."""
        if start + len(ids) > self.n_ctx:
            raise ContextOverflowError(
                f"{start + len(ids)} tokens do not fit the context window of {self.n_ctx} tokens.")
        assert self.projector is not None
        embeddings, image = self.projector.rows(ids)
        if image.non_causal and len(ids) > self.n_batch:
            raise LocalspecError(f"An image of {len(ids)} embeddings does not fit one batch of {self.n_batch}.")
        grid = self.projector.mrope
        if self._embd_batch is None:  # (M-RoPE: four positions a row, section by section)
            self._embd_batch = L.llama_batch_init(self.n_batch * (4 if grid else 1), self.projector.n_embd, 1)
        batch = self._embd_batch
        first_row = media_row(ids[0])[1]
        origin = self._grids.pos(seq, start - first_row)  # the image's first position
        if image.non_causal:
            L.llama_set_causal_attn(self._ctx, False)
        try:
            for at in range(0, len(ids), self.n_batch):
                rows = np.ascontiguousarray(embeddings[at:at + self.n_batch], dtype=np.float32)
                ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
                n = len(rows)
                for j in range(n):
                    row = first_row + at + j
                    if grid:  # llama.cpp's M-RoPE sections: time, line, column, unused
                        batch.pos[j], batch.pos[j + 3 * n] = origin, 0
                        batch.pos[j + n], batch.pos[j + 2 * n] = origin + row // image.width, origin + row % image.width
                    else:
                        batch.pos[j] = origin + row
                    batch.n_seq_id[j] = 1
                    batch.seq_id[j][0] = seq
                    batch.logits[j] = False
                batch.n_tokens = n
                self._run([(seq, ids[at:at + n], start + at)], batch)
        finally:
            if image.non_causal:
                L.llama_set_causal_attn(self._ctx, True)
        placed = (start - first_row, image.rows, image.n_pos)
        if grid and image.n_pos != image.rows:
            self._grids.place(seq, placed)

    def _images_first(self, parts: Sequence[tuple[int, list[int], int, int]]) -> list[np.ndarray]:
        """`decode_many` of parts with images: each part's tokens up to its last image alone, the rest
        together (a part that ends with an image, a prompt's chunk, gets rows nobody reads)."""
        done: dict[int, np.ndarray] = {}
        rest = []
        for i, (seq, tokens, start, wanted) in enumerate(parts):
            last = max((j for j, t in enumerate(tokens) if t < 0), default=-1)
            if last >= 0:
                self._decode_runs(tokens[:last + 1], start, (), seq)
                tokens, start = tokens[last + 1:], start + last + 1
            if tokens:
                rest.append((i, (seq, tokens, start, min(wanted, len(tokens)))))
            else:
                done[i] = np.zeros((wanted, self.n_vocab), dtype=np.float32)
        tails = self.decode_many([part for _i, part in rest]) if rest else []
        done.update((i, rows) for (i, _part), rows in zip(rest, tails))
        return [done[i] for i in range(len(parts))]

    def _as_text(self, run: list[int]) -> list[int]:
        """A run of text tokens as it is; a run of an image's ids as a newline at each row: what a model
        without the projector (a draft model) or a head reading the target's tokens sees of the image."""
        return run if not run or run[0] >= 0 else [self._blank] * len(run)

    @property
    def _gridded(self) -> bool:
        """Images placed with M-RoPE: positions are not indices, so no trees (their branches' positions) and
        no shifting (a grid does not move as a run of positions does)."""
        return self.projector is not None and self.projector.mrope

    def attach_projector(self, projector: "Projector") -> None:
        """Images in prompts, evaluated through `projector` (a vision.Projector loaded on this model)."""
        self.projector = projector
        self.attach(projector.close)

"""Images into a target's context through llama.cpp's mtmd (tools/mtmd of the llama.cpp that
llama-cpp-python vendors): a projector file (`mmproj`) beside the target encodes an image into rows of
embeddings, which the target evaluates where the image stands in the prompt (`Model.decode`).

A prompt with images is a list of ints like any other (backend/media.py): text tokens and, for each image,
one negative id per embedding row. Equal images get equal ids, so prefix reuse and slots work unchanged,
and a follow-up about the same image finds it in the cache (nothing encoded, nothing evaluated again). The
projector keeps each image's bytes and, within a memory budget, its embeddings; dropped embeddings are
encoded again when a decode needs them. Where the target uses M-RoPE (Qwen-VL, Qwen3.5), an image's rows
sit on a grid of positions and take fewer than one each: `Model` keeps each sequence's layout.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import llama_cpp as L
import numpy as np
from llama_cpp import mtmd_cpp as M

from localspec.engine.backend.gguf import read_architecture
from localspec.engine.backend.media import MEDIA_KEYS, MEDIA_ROWS, media_id, media_row
from localspec.engine.backend.system import _on_log, init, problems_mark, problems_since
from localspec.errors import LocalspecError, ModelFileError

MAX_PIXELS = 50_000_000              # an image's width x height; larger ones are refused, not shrunk
EMBEDDINGS_BUDGET = 512 << 20        # bytes of embeddings kept for images already encoded
IMAGES_KEPT = 256                    # images whose bytes are kept to encode again
# Text architectures whose llama.cpp graph aborts on embeddings input unless their file has M-RoPE sections
# (src/models/glm4.cpp, glm4-moe.cpp: "This GGUF does not support multimodal")
NO_EMBEDDINGS_WITHOUT_MROPE = ("glm4", "glm4moe")


def available() -> str | None:
    """Why this build cannot read images (None: it can): llama-cpp-python's mtmd library must load."""
    try:
        M.mtmd_default_marker()
    except (OSError, AttributeError) as exc:
        return f"llama-cpp-python's libmtmd does not load ({exc})"
    return None


class ImageError(LocalspecError):
    """An image the user sent that cannot be used (not an image, truncated, too large, no projector)."""


@dataclass
class Image:
    """One image a projector knows: its bytes, its rows, how the target places them, its embeddings."""

    data: bytes
    rows: int
    non_causal: bool
    n_pos: int      # positions it takes: `rows`, or with M-RoPE max(width, height) in rows of the grid
    width: int      # rows per line of its grid (M-RoPE places row i at (i // width, i % width))
    digest: str     # sha256 of `data`: what a prompt's same image is found by
    embeddings: np.ndarray | None = None  # (rows, n_embd) float32, or None once dropped


class Projector:
    """An mmproj GGUF loaded beside `target` (a backend `Model`): images -> prompt ids and embeddings."""

    def __init__(self, path: Path | str, target, *, threads: int, use_gpu: bool = False):
        init()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"No projector file at {self.path}.")
        arch = read_architecture(self.path)
        if arch != "clip":
            raise ModelFileError(f"{self.path.name} is not an image projector (its architecture is {arch!r}); "
                                 "--mmproj takes the mmproj GGUF published beside a vision model.")
        M.mtmd_helper_log_set(_on_log, ctypes.c_void_p(0))
        params = M.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.print_timings = False
        params.warmup = False
        mark = problems_mark()
        self._ctx = M.mtmd_init_from_file(str(self.path).encode(), target._model, params)
        if not self._ctx:
            why = problems_since(mark) or "see LOCALSPEC_LLAMA_LOG=1"
            raise ModelFileError(f"{self.path.name} cannot be loaded as the projector of {target.path.name}: {why}")
        try:
            if target.architecture in NO_EMBEDDINGS_WITHOUT_MROPE and not M.mtmd_decode_use_mrope(self._ctx):
                raise ModelFileError(f"{target.path.name} ({target.architecture}, without M-RoPE sections) cannot "
                                     "take images: llama.cpp refuses embeddings input for it.")
            if not M.mtmd_support_vision(self._ctx):
                raise ModelFileError(f"{self.path.name} has no image encoder (an audio projector?); localspec takes images.")
        except BaseException:
            self.close()
            raise
        self.marker = (M.mtmd_default_marker() or b"<__media__>").decode()
        # The target places an image's rows on a 2D grid (Qwen-VL's M-RoPE): it takes fewer positions than rows
        self.mrope = bool(M.mtmd_decode_use_mrope(self._ctx))
        self.n_embd = L.llama_model_n_embd_inp(target._model)
        self._lock = threading.RLock()  # mtmd's context is one thread's at a time
        self._keys: dict[str, int] = {}  # sha256 -> key
        self._images: collections.OrderedDict[int, Image] = collections.OrderedDict()
        self._next_key = 0
        self.encoded = 0  # images encoded over the projector's life (a follow-up encodes none)

    # ------------------------------------------------------------------ prompts

    def tokenize(self, text: str, images: Sequence[bytes]) -> list[int]:
        """`text` with one marker (`self.marker`) where each image stands, in order: its tokens and each
        image's ids (special tokens parsed, BOS added as the model wants). Encodes images not seen before."""
        if text.count(self.marker) != len(images):
            raise ImageError(f"The prompt has {text.count(self.marker)} places for images and {len(images)} images.")
        with self._lock:
            bitmaps = []
            chunks = None
            try:
                for i, data in enumerate(images):
                    bitmaps.append(self._bitmap(data, i + 1, len(images)))
                chunks = M.mtmd_input_chunks_init()
                raw = text.encode("utf-8")
                prompt = M.mtmd_input_text(raw, len(raw), True, True)
                array = (M.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
                rc = M.mtmd_tokenize(self._ctx, chunks, ctypes.byref(prompt), array, len(bitmaps))
                if rc != 0:
                    raise ImageError(f"{self.path.name} could not prepare the images (mtmd_tokenize: {rc}).")
                return self._ids(chunks, images)
            finally:
                if chunks is not None:
                    M.mtmd_input_chunks_free(chunks)
                for bitmap in bitmaps:
                    M.mtmd_bitmap_free(bitmap)

    def _bitmap(self, data: bytes, index: int, count: int):
        which = f"Image {index} of {count}" if count > 1 else "The image"
        if not data:
            raise ImageError(f"{which} is empty.")
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False)
        if not bitmap:
            raise ImageError(f"{which} ({len(data)} bytes) is not an image localspec can read, or is truncated "
                             "(PNG, JPEG, GIF, BMP, TGA, PSD, HDR, PNM).")
        nx, ny = M.mtmd_bitmap_get_nx(bitmap), M.mtmd_bitmap_get_ny(bitmap)
        if nx * ny > MAX_PIXELS:
            M.mtmd_bitmap_free(bitmap)
            raise ImageError(f"{which} is {nx}x{ny} pixels; at most {MAX_PIXELS // 1_000_000} million are taken.")
        return bitmap

    def _ids(self, chunks, images: Sequence[bytes]) -> list[int]:
        ids: list[int] = []
        image = 0
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            kind = M.mtmd_input_chunk_get_type(chunk)
            if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                ids.extend(tokens[j] for j in range(n.value))
                continue
            if kind != M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise ImageError("localspec takes images only, not audio.")
            key = self._remember(images[image], chunk)
            image += 1
            ids.extend(media_id(key, row) for row in range(self._images[key].rows))
        return ids

    def _remember(self, data: bytes, chunk) -> int:
        """The image's key, its embeddings encoded if it is new or they were dropped."""
        digest = hashlib.sha256(data).hexdigest()
        key = self._keys.get(digest)
        if key is None or key not in self._images:
            key = self._next_key
            self._next_key = (self._next_key + 1) % MEDIA_KEYS
            self._forget(key)
            rows = M.mtmd_input_chunk_get_n_tokens(chunk)
            if rows >= MEDIA_ROWS:
                raise ImageError(f"The image makes {rows} embeddings; at most {MEDIA_ROWS - 1} are taken.")
            self._keys[digest] = key
            grid = M.mtmd_input_chunk_get_tokens_image(chunk)
            self._images[key] = Image(data, rows, bool(M.mtmd_decode_use_non_causal(self._ctx, chunk)),
                                      n_pos=M.mtmd_input_chunk_get_n_pos(chunk),
                                      width=max(1, M.mtmd_image_tokens_get_nx(grid)) if grid else rows,
                                      digest=digest)
        self._images.move_to_end(key)
        record = self._images[key]
        if record.embeddings is None:
            record.embeddings = self._encode(chunk, record.rows)
            self._trim()
        while len(self._images) > IMAGES_KEPT:
            self._forget(next(iter(self._images)))
        return key

    def _forget(self, key: int) -> None:
        """An image no longer held (its key is taken again, or it is the least recently used)."""
        record = self._images.pop(key, None)
        if record is not None:
            self._keys.pop(record.digest, None)

    def _encode(self, chunk, rows: int) -> np.ndarray:
        if M.mtmd_encode_chunk(self._ctx, chunk) != 0:
            raise ImageError(f"{self.path.name} failed to encode the image.")
        out = M.mtmd_get_output_embd(self._ctx)
        self.encoded += 1
        return np.ctypeslib.as_array(out, shape=(rows * self.n_embd,)).reshape(rows, self.n_embd).copy()

    def _trim(self) -> None:
        """Drop the least recently used images' embeddings beyond the budget (their bytes stay)."""
        held = [record for record in self._images.values() if record.embeddings is not None]
        total = sum(record.embeddings.nbytes for record in held if record.embeddings is not None)
        for record in held[:-1]:
            if total <= EMBEDDINGS_BUDGET or record.embeddings is None:
                break
            total -= record.embeddings.nbytes
            record.embeddings = None

    def holds(self, token: int) -> bool:
        """Whether `token` is a row of an image this projector knows."""
        key, row = media_row(token)
        record = self._images.get(key)
        return record is not None and row < record.rows

    # ------------------------------------------------------------------ decoding

    def rows(self, ids: Sequence[int]) -> tuple[np.ndarray, Image]:
        """The embeddings of a run of media ids of one image, (len(ids), n_embd) float32, and the image (how
        it is evaluated: non-causal attention, its positions)."""
        key, first = media_row(ids[0])
        record = self._images.get(key)
        if record is None:
            raise LocalspecError("An image of this prompt is no longer held; send it again.")
        embeddings = record.embeddings  # (read without the lock: another request's encoding must not hold a step)
        if embeddings is None:
            with self._lock:
                if record.embeddings is None:
                    record.embeddings = self._encode_again(record)
                    self._trim()
                embeddings = record.embeddings
        return embeddings[first:first + len(ids)], record

    def _encode_again(self, record: Image) -> np.ndarray:
        bitmap = self._bitmap(record.data, 1, 1)
        chunks = M.mtmd_input_chunks_init()
        try:
            raw = self.marker.encode()
            prompt = M.mtmd_input_text(raw, len(raw), False, False)
            array = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
            if M.mtmd_tokenize(self._ctx, chunks, ctypes.byref(prompt), array, 1) != 0:
                raise ImageError(f"{self.path.name} could not prepare an image again.")
            for i in range(M.mtmd_input_chunks_size(chunks)):
                chunk = M.mtmd_input_chunks_get(chunks, i)
                if M.mtmd_input_chunk_get_type(chunk) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    return self._encode(chunk, record.rows)
            raise ImageError(f"{self.path.name} found no image to encode again.")
        finally:
            M.mtmd_input_chunks_free(chunks)
            M.mtmd_bitmap_free(bitmap)

    def close(self) -> None:
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx:
            M.mtmd_free(ctx)

    def __del__(self) -> None:
        self.close()

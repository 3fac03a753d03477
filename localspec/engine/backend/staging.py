"""llama.cpp's staging API for heads that draft from a target's hidden states (MTP heads, EAGLE-3
drafts): the calls src/llama-ext.h declares outside `extern "C"`, bound by their Itanium-mangled names
(Linux and macOS builds export them; where a build does not, `unavailable` says why and the heads are
not used), the extended batch such heads are fed with, and what a head following a target implements.
"""

from __future__ import annotations

import ctypes
from typing import Protocol, Sequence

import llama_cpp as L
import numpy as np

from localspec.errors import LocalspecError

FLOATS = ctypes.POINTER(ctypes.c_float)
_MANGLED = {
    "set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb",
                             [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
    "get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", [ctypes.c_void_p], FLOATS),
    "get_embeddings_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
                                 [ctypes.c_void_p, ctypes.c_int32], FLOATS),
    "set_nextn_layer_offset": ("_Z28llama_set_nextn_layer_offsetP13llama_contexti",
                               [ctypes.c_void_p, ctypes.c_int32], None),
    "set_embeddings_layer_inp": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
                                 [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None),
    "get_embeddings_layer_inp": ("_Z30llama_get_embeddings_layer_inpP13llama_contextj",
                                 [ctypes.c_void_p, ctypes.c_uint32], FLOATS),
    "target_layer_ids": ("_Z28llama_model_target_layer_idsPK11llama_model", [ctypes.c_void_p],
                         ctypes.POINTER(ctypes.c_int32)),
    "target_layer_ids_n": ("_Z30llama_model_target_layer_ids_nPK11llama_model", [ctypes.c_void_p], ctypes.c_uint32),
}


def _bind(wanted: dict) -> tuple[dict, str]:
    lib = getattr(getattr(L, "llama_cpp", None), "_lib", None)
    if lib is None:
        return {}, "llama-cpp-python does not expose its library"
    calls = {}
    for name, (symbol, args, result) in wanted.items():
        try:
            f = getattr(lib, symbol)
        except AttributeError:
            return {}, f"this llama.cpp build does not export {name} (a C++ symbol of llama-ext.h)"
        f.argtypes, f.restype = args, result
        calls[name] = f
    return calls, ""


CALLS, _UNAVAILABLE = _bind(_MANGLED)


def unavailable() -> str:
    """Why heads that read a target's hidden states cannot run with this llama.cpp build ("" when they can)."""
    return _UNAVAILABLE


class Follower(Protocol):
    """A head whose KV cache follows a target `Model`'s (`Model.add_follower`)."""

    def follow(self, parts: Sequence[tuple[int, Sequence[int], int, Sequence[int]]]) -> None:
        """The target just decoded these parts: (seq, tokens, start, the tokens' batch indices)."""
        ...

    def truncate(self, seq: int, n_keep: int) -> None: ...
    def copy_seq(self, src: int, dst: int) -> None: ...
    def clear(self) -> None: ...
    def close(self) -> None: ...


class LastRows:
    """Per sequence, the rows a head computed from the target's last decode of it (the trunk's states,
    or g), from the decode's first position: what the next decode's first token pairs with, and what a
    rollback within that decode needs. Zeros where they are not known (a sequence's first token, or a
    cache reused from an earlier request: llama.cpp pairs those with its own stale state; it costs only
    that position's draft quality)."""

    def __init__(self, width: int):
        self.width = width
        self._rows: dict[int, tuple[int, np.ndarray]] = {}

    def set(self, seq: int, start: int, rows: np.ndarray) -> None:
        self._rows[seq] = (start, rows)

    def at(self, seq: int, pos: int) -> np.ndarray:
        start, rows = self._rows.get(seq, (0, None))
        if rows is not None and start <= pos < start + len(rows):
            return rows[pos - start]
        return np.zeros(self.width, dtype=np.float32)

    def cut(self, seq: int, n_keep: int) -> None:
        """The sequence keeps positions below `n_keep`."""
        start, rows = self._rows.get(seq, (0, None))
        if rows is not None:
            if n_keep <= start:
                del self._rows[seq]
            else:
                self._rows[seq] = (start, rows[:n_keep - start])

    def copy(self, src: int, dst: int) -> None:
        if src in self._rows:
            self._rows[dst] = self._rows[src]
        else:
            self._rows.pop(dst, None)

    def clear(self) -> None:
        self._rows.clear()


def rows(pointer, n: int, width: int) -> np.ndarray:
    """A copy of n rows of `width` floats from a llama.cpp output buffer."""
    if not pointer:
        raise LocalspecError("llama.cpp returned no hidden states (were they asked for?).")
    return np.ctypeslib.as_array(pointer, shape=(n, width)).copy()


def logits_rows(ctx, indices: Sequence[int], n_vocab: int) -> np.ndarray:
    """The logits at these batch indices of a context's last decode, (len(indices), n_vocab), copied out
    of llama.cpp's buffer (the next decode overwrites it) with one memmove a row: this runs after every
    decode."""
    out = np.empty((len(indices), n_vocab), dtype=np.float32)
    row_bytes, at = out.strides[0], out.ctypes.data
    for k, i in enumerate(indices):
        logits = L.llama_get_logits_ith(ctx, i)
        if not logits:
            raise LocalspecError(f"llama.cpp has no logits for batch row {i}.")
        ctypes.memmove(at + k * row_bytes, logits, row_bytes)
    return out


def hidden_states(ctx, indices: Sequence[int], width: int) -> np.ndarray:
    """The trunk's hidden states (`h_nextn`) a target context kept for these rows of its last decode."""
    get = CALLS["get_embeddings_nextn_ith"]
    out = np.empty((len(indices), width), dtype=np.float32)
    for row, i in enumerate(indices):
        out[row] = rows(get(ctx, i), 1, width)[0]
    return out


def predictions(ctx, indices: Sequence[int], n_vocab: int, width: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """What a head's decode gave at these rows of its batch: the logits, and the head's own state there
    (for its next step)."""
    return list(zip(logits_rows(ctx, indices, n_vocab), hidden_states(ctx, indices, width)))


def add_token(batch, seq: int, token: int, pos: int, state: np.ndarray, output: bool) -> np.ndarray:
    """A token at `pos` of `seq`, with a state row beside its embedding; returns the row, which must
    outlive the `llama_process` call that reads it."""
    row = np.ascontiguousarray(state, dtype=np.float32)
    idx = L.llama_batch_ext_add_token(batch, seq, token)
    if idx < 0:
        raise LocalspecError(f"A head's batch refused a token ({idx}).")
    L.llama_batch_ext_set_pos(batch, idx, (ctypes.c_int32 * 1)(pos))
    L.llama_batch_ext_set_embd_token(batch, idx, L.llama_embd(row.ctypes.data_as(FLOATS), 1, len(row)))
    if output:
        L.llama_batch_ext_set_output_logits(batch, idx, True)
    return row


def add_state(batch, state: np.ndarray, pos: int) -> np.ndarray:
    """A state row alone (an encoder's input), at a placeholder position of sequence 0."""
    row = np.ascontiguousarray(state, dtype=np.float32)
    idx = L.llama_batch_ext_add_embd(batch, 0, L.llama_embd(row.ctypes.data_as(FLOATS), 1, len(row)))
    if idx < 0:
        raise LocalspecError(f"A head's encoder batch refused a row ({idx}).")
    L.llama_batch_ext_set_pos(batch, idx, (ctypes.c_int32 * 1)(pos))
    L.llama_batch_ext_set_output_embd(batch, idx, True)
    return row

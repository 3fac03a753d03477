"""A GGUF file through llama.cpp: loaded (`_load_model`), its tokenizer (`Vocab`), its metadata and what
speculative decoding can do with its state (`_Metadata`), a vocabulary-only load (`VocabFile`), and
requantized (`quantize`)."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

import llama_cpp as L

from localspec.engine.backend.grammar import Grammar
from localspec.engine.backend.staging import unavailable as heads_unavailable
from localspec.engine.backend.system import init, problems_mark, problems_since, utf8
from localspec.engine.constraint import trigger_token
from localspec.errors import LocalspecError, ModelFileError

VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2", 7: "test"}
# Snapshots of a recurrent state kept per decode (llama.cpp's n_rs_seq): the longest draft a hybrid
# target can take back (ModelOptions.rollback).
ROLLBACK_POSITIONS = 8


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value types
_STRING, _ARRAY = 8, 9


def read_architecture(path: Path) -> str | None:
    """`general.architecture` from a GGUF's header, read key by key up to it (writers put it first).
    gguf-py's reader builds every key, the tokenizer's strings one by one included: seconds at every load
    of a pair for this one value. None when the file is not a GGUF (v2 or v3)."""

    def skip(f, kind: int) -> None:
        if kind in _SCALAR_SIZES:
            f.seek(_SCALAR_SIZES[kind], 1)
        elif kind == _STRING:
            f.seek(struct.unpack("<Q", f.read(8))[0], 1)
        elif kind == _ARRAY:
            item, count = struct.unpack("<IQ", f.read(12))
            if item in _SCALAR_SIZES:
                f.seek(_SCALAR_SIZES[item] * count, 1)
            else:
                for _ in range(count):
                    skip(f, item)
        else:
            raise ValueError(f"unknown GGUF value type {kind}")

    try:
        with open(path, "rb") as f:
            magic, version, _tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
            if magic != b"GGUF" or version not in (2, 3):
                return None
            for _ in range(n_kv):
                key = f.read(struct.unpack("<Q", f.read(8))[0])
                kind = struct.unpack("<I", f.read(4))[0]
                if key == b"general.architecture" and kind == _STRING:
                    return f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8", "replace")
                skip(f, kind)
    except (OSError, ValueError, struct.error):
        return None
    return None


def _load_model(path: Path, *, vocab_only: bool, n_gpu_layers: int = 0, load_mode: int = L.LLAMA_LOAD_MODE_AUTO,
                devices: tuple[int, ...] = (), tensor_split: tuple[float, ...] = (), load_mtp: bool = False):
    init()
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"Model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(f"{path} is a folder, not a GGUF file.")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{path} is not a GGUF file (it does not start with 'GGUF').")
    params = L.llama_model_default_params()
    params.vocab_only = vocab_only
    params.n_gpu_layers = n_gpu_layers
    params.load_mode = load_mode
    params.load_mtp = load_mtp  # a file without MTP blocks loads the same either way
    if devices:  # kept alive until the load returns; llama.cpp copies the list into the model
        device_list = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
        params.devices = ctypes.cast(device_list, ctypes.c_void_p)
        params.split_mode = L.LLAMA_SPLIT_MODE_LAYER
        if tensor_split:
            split = (ctypes.c_float * L.llama_max_devices())(*tensor_split)
            params.tensor_split = split
    mark = problems_mark()
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        why = problems_since(mark) or "llama.cpp could not load it"
        raise ModelFileError(f"Cannot load {path.name}: {why}. The file may be truncated or corrupt; pull it again.")
    return model


class Vocab:
    """Tokenizer facts and conversions of one loaded model."""

    def __init__(self, model_ptr):
        self._vocab = L.llama_model_get_vocab(model_ptr)
        self.n_tokens = L.llama_vocab_n_tokens(self._vocab)
        self.type = VOCAB_TYPES.get(L.llama_vocab_type(self._vocab), "unknown")
        self.bos = L.llama_vocab_bos(self._vocab)
        self.eos = L.llama_vocab_eos(self._vocab)
        self.eot = L.llama_vocab_eot(self._vocab)
        self.add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
        self.add_eos = bool(L.llama_vocab_get_add_eos(self._vocab))
        self.fim_pre = L.llama_vocab_fim_pre(self._vocab)
        self.fim_suf = L.llama_vocab_fim_suf(self._vocab)
        self.fim_mid = L.llama_vocab_fim_mid(self._vocab)
        self.fim_pad = L.llama_vocab_fim_pad(self._vocab)
        self.fim_rep = L.llama_vocab_fim_rep(self._vocab)
        self.fim_sep = L.llama_vocab_fim_sep(self._vocab)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._control: dict[int, bool] = {}

    def text(self, token: int) -> str:
        raw = L.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        if token not in self._eog:
            self._eog[token] = bool(L.llama_vocab_is_eog(self._vocab, token))
        return self._eog[token]

    def is_control(self, token: int) -> bool:
        """A control token of the chat template (turn markers, end of text), never text."""
        if token not in self._control:
            self._control[token] = bool(L.llama_vocab_is_control(self._vocab, token)) or self.is_eog(token)
        return self._control[token]

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token adds to the output text (special tokens add none)."""
        piece = self._pieces.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def grammar(self, text: str, trigger: str | None = None) -> Grammar:
        """A GBNF grammar's start state over this vocabulary (engine/constraint.py); with `trigger`, it
        applies from that token on, which must be one token of exactly that text: llama.cpp then feeds
        the grammar exactly the token's text (a trigger inside a longer piece could feed it characters
        it forbids, which aborts the process)."""
        if trigger is None:
            return Grammar.compile(self._vocab, text)
        token = trigger_token(self, trigger)
        if token is None:
            raise LocalspecError(f"A grammar's trigger must be one token; '{trigger}' is not one here.")
        return Grammar.compile(self._vocab, text, token)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = utf8(text)
        capacity = len(data) + 8
        buf = (L.llama_token * capacity)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (L.llama_token * capacity)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        return list(buf[:n])

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")


# The architectures whose recurrent state llama.cpp rolls back with n_rs_seq snapshots: its
# llm_arch_supports_rs_rollback (src/llama-arch.cpp) in the build pinned by pyproject.toml, which the C API
# does not expose before a context exists. tests/test_hybrid.py checks it against a real context.
ROLLBACK_ARCHITECTURES = frozenset({"kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next",
                                    "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"})


class _Metadata:
    """The GGUF's metadata, for a loaded model or a vocabulary-only one."""

    _model: object

    def decoding(self) -> str:
        """What speculative decoding can do with this file's state, in one line for `check` and `run`."""
        architecture = self.meta("general.architecture") or "unknown"
        if architecture == "eagle3":
            return (f"eagle3, an EAGLE-3 draft for a target of hidden size "
                    f"{self.meta('eagle3.target_hidden_size')} (the `eagle3` drafter)")
        if architecture == "dflash":
            return (f"dflash, a DFlash draft for a target of hidden size {self.meta('dflash.embedding_length')}, "
                    f"blocks of {self.meta('dflash.block_size') or 16} (the `dflash` drafter)")
        if architecture == "gemma4-assistant":
            return (f"gemma4-assistant, a Gemma 4 assistant for a Gemma 4 target of hidden size "
                    f"{self.meta('gemma4-assistant.embedding_length_out')}, reading its cache (the `mtp` drafter)")
        if not (L.llama_model_is_recurrent(self._model) or L.llama_model_is_hybrid(self._model)):
            return f"{architecture}, a KV cache: drafts of any length{self._heads()}"
        if architecture in ROLLBACK_ARCHITECTURES:
            return (f"{architecture}, with a recurrent state llama.cpp rolls back: drafts of up to "
                    f"{ROLLBACK_POSITIONS} tokens, prompts reused from checkpoints{self._heads()}")
        return f"{architecture}, with a recurrent state llama.cpp cannot roll back: plain decoding only"

    def _heads(self) -> str:
        """The file's MTP heads, as `decoding` names them ("" without)."""
        architecture = self.meta("general.architecture") or "unknown"
        value = self.meta(f"{architecture}.nextn_predict_layers") or "0"  # (a vocabulary-only load reads 0 heads)
        n = int(value) if value.isdigit() else 0
        if n <= 0:
            return ""
        heads = f"{n} MTP head{'s' if n > 1 else ''}"
        if why := heads_unavailable():
            return f"; {heads}, unused: {why}"
        if n > 1:  # llama.cpp chains them, one head a token (backend/mtp.py)
            return f"; {heads}, chained (the `mtp` drafter: drafts of up to {n} tokens)"
        return f"; {heads} (the `mtp` drafter)"

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        raw = L.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", "replace") if raw else None


class VocabFile(_Metadata):
    """A GGUF opened for its vocabulary only (fast; no weights are read): tokenizer, metadata, chat template."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._model = None
        self._model = _load_model(self.path, vocab_only=True)
        self.vocab = Vocab(self._model)

    def close(self) -> None:
        if self._model:
            L.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "VocabFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def quantize(source: Path, destination: Path, ftype: str = "Q2_K", threads: int | None = None) -> Path:
    """Requantize a GGUF with llama.cpp's own quantizer (used to make a weaker test draft)."""
    init()
    code = getattr(L, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if code is None:
        raise LocalspecError(f"Unknown quantization type {ftype}.")
    params = L.llama_model_quantize_default_params()
    params.ftype = code
    params.allow_requantize = True
    params.nthread = threads or (os.cpu_count() or 1)
    tmp = Path(str(destination) + ".partial")
    mark = problems_mark()
    rc = L.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise ModelFileError(f"Quantizing {source} failed: {problems_since(mark) or rc}")
    os.replace(tmp, destination)
    return Path(destination)

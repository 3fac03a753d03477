"""A GBNF grammar on llama.cpp's grammar sampler: the `Constraint` of engine/constraint.py.

llama.cpp aborts the process when its grammar accepts a token it forbids, so the speculative loop only
ever accepts tokens `allows` passed (engine/speculative.py)."""

from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp as L
import numpy as np

from localspec.engine.backend.system import init, problems_mark, problems_since, utf8
from localspec.errors import LocalspecError

# llama_token_data as numpy sees it: the candidates are handed to llama.cpp without a copy.
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class Grammar:
    def __init__(self, sampler):
        self._sampler = sampler

    @classmethod
    def compile(cls, vocab_ptr, text: str, trigger_token: int | None = None) -> "Grammar":
        """With `trigger_token`, the grammar applies from that token on, any text before it (llama.cpp's
        lazy grammar, as its server uses for tool calls); the grammar's text starts with the token's."""
        init()
        mark = problems_mark()
        if trigger_token is None:
            sampler = L.llama_sampler_init_grammar(vocab_ptr, utf8(text), b"root")
        else:
            tokens = (L.llama_token * 1)(trigger_token)
            sampler = L.llama_sampler_init_grammar_lazy_patterns(vocab_ptr, utf8(text), b"root", None, 0, tokens, 1)
        if not sampler:
            why = problems_since(mark) or "llama.cpp could not parse it"
            raise LocalspecError(f"The grammar is not valid GBNF with a 'root' rule: {why}.")
        return cls(sampler)

    def allows(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        candidates = np.zeros(len(tokens), dtype=TOKEN_DATA)
        candidates["id"] = tokens
        array = L.llama_token_data_array(candidates.ctypes.data_as(ctypes.POINTER(L.llama_token_data)),
                                         len(candidates), -1, False)
        L.llama_sampler_apply(self._sampler, ctypes.byref(array))
        return np.isfinite(candidates["logit"])

    def accept(self, token: int) -> None:
        L.llama_sampler_accept(self._sampler, int(token))

    def fork(self) -> "Grammar":
        return Grammar(L.llama_sampler_clone(self._sampler))

    def close(self) -> None:
        if self._sampler is not None and L is not None:  # (L is None during interpreter shutdown)
            L.llama_sampler_free(self._sampler)
        self._sampler = None

    def __del__(self) -> None:
        self.close()

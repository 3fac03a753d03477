"""Answer tokens' log-probabilities in each dialect's shape (the engine's `TokenLogprob`, one per emitted
token, from the target's verify rows: drafted or not, the rows plain decoding has).

Asked for as OpenAI's `logprobs` + `top_logprobs` (chat) or `logprobs: N` (legacy completions),
llama.cpp's `n_probs`, Ollama's `logprobs` + `top_logprobs`."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from localspec.engine.events import Round, TokenLogprob
from localspec.server.common import ApiError

# The most alternatives one token may list: OpenAI's limit for top_logprobs (each costs a partial sort of
# the vocabulary per token, and a line of JSON per alternative).
MAX_TOP = 20

Piece = Callable[[int], bytes]  # a token's bytes (Vocabulary.token_bytes)


def top_count(asked: bool | None, top: int | None, field: str = "top_logprobs") -> int | None:
    """The alternatives per token a request asks for (`asked`: its logprobs flag), or None for none.
    `top` without `asked` is a 400, as OpenAI answers it."""
    if top and not asked:  # (0 without logprobs asks for nothing: a client's neutral value)
        raise ApiError(400, f"{field} needs logprobs set to true.")
    if not asked:
        return None
    return checked_top(top or 0, field)


def checked_top(top: int, field: str) -> int:
    if not 0 <= top <= MAX_TOP:
        raise ApiError(400, f"{field} must be between 0 and {MAX_TOP} (got {top}).")
    return top


class Pending:
    """Log-probabilities of rounds not yet sent (a round whose text a stop string holds back sends
    nothing: its tokens' go with the next chunk that is sent)."""

    def __init__(self) -> None:
        self.items: list[TokenLogprob] = []

    def add(self, event: Round) -> None:
        self.items.extend(event.logprobs)

    def take(self) -> list[TokenLogprob]:
        out, self.items = self.items, []
        return out


def _text(piece: Piece, token: int) -> tuple[str, list[int]]:
    raw = piece(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def token_entries(piece: Piece, items: Iterable[TokenLogprob]) -> list[dict[str, Any]]:
    """Ollama's `logprobs`, and the `content` of OpenAI chat's: each token's text, bytes and
    log-probability, and its alternatives'."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text, raw = _text(piece, token)
        return {"token": text, "logprob": logprob, "bytes": raw}

    return [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in items]


def openai_content(piece: Piece, items: Iterable[TokenLogprob]) -> dict[str, Any]:
    """OpenAI chat's `choices[].logprobs`."""
    return {"content": token_entries(piece, items), "refusal": None}


def openai_legacy(piece: Piece, items: Iterable[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """OpenAI legacy completions' `choices[].logprobs`; `offset`: characters of text before these tokens."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp in items:
        text, _raw = _text(piece, lp.token)
        out["tokens"].append(text)
        out["token_logprobs"].append(lp.logprob)
        out["top_logprobs"].append({_text(piece, t)[0]: v for t, v in lp.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def llama_cpp(piece: Piece, items: Iterable[TokenLogprob]) -> list[dict[str, Any]]:
    """llama.cpp's `completion_probabilities` (its server's format since logprobs replaced probs)."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text, raw = _text(piece, token)
        return {"id": token, "token": text, "bytes": raw, "logprob": logprob}

    return [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in items]

"""From logits to tokens, and the speculative acceptance rules. Pure numpy, no I/O.

The target's distribution p and the draft's q go through the same `Sampler.probs`, with the same
settings and the same token history, so that exact speculative sampling reproduces p.
Filter order follows llama.cpp's default chain: penalties, top-k, top-p, min-p, then temperature.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0     # 0 = greedy
    top_k: int = 40              # 0 = off
    top_p: float = 0.95          # 1 = off
    min_p: float = 0.05          # 0 = off
    repeat_penalty: float = 1.0  # 1 = off
    repeat_last_n: int = 64
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def with_(self, **changes) -> "SamplingSettings":
        return replace(self, **changes)


def penalize(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """llama.cpp's repeat penalty: shrink the logit of every token seen in the recent window."""
    if penalty == 1.0 or not len(recent):
        return logits
    out = logits.astype(np.float32, copy=True)
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    values = out[seen]
    out[seen] = np.where(values > 0, values / penalty, values * penalty)
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - np.max(logits))
    return shifted / shifted.sum()


def filtered_probs(logits: np.ndarray, s: SamplingSettings) -> np.ndarray:
    """Probabilities over the whole vocabulary after top-k, top-p, min-p and temperature."""
    n = logits.shape[-1]
    k = s.top_k if 0 < s.top_k < n else n
    candidates = np.argpartition(-logits, k - 1)[:k] if k < n else np.arange(n)
    cand_logits = logits[candidates].astype(np.float64)
    order = np.argsort(-cand_logits, kind="stable")
    candidates, cand_logits = candidates[order], cand_logits[order]

    base = softmax(cand_logits)
    keep = len(candidates)
    if s.top_p < 1.0:
        cumulative = np.cumsum(base)
        keep = min(keep, int(np.searchsorted(cumulative, s.top_p, side="left")) + 1)
    if s.min_p > 0.0:
        keep = min(keep, max(1, int(np.count_nonzero(base >= s.min_p * base[0]))))
    candidates, cand_logits = candidates[:keep], cand_logits[:keep]

    probs = np.zeros(n, dtype=np.float64)
    probs[candidates] = softmax(cand_logits / max(s.temperature, 1e-6))
    return probs


class Sampler:
    """Sampling settings plus the random stream of one generation."""

    def __init__(self, settings: SamplingSettings):
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)

    @property
    def greedy(self) -> bool:
        return self.settings.greedy

    def recent(self, history: Sequence[int]) -> Sequence[int]:
        n = self.settings.repeat_last_n
        return history[-n:] if n > 0 else ()

    def adjusted(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        return penalize(logits, self.recent(history), self.settings.repeat_penalty)

    def argmax(self, logits: np.ndarray, history: Sequence[int]) -> int:
        return int(np.argmax(self.adjusted(logits, history)))

    def probs(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        return filtered_probs(self.adjusted(logits, history), self.settings)

    def draw(self, probs: np.ndarray) -> int:
        return int(self.rng.choice(len(probs), p=probs / probs.sum()))

    def uniform(self) -> float:
        return float(self.rng.random())


class Choices(Protocol):
    """The target's choice at row i (a list, or rows computed only when asked for)."""

    def __getitem__(self, i: int) -> int: ...


def accept_greedy(draft: Sequence[int], target_choice: Choices) -> tuple[int, int]:
    """Keep the longest draft prefix that matches the target's argmax; then the target's own token.

    `target_choice[i]` is the target's argmax after the first i draft tokens (len(draft) + 1 entries).
    Returns (number accepted, the token the target supplies next).
    """
    n = 0
    while n < len(draft) and draft[n] == target_choice[n]:
        n += 1
    return n, int(target_choice[n])


def accept_sampled(
    draft: Sequence[int],
    p: np.ndarray,
    q: np.ndarray | None,
    uniform,
    draw,
) -> tuple[int, int]:
    """Exact speculative sampling (Leviathan et al.; Chen et al.).

    p: target probabilities, len(draft)+1 rows. q: draft probabilities, len(draft) rows, or None for a
    drafter without a distribution (q is one-hot on its token). Accept token x with min(1, p(x)/q(x));
    on rejection sample from normalize(max(0, p - q)); after a full accept, sample a bonus from p.
    """
    for i, token in enumerate(draft):
        q_x = 1.0 if q is None else float(q[i][token])
        p_x = float(p[i][token])
        if q_x > 0 and uniform() < min(1.0, p_x / q_x):
            continue
        if q is None:
            residual = p[i].copy()
            residual[token] = 0.0
        else:
            residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0.0:
            residual = p[i]
        return i, draw(residual)
    return len(draft), draw(p[len(draft)])

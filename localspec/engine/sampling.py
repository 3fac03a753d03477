"""From logits to tokens, and the speculative acceptance rules. Pure numpy, no I/O.

The target's distribution p and the draft's q go through the same `Sampler.probs`, with the same
settings and the same token history, so that exact speculative sampling reproduces p.
Filter order follows llama.cpp's default chain: penalties, top-k, top-p, min-p, then temperature; a
request may name its own chain (llama.cpp's `samplers`), including llama.cpp's `infill` sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

import numpy as np

from localspec.engine.constraint import Constraint, best_allowed, masked, top_ids, top_k_allowed
from localspec.engine.events import TokenLogprob


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0     # 0 = greedy
    top_k: int = 40              # 0 = off
    top_p: float = 0.95          # 1 = off
    min_p: float = 0.05          # 0 = off
    repeat_penalty: float = 1.0  # 1 = off
    repeat_last_n: int = 64
    seed: int | None = None
    # llama.cpp's `samplers`: the filters in order, from top_k, top_p, min_p, temperature, infill (others
    # are not offered); None: the default chain. Temperature 0 is greedy either way: the token with the
    # highest logit among those the chain keeps.
    samplers: tuple[str, ...] | None = None
    # A GBNF grammar every token must follow (JSON schemas arrive converted by the server); None: free text.
    grammar: str | None = None
    # The grammar applies from this text on, any text before it (tool_choice auto: free text or a call).
    grammar_trigger: str | None = None
    # Report each answer token's log-probability under the target (the raw logits' softmax, as OpenAI's
    # `logprobs` and llama.cpp's `n_probs` mean it) with this many most likely alternatives; None: not asked.
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def replayable(self) -> bool:
        """Greedy on the raw logits (no penalty, no infill filter): the answer is a function of the
        context alone, so an earlier answer to the same context may be replayed (`accept_replayed`)."""
        return (self.greedy and self.repeat_penalty == 1.0 and "infill" not in (self.samplers or ())
                and self.grammar is None)

    def with_(self, **changes) -> "SamplingSettings":
        return replace(self, **changes)


def penalize(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """llama.cpp's repeat penalty: shrink the logit of every token seen in the recent window."""
    if penalty == 1.0 or not len(recent):
        return logits
    out = logits.astype(np.float32, copy=True)
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    seen = seen[seen >= 0]  # (an image's positions are no token)
    values = out[seen]
    out[seen] = np.where(values > 0, values / penalty, values * penalty)
    return out


def token_logprob(logits: np.ndarray, token: int, top: int = 0) -> TokenLogprob:
    """`token`'s log-probability in the distribution of the raw `logits` (no filter, no temperature),
    and the `top` most likely tokens' (best first)."""
    x = logits.astype(np.float64, copy=False)
    peak = float(x.max())
    norm = peak + float(np.log(np.exp(x - peak).sum()))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        k = min(top, len(x))
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.argsort(-x[ids], kind="stable")]
        best = tuple((int(i), float(x[i]) - norm) for i in ids)
    return TokenLogprob(int(token), float(x[token]) - norm, best)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits.astype(np.float64) - np.max(logits))
    return shifted / shifted.sum()


CHAIN_STEPS = ("top_k", "top_p", "min_p", "temperature", "infill")


@dataclass(frozen=True)
class InfillVocab:
    """What llama.cpp's infill sampler asks of the vocabulary."""

    is_eog: Callable[[int], bool]
    piece: Callable[[int], bytes]   # the token's text without special tokens rendered (b"" for those)
    eot: int                        # the token that ends an infill (EOT, else EOS)


def infill_survivors(ids: np.ndarray, logits: np.ndarray, vocab: InfillVocab) -> np.ndarray:
    """llama.cpp's infill sampler (src/llama-sampler.cpp, llama_sampler_infill_apply) on candidates in
    order of probability: the candidates it keeps. When end-of-generation tokens carry more than a third
    of the average text token's probability (3 * p_eog * n > p_text), only they are kept: the
    completion ends. Otherwise a token whose text begins another candidate's absorbs that one's
    probability (the likelier keeps it), candidates below 0.2 go, then those below 1 / (n + 1) of what
    is left (end-of-generation tokens always stay); none left but those: the EOT token alone. What is
    sampled after it comes from the survivors' logits, so this returns the survivors."""
    p = softmax(logits)
    eog = np.array([vocab.is_eog(int(t)) for t in ids], dtype=bool)
    if 3 * p[eog].sum() * len(ids) > p[~eog].sum():
        return ids[eog]
    alive = np.ones(len(ids), dtype=bool)
    pieces = [vocab.piece(int(t)) for t in ids]
    for i0 in range(len(ids)):
        for i1 in range(len(ids)):
            if not alive[i0]:
                break
            if i0 == i1 or not alive[i1]:
                continue
            a, b = pieces[i0], pieces[i1]
            if a and len(a) <= len(b) and b.startswith(a):
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                p[src] = 0.0
                alive[src] = False
    keep = alive & ((p >= 0.2) | eog)
    if not (keep & ~eog).any():
        return np.array([vocab.eot], dtype=ids.dtype)
    p = np.where(keep, p, 0.0) / p[keep].sum()
    keep &= (p >= 1.0 / (np.count_nonzero(keep & ~eog) + 1)) | eog
    return ids[keep]


def _chain(logits: np.ndarray, s: SamplingSettings, infill: InfillVocab | None) -> tuple[np.ndarray, np.ndarray]:
    """The candidates a request's own chain keeps, in order of logit, and their logits (temperature
    applied where the chain has it)."""
    steps = s.samplers or ()
    if steps and steps[0] == "top_k" and 0 < s.top_k < len(logits):  # the usual start: no full sort
        ids = top_ids(logits, s.top_k)
    else:
        ids = np.argsort(-logits, kind="stable")
    values = logits[ids].astype(np.float64)
    for step in steps:
        if step == "top_k" and 0 < s.top_k < len(ids):
            ids, values = ids[:s.top_k], values[:s.top_k]
        elif step == "top_p" and s.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(softmax(values)), s.top_p, side="left")) + 1
            ids, values = ids[:keep], values[:keep]
        elif step == "min_p" and s.min_p > 0.0:
            p = softmax(values)
            keep = max(1, int(np.count_nonzero(p >= s.min_p * p[0])))
            ids, values = ids[:keep], values[:keep]
        elif step == "temperature" and s.temperature > 0:
            values = values / s.temperature
        elif step == "infill" and infill is not None:
            survivors = infill_survivors(ids, values, infill)
            position = {int(t): i for i, t in enumerate(ids)}
            values = np.array([values[position[int(t)]] if int(t) in position else 0.0 for t in survivors])
            ids = survivors
    return ids, values


def filtered_probs(logits: np.ndarray, s: SamplingSettings, infill: InfillVocab | None = None) -> np.ndarray:
    """Probabilities over the whole vocabulary after top-k, top-p, min-p and temperature (or the
    request's own chain)."""
    n = logits.shape[-1]
    if s.samplers is not None:
        ids, values = _chain(logits, s, infill)
        probs = np.zeros(n, dtype=np.float64)
        probs[ids] = softmax(values)
        return probs
    k = s.top_k if 0 < s.top_k < n else n
    candidates = top_ids(logits, k)
    cand_logits = logits[candidates].astype(np.float64)

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

    def __init__(self, settings: SamplingSettings, infill: InfillVocab | None = None):
        self.settings = settings
        self.infill = infill
        # A negative seed is llama.cpp's "random" (-1, what llama-server's /props advertises)
        self.rng = np.random.default_rng(settings.seed if settings.seed is None or settings.seed >= 0 else None)

    @property
    def greedy(self) -> bool:
        return self.settings.greedy

    def penalty_tail(self, context: Sequence[int]) -> list[int]:
        """The context's tokens a repetition penalty reads (none without one): a verify row's history is
        this tail and the draft tokens before the row."""
        if self.settings.repeat_penalty == 1.0:
            return []
        return list(context[-max(self.settings.repeat_last_n, 0):])

    def recent(self, history: Sequence[int]) -> Sequence[int]:
        n = self.settings.repeat_last_n
        return history[-n:] if n > 0 else ()

    def adjusted(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        return penalize(logits, self.recent(history), self.settings.repeat_penalty)

    def argmax(self, logits: np.ndarray, history: Sequence[int], constraint: Constraint | None = None) -> int:
        adjusted = self.adjusted(logits, history)
        chain = self.settings.samplers is not None and "infill" in self.settings.samplers
        if constraint is not None:
            if not chain:
                return best_allowed(adjusted, constraint)
            adjusted = masked(adjusted, constraint)
        if chain:
            ids, values = _chain(adjusted, self.settings, self.infill)
            return int(ids[int(np.argmax(values))])
        return int(np.argmax(adjusted))

    def probs(self, logits: np.ndarray, history: Sequence[int], constraint: Constraint | None = None) -> np.ndarray:
        adjusted = self.adjusted(logits, history)
        if constraint is not None:  # a request's own chain may cut before top-k: every allowed token then
            adjusted = top_k_allowed(adjusted, constraint, self.settings.top_k if self.settings.samplers is None else 0)
        return filtered_probs(adjusted, self.settings, self.infill)

    def draw(self, probs: np.ndarray) -> int:
        # Among the tokens that can be drawn (a few dozen after top-k): the same draw from the stream as
        # over the whole vocabulary, at a fraction of its cost.
        support = (probs > 0).nonzero()[0]
        p = probs[support]
        return int(support[self.rng.choice(len(support), p=p / p.sum())])

    def uniform(self) -> float:
        return float(self.rng.random())

    def draft_token(self, logits: np.ndarray, history: Sequence[int], confidence: bool) -> tuple[int, float, np.ndarray | None]:
        """A model drafter's next token from its logits: greedy, the adjusted argmax (its probability
        computed only when `confidence` is wanted, else 1.0); sampling, a draw from q, which is returned
        for speculative sampling's acceptance. With the token's probability, the drafter's confidence."""
        if self.greedy:
            adjusted = self.adjusted(logits, history)
            token = int(np.argmax(adjusted))
            return token, float(softmax(adjusted)[token]) if confidence else 1.0, None
        q = self.probs(logits, history)
        return self.draw(q), float(q.max()), q

    def second_candidate(self, logits: np.ndarray, history: Sequence[int], first: int,
                         q: np.ndarray | None) -> tuple[int, float]:
        """A candidate beside a model drafter's `first` token (a candidate tree's leaf) and what it is
        worth where its depth is reached: greedy, the runner-up and its probability; sampling, another
        draw from q, independent of the first (the multi-candidate rule needs each drawn from q: its worth
        is the chance the first is not the target's, never read from the draw)."""
        if q is not None:
            return self.draw(q), 1.0 - float(q.max())
        p = softmax(self.adjusted(logits, history))
        p[first] = -1.0
        token = int(np.argmax(p))
        return token, float(p[token])


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


# How far below the best logit a replayed token may be. llama.cpp's batched and one-token kernels sum in
# different orders, so one position's logits differ between a verify batch and one-token decoding and a
# near tie can flip. The tolerance keeps such ties, several times the largest shortfall measured
# (docs/tuning.md, "Replays"), and nothing the target clearly prefers (a gap of 0.5 is odds of 1.65 to 1).
REPLAY_TOLERANCE = 0.5


def accept_replayed(draft: Sequence[int], target_choice: Choices, shortfall: Callable[[int, int], float],
                    tolerance: float = REPLAY_TOLERANCE) -> tuple[int, int]:
    """`accept_greedy` for a replayed answer: a draft that is the target's own greedy answer to this same
    context, recorded when it was decoded before (the history drafter's replay). A token is kept where
    it is this evaluation's argmax or falls short of the best logit by at most `tolerance`
    (`shortfall(i, token)`): the kernels' noise between that decoding and this batch, not a choice of
    the drafter's. Otherwise the target's own token ends the round, as in `accept_greedy`.
    """
    n = 0
    while n < len(draft) and (draft[n] == target_choice[n] or shortfall(n, draft[n]) <= tolerance):
        n += 1
    return n, int(target_choice[n])


def accept_sampled(
    draft: Sequence[int],
    p: np.ndarray,
    q: np.ndarray | None,
    uniform,
    draw,
    q_next: np.ndarray | None = None,
) -> tuple[int, int]:
    """Exact speculative sampling (Leviathan et al.; Chen et al.).

    p: target probabilities, len(draft)+1 rows. q: draft probabilities, len(draft) rows, or None for a
    drafter without a distribution (q is one-hot on its token). Accept token x with min(1, p(x)/q(x));
    on rejection sample from normalize(max(0, p - q)); after a full accept, sample a bonus from p.
    `q_next`: the draft's distribution at the position after the last token, when the draft went on
    with a token the grammar forbids (cut before verifying): that token is rejected for certain, so the
    last row samples from normalize(max(0, p - q_next)) instead of p.
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
    last = p[len(draft)]
    if q_next is not None:
        residual = np.maximum(last - q_next, 0.0)
        if residual.sum() > 0.0:
            return len(draft), draw(residual)
    return len(draft), draw(last)

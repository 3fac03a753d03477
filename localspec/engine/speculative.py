"""The speculative loop: draft -> verify in one batch -> accept/reject -> roll back -> repeat.

Invariant between rounds: the target's KV cache holds every token of `context` except the last one,
which is *pending*. A round evaluates [pending] + draft in one batch with logits at every position:
row i is the target's distribution after the first i draft tokens, so k draft tokens yield k + 1
rows, the last one giving the bonus token after a full accept. Rejected positions are removed with
one KV truncation; the target's own token becomes the next pending token.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from localspec.engine.adaptive import Acceptance, CostModel, DrafterCost, best_length, margin_for
from localspec.engine.drafters import Draft, ModelDrafter, NgramDrafter
from localspec.engine.kv import KvSequence
from localspec.engine.sampling import Sampler, accept_greedy, accept_sampled

DRAFTER_MODES = ("auto", "model", "self", "ngram", "none")


@dataclass
class Step:
    """The token-level outcome of one round."""

    draft: Draft
    accepted: int
    token: int
    verify_s: float

    @property
    def kind(self) -> str:
        if not self.draft.tokens:
            return "plain"
        return "bonus" if self.accepted == len(self.draft.tokens) else "correction"


def speculate(target: KvSequence, context: list[int], planner: "Planner", sampler: Sampler,
              cancel: threading.Event) -> Iterator[Step]:
    """Yield one Step per round until cancelled or the context is full; `context` grows in place."""
    while not cancel.is_set():
        room = target.room() - 1  # positions left for draft tokens after the pending one
        if room < 0:
            return
        draft = planner.draft(context, room, sampler)
        batch = [context[-1], *draft.tokens]
        t0 = time.perf_counter()
        logits = target.extend(batch, range(len(batch)))
        verify_s = time.perf_counter() - t0

        tail = list(context[-max(sampler.settings.repeat_last_n, 0):]) if sampler.settings.repeat_penalty != 1.0 else []
        if sampler.greedy:
            accepted, token = accept_greedy(
                draft.tokens, _LazyChoices(lambda i: sampler.argmax(logits[i], tail + draft.tokens[:i]))
            )
        else:
            p = np.stack([sampler.probs(logits[i], tail + draft.tokens[:i]) for i in range(len(batch))])
            accepted, token = accept_sampled(draft.tokens, p, draft.q, sampler.uniform, sampler.draw)

        target.rewind(len(context) + accepted)  # keep pending + accepted draft tokens
        context.extend(draft.tokens[:accepted])
        context.append(token)
        planner.observe(draft, accepted, verify_s, len(batch), token)
        yield Step(draft=draft, accepted=accepted, token=token, verify_s=verify_s)


class _LazyChoices:
    """The target's choice at row i, computed only if the acceptance check gets that far."""

    def __init__(self, choose):
        self._choose = choose

    def __getitem__(self, i: int) -> int:
        return self._choose(i)


# ----------------------------------------------------------------------------- planning


# Prior acceptance of n-gram drafts by the evidence behind them: the match length (5 = 5 or more),
# "continuing" when the match carries on the previous round's copy, or "resumed" when the copy skips
# a token the target replaced (an edit). Measured with the default pair on edit/code/story prompts:
# a fresh 1-token match was kept 11-28% of the time, a continuing copy ~56-94%.
# "near": a one-token match close to the previous copy, which in generated (not copied) text is
# mostly coincidence: measured 26% on a code-generation answer while true continuations kept ~60-90%.
NGRAM_PRIORS = {"1": 0.15, "2": 0.3, "3": 0.45, "4": 0.55, "5": 0.7, "continuing": 0.6, "near": 0.25, "resumed": 0.3}
PLAUSIBLE_BEST_ACCEPTANCE = 0.9


@dataclass
class Planner:
    """Chooses each round's drafter and draft length, and learns from how the round went.

    `fixed_len` set: always draft that many (experiments). Otherwise the length maximizes expected
    tokens per second from the target's measured verify costs, the drafter's cost per token and
    acceptance by position (for n-gram lookup, by the length of the match behind the proposal).
    Length 0 is plain decoding. After `probe_every` rounds in which nothing was worth drafting, the
    drafter tried least recently gets a one-token probe, so that a change in the text (say, the
    answer starts quoting the prompt) is noticed; each probe doubles the wait for the next one until
    a drafter wins a round on its own merit again.
    """

    mode: str
    cost: CostModel
    model: ModelDrafter | None = None
    ngram: NgramDrafter | None = None
    fixed_len: int | None = None
    max_len: int = 8
    probe_every: int = 16
    max_probe_every: int = 256
    learn_costs: bool = True
    model_cost: DrafterCost = field(default_factory=DrafterCost)
    model_acceptance: Acceptance = field(default_factory=lambda: Acceptance(prior_mean=0.7, prior_strength=3.0))
    self_model: ModelDrafter | None = None      # a draft built from the target's own layers
    self_cost: DrafterCost = field(default_factory=DrafterCost)
    self_acceptance: Acceptance = field(default_factory=lambda: Acceptance(prior_mean=0.6, prior_strength=3.0))
    ngram_acceptance: dict[str, Acceptance] = field(default_factory=dict)
    _since_tried: dict[str, int] = field(default_factory=dict)  # rounds since each drafter/evidence key drafted
    _waited: int = 0            # rounds without a draft worth making since the last probe
    _probe_wait: int = 0        # rounds to wait before the next probe

    def __post_init__(self) -> None:
        self.configure(self.mode, self.fixed_len)
        for bucket, prior in NGRAM_PRIORS.items():
            self.ngram_acceptance.setdefault(bucket, Acceptance(prior_mean=prior, prior_strength=2.0))
        self._probe_wait = self.probe_every

    def configure(self, mode: str, fixed_len: int | None) -> None:
        """Settings of the next generation; what was learned so far is kept."""
        if mode not in DRAFTER_MODES:
            raise ValueError(f"unknown drafter '{mode}'; choose one of {', '.join(DRAFTER_MODES)}")
        self.mode, self.fixed_len = mode, fixed_len
        # Requests differ (an edit copies its input, a story does not): what earlier requests taught
        # is kept as a prior at reduced weight, so this one's own evidence takes over within a few rounds.
        for acceptance in (self.model_acceptance, self.self_acceptance, *self.ngram_acceptance.values()):
            acceptance.tried = [t * 0.3 for t in acceptance.tried]
            acceptance.kept = [k * 0.3 for k in acceptance.kept]

    @property
    def uses_model(self) -> bool:
        return self.model is not None and self.mode in ("auto", "model")

    @property
    def uses_self(self) -> bool:
        return self.self_model is not None and self.mode in ("auto", "self")

    @property
    def uses_ngram(self) -> bool:
        return self.ngram is not None and self.mode in ("auto", "ngram")

    def prefill(self, context: list[int]) -> None:
        if self.uses_model and self.model is not None:
            self.model.prepare(context)
        if self.uses_self and self.self_model is not None:
            self.self_model.prepare(context)

    def draft(self, context: list[int], room: int, sampler: Sampler) -> Draft:
        cap = min(self.fixed_len if self.fixed_len is not None else self.max_len, room)
        if cap <= 0 or self.mode == "none":
            return Draft.empty()
        options: list[tuple[float, str, int, Draft | None]] = []  # (rate, drafter, length, lookup result)
        if self.uses_ngram:
            proposal = self.ngram.propose(context, cap, sampler)  # type: ignore[union-attr]
            if proposal.tokens:
                if self.fixed_len is not None:
                    k, rate = len(proposal.tokens), float("inf")
                else:
                    k, rate = self._choose(_ngram_key(proposal), len(proposal.tokens), 0.0)
                options.append((rate, "ngram", k, proposal))
        for name, used, cost in (("model", self.uses_model, self.model_cost), ("self", self.uses_self, self.self_cost)):
            if not used:
                continue
            if self.fixed_len is not None:
                # Fixed length in auto mode: the lookup when it found something, a model otherwise.
                options.append((0.0 if options else float("inf"), name, cap, None))
            else:
                k, rate = self._choose(name, cap, cost.per_token_s)
                options.append((rate, name, k, None))

        for key in self._since_tried:
            self._since_tried[key] += 1
        viable = [o for o in options if o[2] > 0]
        if viable:
            _rate, name, k, proposal = max(viable, key=lambda o: o[0])
            self._probe_wait = self.probe_every
        else:
            probe = self._probe(options)
            if probe is None:
                return Draft.empty()
            name, k, proposal = probe
        if proposal is not None:
            proposal.tokens = proposal.tokens[:k]
            self._since_tried[_ngram_key(proposal)] = 0
            return proposal
        self._since_tried[name] = 0
        drafter = self.self_model if name == "self" else self.model
        return drafter.propose(context, k, sampler)  # type: ignore[union-attr]

    def _choose(self, key: str, cap: int, per_token_s: float) -> tuple[int, float]:
        acceptance = self._acceptance(key)
        return best_length(acceptance.rates(cap), self.cost, per_token_s, margin_for(acceptance.samples))

    def _probe(self, options) -> tuple[str, int, Draft | None] | None:
        """A one-token draft from the drafter tried least recently, when the wait is over; or None.

        Probes cost real time (a model draft must first catch up on everything decoded since), and a
        drafter that cannot pay on this machine even when nearly always right is never probed.
        """
        self._waited += 1
        if self._waited < self._probe_wait:
            return None
        candidates = []
        for _rate, name, _k, proposal in options:
            key = name if proposal is None else _ngram_key(proposal)
            per_token = 0.0 if proposal is not None else (self.self_cost if name == "self" else self.model_cost).per_token_s
            cap = len(proposal.tokens) if proposal is not None else self.max_len
            if best_length([PLAUSIBLE_BEST_ACCEPTANCE] * cap, self.cost, per_token)[0] > 0:
                candidates.append((self._since_tried.get(key, 10**9), name, proposal))  # never tried: first
        if not candidates:
            return None
        _since, name, proposal = max(candidates, key=lambda c: c[0])
        self._waited = 0
        self._probe_wait = min(self._probe_wait * 2, self.max_probe_every)
        return name, 1, proposal

    def _acceptance(self, key: str) -> Acceptance:
        if key == "model":
            return self.model_acceptance
        if key == "self":
            return self.self_acceptance
        return self.ngram_acceptance[key.split(":", 1)[1]]

    def observe(self, draft: Draft, accepted: int, verify_s: float, batch_n: int, token: int | None = None) -> None:
        if self.learn_costs:
            self.cost.observe(batch_n, verify_s)
        if not draft.tokens:
            return
        if draft.source in ("model", "self"):
            acceptance, cost = ((self.model_acceptance, self.model_cost) if draft.source == "model"
                                else (self.self_acceptance, self.self_cost))
            acceptance.observe(len(draft.tokens), accepted)
            if draft.per_token_s is not None and self.learn_costs:
                cost.observe(1, draft.per_token_s)
        elif draft.source == "ngram":
            self.ngram_acceptance[_bucket(draft)].observe(len(draft.tokens), accepted)
            if self.ngram is not None:
                self.ngram.observe(draft, accepted, token)


def _bucket(draft: Draft) -> str:
    if draft.continuing:
        if draft.evidence == 0:
            return "resumed"
        return "continuing" if draft.evidence >= 2 else "near"
    return str(max(1, min(draft.evidence, 5)))


def _ngram_key(draft: Draft) -> str:
    return f"ngram:{_bucket(draft)}"

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

from localspec.engine.adaptive import (ANSWER_COPY_PRIORS, PROMPT_COPY_PRIORS, Acceptance, CopyAcceptance, CostModel,
                                       DrafterCost, best_length, margin_for)
from localspec.engine.contract import DRAFTER_SETTINGS
from localspec.engine.drafters import Draft, ModelDrafter, NgramDrafter, OpeningDrafter
from localspec.engine.kv import KvSequence
from localspec.engine.sampling import Sampler, accept_greedy, accept_sampled

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
    openings: OpeningDrafter | None = None      # how this session's other answers began
    fixed_len: int | None = None
    max_len: int = 7            # longest model draft (a verify batch of 8, a calibrated size)
    copy_max_len: int = 15      # longest n-gram copy (free to draft; 16 positions batch well on CPUs)
    copy_min_len: int = 3       # a copy may always draft this many, however young
    probe_every: int = 16
    max_probe_every: int = 256
    learn_costs: bool = True
    model_cost: DrafterCost = field(default_factory=DrafterCost)
    model_acceptance: Acceptance = field(default_factory=lambda: Acceptance(prior_mean=0.7, prior_strength=3.0))
    self_model: ModelDrafter | None = None      # a draft built from the target's own layers
    self_cost: DrafterCost = field(default_factory=DrafterCost)
    self_acceptance: Acceptance = field(default_factory=lambda: Acceptance(prior_mean=0.6, prior_strength=3.0))
    # n-gram copies by age, of the prompt (True) and of the answer (False)
    copy_acceptance: dict[bool, CopyAcceptance] = field(default_factory=lambda: {
        True: CopyAcceptance(priors=PROMPT_COPY_PRIORS), False: CopyAcceptance(priors=ANSWER_COPY_PRIORS)})
    budget: int = 512           # answer tokens the request may still produce (prices a model drafter's catch-up)
    _since_tried: dict[str, int] = field(default_factory=dict)  # rounds since each model drafter drafted
    _waited: int = 0            # rounds without a draft worth making since the last probe
    _probe_wait: int = 0        # rounds to wait before the next probe

    def __post_init__(self) -> None:
        self.configure(self.mode, self.fixed_len)
        self._probe_wait = self.probe_every

    def configure(self, mode: str, fixed_len: int | None, budget: int | None = None) -> None:
        """Settings of the next generation, and how much of what was learned it starts from."""
        if mode not in DRAFTER_SETTINGS:
            raise ValueError(f"unknown drafter '{mode}'; choose one of {', '.join(DRAFTER_SETTINGS)}")
        self.mode, self.fixed_len = mode, fixed_len
        if budget is not None:
            self.budget = budget
        # What earlier requests taught about a model drafter is kept as a prior at reduced weight, so
        # this request's own evidence takes over within a few rounds. Copies start from their priors:
        # requests differ most there (an edit copies its input, a story does not); an edit's record
        # carried into a code question drafts its prompt's words at a loss (scripts/replay_planner.py).
        for acceptance in (self.model_acceptance, self.self_acceptance):
            acceptance.tried = [t * 0.3 for t in acceptance.tried]
            acceptance.kept = [k * 0.3 for k in acceptance.kept]
        for copies in self.copy_acceptance.values():
            copies.forget()

    @property
    def uses_model(self) -> bool:
        return self.model is not None and self.mode in ("auto", "model")

    @property
    def uses_self(self) -> bool:
        return self.self_model is not None and self.mode in ("auto", "self")

    @property
    def uses_ngram(self) -> bool:
        return self.ngram is not None and self.mode in ("auto", "ngram")

    def _model_drafters(self) -> list[tuple[str, ModelDrafter, DrafterCost]]:
        out = []
        if self.uses_model and self.model is not None:
            out.append(("model", self.model, self.model_cost))
        if self.uses_self and self.self_model is not None:
            out.append(("self", self.self_model, self.self_cost))
        return out

    def prefill(self, context: list[int]) -> None:
        """Bring the prompt into the model drafters that this request is expected to draft with.

        A drafter the planner does not expect to use costs nothing: no prefill now, and a catch-up
        (priced, see `catch_up_pays`) only when it first wins a round. On a CPU the default pair's
        draft model never pays, and prefilling it added ~50% to the time to first token
        (scripts/plain_parity.py measures both)."""
        cap = self.fixed_len if self.fixed_len is not None else self.max_len
        for name, drafter, cost in self._model_drafters():
            forced = self.fixed_len is not None and self.mode == name
            if forced or self._choose(name, cap, cost.per_token_s)[0] > 0:
                drafter.prepare(context)

    def catch_up_pays(self, drafter: ModelDrafter, context: list[int], rate: float, per_token_s: float) -> bool:
        """Whether drafting at `rate` tokens/s over the rest of the answer repays bringing the drafter's
        cache up to date first. A catch-up is a batched prefill: priced as the target's per-position
        cost in its largest calibrated batch, scaled by how much cheaper a draft token is than a target
        token."""
        behind = drafter.behind(context)
        if behind <= 2:
            return True
        largest = max(self.cost.verify_s)
        per_position = self.cost.verify(largest) / largest * per_token_s / self.cost.verify(1)
        saving_per_token = 1.0 / self.cost.plain_tokens_per_s - 1.0 / rate
        return saving_per_token * self.budget > behind * per_position

    def draft(self, context: list[int], room: int, sampler: Sampler) -> Draft:
        cap = min(self.fixed_len if self.fixed_len is not None else self.max_len, room)
        if cap <= 0 or self.mode == "none":
            return Draft.empty()
        options: list[tuple[float, str, int, Draft | None]] = []  # (rate, drafter, length, lookup result)
        if self.uses_ngram:
            copy_cap = min(self.fixed_len if self.fixed_len is not None else self.copy_max_len, room)
            proposal = self.ngram.propose(context, copy_cap, sampler)  # type: ignore[union-attr]
            if proposal.tokens:
                if self.fixed_len is not None:
                    k, rate = len(proposal.tokens), float("inf")
                else:
                    k, rate = self._choose_copy(proposal)
                options.append((rate, "ngram", k, proposal))
            if self.openings is not None and self.fixed_len is None:
                opening, rates = self.openings.propose(context, copy_cap)
                if opening.tokens:
                    k, rate = best_length(rates, self.cost, 0.0)
                    options.append((rate, "ngram", k, opening))
        for name, drafter, cost in self._model_drafters():
            if self.fixed_len is not None:
                # Fixed length in auto mode: the lookup when it found something, a model otherwise.
                options.append((0.0 if options else float("inf"), name, cap, None))
            else:
                k, rate = self._choose(name, cap, cost.per_token_s)
                if k > 0 and not self.catch_up_pays(drafter, context, rate, cost.per_token_s):
                    k = 0
                options.append((rate, name, k, None))

        for key in self._since_tried:
            self._since_tried[key] += 1
        viable = [o for o in options if o[2] > 0]
        if viable:
            _rate, name, k, proposal = max(viable, key=lambda o: o[0])
            self._probe_wait = self.probe_every
        else:
            probe = self._probe(options, context)
            if probe is None:
                return Draft.empty()
            name, k, proposal = probe
        if proposal is not None:
            proposal.tokens = proposal.tokens[:k]
            return proposal
        self._since_tried[name] = 0
        chosen = self.self_model if name == "self" else self.model
        assert chosen is not None  # only drafters the engine has are offered
        return chosen.propose(context, k, sampler)

    def _choose_copy(self, proposal: Draft) -> tuple[int, float]:
        """Length of an n-gram copy: priced by what copies of each age did, and no longer than twice
        its age (a copy earns its length: a young one drafted long mostly wasted the batch)."""
        copies = self.copy_acceptance[proposal.from_prompt]
        longest = min(len(proposal.tokens), max(self.copy_min_len, 2 * proposal.age))
        return best_length(copies.rates(proposal.age, longest), self.cost, 0.0,
                           margin_for(copies.samples(proposal.age)))

    def _choose(self, key: str, cap: int, per_token_s: float) -> tuple[int, float]:
        acceptance = self._acceptance(key)
        return best_length(acceptance.rates(cap), self.cost, per_token_s, margin_for(acceptance.samples))

    def _probe(self, options, context: list[int]) -> tuple[str, int, Draft | None] | None:
        """A one-token draft from the model drafter tried least recently, when the wait is over; or None.

        Probes cost real time (a model draft must first catch up on everything decoded since), and a
        drafter that cannot pay on this machine even when nearly always right is never probed. Lookups
        are not probed: each request starts again from the priors of copies by age, and probing young
        copies judged not worth drafting costs code answers (scripts/replay_planner.py measures it).
        """
        self._waited += 1
        if self._waited < self._probe_wait:
            return None
        candidates = []
        drafters = {name: drafter for name, drafter, _cost in self._model_drafters()}
        for _rate, name, _k, proposal in options:
            if proposal is not None:
                continue
            per_token = (self.self_cost if name == "self" else self.model_cost).per_token_s
            k, rate = best_length([PLAUSIBLE_BEST_ACCEPTANCE] * self.max_len, self.cost, per_token)
            if k > 0 and self.catch_up_pays(drafters[name], context, rate, per_token):
                candidates.append((self._since_tried.get(name, 10**9), name))  # never tried: first
        if not candidates:
            return None
        _since, name = max(candidates, key=lambda c: c[0])
        self._waited = 0
        self._probe_wait = min(self._probe_wait * 2, self.max_probe_every)
        return name, 1, None

    def _acceptance(self, key: str) -> Acceptance:
        return self.model_acceptance if key == "model" else self.self_acceptance

    def observe(self, draft: Draft, accepted: int, verify_s: float, batch_n: int, token: int | None = None) -> None:
        self.budget = max(self.budget - accepted - 1, 0)
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
        elif draft.source == "ngram" and not draft.opening:
            self.copy_acceptance[draft.from_prompt].observe(draft.age, len(draft.tokens), accepted)
            if self.ngram is not None:
                self.ngram.observe(draft, accepted, token)



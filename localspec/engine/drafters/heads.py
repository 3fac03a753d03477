"""The "mtp" and "eagle3" drafters: a head that drafts from the target's hidden states, the target's own
multi-token-prediction head (backend/mtp.py) or an EAGLE-3 draft trained on them (backend/eagle3.py),
with no catch-up: the head's cache follows every target decode.

Each step feeds the head the last token and a state before it (the target's for the pending token, then
the head's own), as llama.cpp's `draft-mtp` and `draft-eagle3` do; the draft's positions are dropped from
the head's cache before the verify writes them again with the target's states. Priced as the draft model
is: its measured cost per draft token against the target's verify costs, and its acceptance by position.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from localspec.engine.adaptive import Acceptance, DrafterCost, best_length, margin_for
from localspec.engine.drafters.base import Chain, Draft, Drafter, Offer, Plan, Sources, Turn
from localspec.engine.kv import KvSequence
from localspec.engine.model import PredictionHead
from localspec.engine.sampling import Sampler


class HeadDrafter(Drafter):
    """What a head's drafting learns across requests: its cost per token and acceptance by position."""

    name = "mtp"
    max_len = 3            # llama.cpp's default draft length for its heads (common.h, n_max)
    plausible_best = 0.9   # the acceptance a probe assumes
    measured_steps = 5     # head steps timed at load for its cost per draft token

    def __init__(self, head: PredictionHead, p_min: float = 0.5, per_token_s: float = 0.0, prior: float = 0.7,
                 learn_costs: bool = True, name: str = "mtp", max_steps: int | None = None):
        self.name = name  # "mtp" (the target's own head) or "eagle3" (an EAGLE-3 draft)
        self.head = head
        self.max_steps = max_steps  # chained heads: no draft longer (llama.cpp caps its n_max so)
        if max_steps is not None:
            self.max_len = min(self.max_len, max_steps)
        self.p_min = p_min
        self.cost = DrafterCost(per_token_s=per_token_s)
        self.acceptance = Acceptance(prior_mean=prior, prior_strength=3.0)
        self.learn_costs = learn_costs

    @classmethod
    def build(cls, sources: Sources, name: str = "mtp") -> "HeadDrafter | None":
        head = (sources.assistant or sources.target.mtp) if name == "mtp" else sources.eagle3
        if head is None:
            return None
        per_token = sources.draft_cost_s
        if per_token is None:
            per_token = cls.measure(head, sources.target.n_seq - 1)
        return cls(head, p_min=sources.p_min, per_token_s=per_token, learn_costs=sources.learn_costs, name=name,
                   max_steps=head.max_steps)

    @classmethod
    def measure(cls, head: PredictionHead, seq: int) -> float:
        """Seconds per draft token: the median of a few head steps, in a sequence no request holds yet
        (its cache is emptied again after). Chained heads are stepped a whole chain at a time, a few times
        (a later head's step decodes the draft so far again, so it costs more)."""
        steps = head.max_steps or cls.measured_steps + 1
        times = []
        for _chain in range(1 if head.max_steps is None else 4):
            hidden = np.zeros(head.n_embd, dtype=np.float32)
            for pos in range(1, steps + 1):  # (an EAGLE-3 step at pos writes pos - 1)
                t0 = time.perf_counter()
                _logits, hidden = head.predict(seq, 0, pos, hidden)
                times.append(time.perf_counter() - t0)
            head.forget(seq, 0)
        return float(np.median(times[1:]))  # the first step sets up the head's graph

    drafts_together = True  # (its cache follows every target decode, shared ones too)
    batched = True  # (PredictionHead.predict_many: one decode for every sequence's step)

    def token_s(self) -> float:
        return self.cost.per_token_s

    def draft_many(self, asks: Sequence[tuple[Turn, Sequence[int], int, Sampler]]) -> list[Draft]:
        """Chains for one request (`HeadTurn.draft`) or several at once, each from its pending token and the
        trunk's state before it: one head step per draft position holding every chain still going
        (`PredictionHead.predict_many`), the draft positions dropped again after."""
        t0 = time.perf_counter()
        chains: list[_Chain] = []
        for i, (turn, context, length, sampler) in enumerate(asks):
            assert isinstance(turn, HeadTurn)
            if length > 0 and turn.kv is not None and turn._following(context):
                seq, pos = turn.kv.seq, len(context) - 1
                chains.append(_Chain(index=i, history=list(context), length=length, sampler=sampler, seq=seq,
                                     pos=pos, token=context[-1], hidden=self.head.hidden_at(seq, pos - 1)))
        try:
            going = chains
            while going:
                steps = self.head.predict_many([(c.seq, c.token, c.pos + len(c.tokens), c.hidden) for c in going])
                for chain, (logits, hidden) in zip(going, steps):
                    chain.logits, chain.hidden = logits, hidden
                going = [c for c in going if c.next_token(self.p_min)]
                for chain in going:
                    chain.token = chain.tokens[-1]
        finally:
            for chain in chains:
                self.head.forget(chain.seq, chain.pos)
        seconds = time.perf_counter() - t0
        drafts = [Draft.empty() for _ in asks]
        for chain in chains:
            # a draft made alone measures a token's cost; one made beside others, a share of a batch's
            alone = len(chains) == 1 and chain.tokens
            drafts[chain.index] = chain.draft(self.name, seconds, seconds / len(chain.tokens) if alone else None)
        return drafts

    def begin(self, prompt: Sequence[int], plan: Plan) -> "HeadTurn":
        known = self.acceptance  # a prior at reduced weight, as the draft model's (drafters/model.py)
        acceptance = dataclasses.replace(known, tried=[t * 0.3 for t in known.tried], kept=[k * 0.3 for k in known.kept])
        return HeadTurn(self, acceptance)

    def observe_cost(self, draft: Draft) -> None:
        if isinstance(draft.note, float) and self.learn_costs:
            self.cost.observe(1, draft.note)


class HeadTurn(Turn):
    """One request's drafting with the head: the target sequence it follows (known once the prompt is
    in) and its record of the head's acceptance."""

    def __init__(self, drafter: HeadDrafter, acceptance: Acceptance):
        self.drafter = drafter
        self.acceptance = acceptance
        self.kv: KvSequence | None = None
        self.drafted = False

    def prefill(self, context: Sequence[int], plan: Plan) -> None:
        self.kv = plan.target

    def _following(self, context: Sequence[int]) -> bool:
        """Whether the target sequence holds the context but its pending token (the invariant of
        engine/speculative.py): then the head's cache is at the same place."""
        return self.kv is not None and len(self.kv.tokens) == len(context) - 1

    def _best(self, cap: int, plan: Plan) -> tuple[int, float]:
        return best_length(self.acceptance.rates(cap), plan.cost, self.drafter.cost.per_token_s,
                           margin_for(self.acceptance.samples))

    def offer(self, context: Sequence[int], room: int, plan: Plan) -> Offer | None:
        cap = min(plan.fixed_len if plan.fixed_len is not None else self.drafter.max_len, room)
        if self.drafter.max_steps is not None:  # a fixed length too: no head past the last
            cap = min(cap, self.drafter.max_steps)
        if cap <= 0 or not self._following(context):
            return None
        if plan.fixed_len is not None:
            return Offer(cap, 0.0)
        k, rate = self._best(cap, plan)
        # (the chances up to the cap: a step shared with other sequences chooses its own length)
        return Offer(k, rate, chances=self.acceptance.rates(cap) if k > 0 else [])

    def probe(self, context: Sequence[int], plan: Plan) -> Offer | None:
        if not self._following(context):
            return None
        drafter = self.drafter
        k, rate = best_length([drafter.plausible_best] * drafter.max_len, plan.cost, drafter.cost.per_token_s)
        return Offer(1, rate) if k > 0 else None

    def draft(self, context: Sequence[int], length: int, sampler: Sampler) -> Draft:
        return self.drafter.draft_many([(self, context, length, sampler)])[0]

    def observe(self, draft: Draft, accepted: int, token: int | None) -> None:
        self.acceptance.observe(len(draft.tokens), accepted)
        self.drafter.observe_cost(draft)
        self.drafted = True

    def end(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        if self.drafted:
            self.drafter.acceptance = self.acceptance


@dataclasses.dataclass(kw_only=True)
class _Chain(Chain):
    seq: int             # the target sequence the head follows
    pos: int             # the pending token's position: the draft's first
    token: int           # the token the next step reads
    hidden: np.ndarray   # and the state before it

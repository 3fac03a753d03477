"""The "dflash" drafter: a block drafter trained on the target's hidden states (backend/dflash.py) fills
the pending token's next tokens in one pass, with no catch-up: its cache follows every target decode.

The block is always as long (llama.cpp's `draft-dflash` decodes `n_max` masks whatever it keeps): its
positions attend to each other, so its length is part of what it predicts. A pass costs about the same
for any draft length, so it is priced as a fixed cost per draft, measured at load and learned as it
drafts, against the target's verify costs and its acceptance by position.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from localspec.engine.adaptive import DrafterCost, best_length, margin_for
from localspec.engine.drafters.base import Draft, Offer, Plan, Sources
from localspec.engine.drafters.heads import HeadDrafter, HeadTurn
from localspec.engine.model import BlockHead
from localspec.engine.sampling import Sampler


class BlockDrafter(HeadDrafter):
    """What a block drafter's drafting learns across requests: a pass's cost and acceptance by position."""

    name = "dflash"
    max_len = 3  # masks per pass: llama.cpp's default draft length (common.h, n_max), within the block
    drafts_together = False  # a block is drafted for a request decoding alone
    batched = False

    def __init__(self, head: BlockHead, p_min: float = 0.5, per_pass_s: float = 0.0, prior: float = 0.7,
                 learn_costs: bool = True):
        super().__init__(head, p_min=p_min, prior=prior, learn_costs=learn_costs, name="dflash")  # type: ignore[arg-type]
        self.block_head = head
        self.max_len = min(self.max_len, head.block_size - 1)
        self.pass_cost = DrafterCost(per_token_s=per_pass_s)  # one "token" a pass: a pass costs alike for any k

    @classmethod
    def build(cls, sources: Sources, name: str = "dflash") -> "BlockDrafter | None":
        head = sources.dflash
        if head is None:
            return None
        per_pass = sources.draft_cost_s
        if per_pass is None:
            per_pass = cls.measure_pass(head, sources.target.n_seq - 1, min(cls.max_len, head.block_size - 1))
        return cls(head, p_min=sources.p_min, per_pass_s=per_pass, learn_costs=sources.learn_costs)

    @staticmethod
    def measure_pass(head: BlockHead, seq: int, n: int, passes: int = 4) -> float:
        """Seconds per pass: the median of a few, in a sequence no request holds yet (left empty)."""
        times = []
        for _ in range(passes):
            t0 = time.perf_counter()
            head.predict_block(seq, 0, 0, n)
            times.append(time.perf_counter() - t0)
        return float(np.median(times[1:]))  # the first sets up the graph

    def begin(self, prompt: Sequence[int], plan: Plan) -> "BlockTurn":
        turn = super().begin(prompt, plan)
        return BlockTurn(self, turn.acceptance)

    @property
    def per_pass_s(self) -> float:
        return self.pass_cost.per_token_s

    def observe_cost(self, draft: Draft) -> None:
        if isinstance(draft.note, float) and self.learn_costs:
            self.pass_cost.observe(1, draft.note)


class BlockTurn(HeadTurn):
    drafter: BlockDrafter

    def _best(self, cap: int, plan: Plan) -> tuple[int, float]:
        return best_length(self.acceptance.rates(cap), plan.cost, 0.0, margin_for(self.acceptance.samples),
                           draft_fixed_s=self.drafter.per_pass_s)

    def probe(self, context: Sequence[int], plan: Plan) -> Offer | None:
        if not self._following(context):
            return None
        drafter = self.drafter
        k, rate = best_length([drafter.plausible_best] * drafter.max_len, plan.cost, 0.0,
                              draft_fixed_s=drafter.per_pass_s)
        return Offer(1, rate) if k > 0 else None

    def draft(self, context: Sequence[int], length: int, sampler: Sampler) -> Draft:
        if length <= 0 or not self._following(context):
            return Draft.empty()
        assert self.kv is not None
        drafter = self.drafter
        head, p_min = drafter.block_head, drafter.p_min
        n = min(max(length, drafter.max_len), head.block_size - 1)  # the block's length is fixed, not the draft's
        t0 = time.perf_counter()
        logits = head.predict_block(self.kv.seq, context[-1], len(context) - 1, n)
        history = list(context)
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for row in logits[:length]:
            token, confidence, q = sampler.draft_token(row, history, p_min > 0)
            if confidence < p_min:
                break  # the block is not sure of this one: the draft stops before it
            if q is not None:
                rows.append(q)
            tokens.append(token)
            history.append(token)
        seconds = time.perf_counter() - t0
        return Draft(tokens=tokens, q=np.stack(rows) if rows else None, source=drafter.name, seconds=seconds,
                     note=seconds)

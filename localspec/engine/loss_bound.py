"""What drafting may cost one request beyond plain decoding.

A draft that is not kept costs its verification (and its drafting): for a long draft where verifying is
steep, several plain tokens' time. The rule: a request's rounds alone may lose, beyond plain decoding's
price of the tokens they produced, at most LOSS_SHARE of plain decoding's price of the tokens the request
has produced, plus START_TOKENS plain tokens. A round drafts at most the longest draft whose verification,
were none of it kept, still fits in what is left; what rounds gain (their kept tokens' plain price beyond
what the round cost) is added to what is left. So a copy that broke earns long drafts again only by
holding at short ones, and a request whose drafts all fail takes at most plain decoding's time plus
LOSS_SHARE of it plus START_TOKENS tokens' time, give or take its last bet. A round's loss is what it
took (its decode and its drafting) where the engine learns its costs from real rounds, so verifies
dearer than their calibrated price spend the room they really cost; a replay, which does not learn,
counts prices.

Not where a change of batch shape costs (a GPU's CUDA graphs; engine/costs.py): leaving a drafter's
shape for plain decoding's costs a warm-up worth several plain tokens there, so a bound that cuts a
draft short pays that on every cut, and the shape pricing (a regime, a detour) decides instead
(docs/engine.md, "Batch shapes"). Drafts that cannot be wrong (the target's own answer replayed,
`Draft.exact`) and forced lengths (`Plan.fixed_len`) are not bounded; steps shared with other requests
are priced by the step (adaptive.shared_lengths), so their time is not counted here, but the tokens
they produce are.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.costs import CostModel

LOSS_SHARE = 0.02
START_TOKENS = 1.0


@dataclass
class LossBound:
    """One request's account: plain decoding's price of what it produced, and what its drafting rounds
    lost beyond that price (negative: gained)."""

    share: float = LOSS_SHARE
    start_tokens: float = START_TOKENS
    plain_s: float = 0.0  # plain decoding's price of the tokens this request produced
    lost_s: float = 0.0   # its drafting rounds' time beyond plain decoding's price of their tokens

    def room_s(self, one_s: float) -> float:
        """Seconds drafting may still lose, plain decoding costing `one_s` a token."""
        return self.share * self.plain_s + self.start_tokens * one_s - self.lost_s

    def longest(self, cost: CostModel, limit: int) -> int:
        """The longest draft up to `limit` whose verification, were none of it kept, loses no more than
        is left (any length up to the largest measured verify size that fits); 0: a plain round."""
        one = cost.verify(1)
        room = self.room_s(one)
        if limit <= 0 or cost.verify(limit + 1) - one <= room:
            return max(limit, 0)
        return max((n - 1 for n in cost.verify_s if 1 <= n - 1 < limit and cost.verify(n) - one <= room),
                   default=0)

    def produced(self, tokens: int, one_s: float) -> None:
        """A round of any kind produced `tokens`."""
        self.plain_s += tokens * one_s

    def drafted(self, tokens: int, seconds: float, one_s: float) -> None:
        """A drafting round of this request's own produced `tokens` in `seconds` (drafting included)."""
        self.lost_s += seconds - tokens * one_s

"""What drafting may cost one request beyond plain decoding.

A draft that is not kept costs its verification (and its drafting): for a long draft where verifying is
steep, several plain tokens' time. The rule: a request's rounds alone may lose, beyond plain decoding's
price of the tokens they produced, at most LOSS_SHARE of plain decoding's price of the tokens the request
has produced, plus START_TOKENS plain tokens. A round drafts at most the longest draft whose verification,
were none of it kept, still fits in what is left; what rounds gain (their kept tokens' plain price beyond
what the round cost) is added to what is left. So a copy that broke earns long drafts again only by
holding at short ones, and a request whose drafts all fail takes at most plain decoding's time plus
LOSS_SHARE of it plus START_TOKENS tokens' time, give or take its last bet. Where the engine learns its
costs from real rounds, a drafting round counts what it took (its decode, a stall counted as at most
STALL_RATIO times its expected cost, and its drafting), and the account values that time at what a
plain token takes now (`CostModel.plain_lately`: the latest plain decodes' mean but the slowest). So
verifies dearer than their calibrated price spend the room they really cost, while a machine slowed for
every round alike (another program's load) slows the plain decodes it is valued against too and does
not read as drafting's loss, nor does one stall spend a request's room. A replay, which does not learn,
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
    """One request's account: the tokens it produced, and the tokens and time of its drafting rounds."""

    share: float = LOSS_SHARE
    start_tokens: float = START_TOKENS
    produced_tokens: float = 0.0  # tokens this request produced
    drafted_tokens: float = 0.0   # of them, those its drafting rounds produced
    drafted_s: float = 0.0        # what those rounds took

    def lost(self, one_s: float) -> float:
        """Plain tokens' time the drafting rounds took beyond their tokens (negative: gained), a plain
        token taking `one_s`."""
        return self.drafted_s / one_s - self.drafted_tokens

    def room(self, one_s: float) -> float:
        """Plain tokens' time drafting may still lose."""
        return self.share * self.produced_tokens + self.start_tokens - self.lost(one_s)

    def longest(self, cost: CostModel, limit: int, one_s: float) -> int:
        """The longest draft up to `limit` whose verification, were none of it kept, loses no more than
        is left (any length up to the largest measured verify size that fits); 0: a plain round."""
        one = cost.verify(1)
        room = self.room(one_s) * one
        if limit <= 0 or cost.verify(limit + 1) - one <= room:
            return max(limit, 0)
        return max((n - 1 for n in cost.verify_s if 1 <= n - 1 < limit and cost.verify(n) - one <= room),
                   default=0)

    def produced(self, tokens: int) -> None:
        """A round of any kind produced `tokens`."""
        self.produced_tokens += tokens

    def drafted(self, tokens: int, seconds: float) -> None:
        """A drafting round of this request's own produced `tokens` in `seconds` (drafting included)."""
        self.drafted_tokens += tokens
        self.drafted_s += seconds

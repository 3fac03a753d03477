"""What drafting may cost one request beyond plain decoding.

A draft that is not kept costs its verification: for a long one, several plain tokens' time. The rule:
a request's drafting rounds may take, beyond plain decoding's price of the tokens they produced, at most
LOSS_SHARE of plain decoding's time for its horizon (its token budget, up to HORIZON_TOKENS) or for the
tokens it has produced, whichever is more, plus START_TOKENS plain tokens' time. Each round's draft is cut
to the longest whose verification, were none of it kept, still fits what is left; rounds that keep their
drafts pay back what they gained, so a copy that broke earns long bets again only by holding at short
ones, while a rename's first copy, before anything broke, may start long. Drafts that cannot be wrong (the
target's own answer replayed, `Draft.exact`) and forced lengths (`fixed_len`, for experiments) are not cut.

So a request of n tokens takes at most plain decoding's time plus LOSS_SHARE of max(n, its horizon)
tokens' and START_TOKENS tokens' time, give or take how far rounds' real times stray from their prices:
an answer that fills a budget of 128 tokens, at most 4.6% over plain.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.adaptive import CostModel

LOSS_SHARE = 0.03
START_TOKENS = 2.0
HORIZON_TOKENS = 256


@dataclass
class LossBound:
    horizon_tokens: int = HORIZON_TOKENS  # the request's token budget, up to HORIZON_TOKENS
    share: float = LOSS_SHARE
    start_tokens: float = START_TOKENS
    plain_s: float = 0.0  # plain decoding's price of the tokens this request produced
    lost_s: float = 0.0   # drafting rounds' time beyond plain decoding's price of their tokens (< 0: gained)

    def room_s(self, one_s: float) -> float:
        """Seconds drafting may still lose."""
        horizon_s = min(self.horizon_tokens, HORIZON_TOKENS) * one_s
        return self.share * max(horizon_s, self.plain_s) + self.start_tokens * one_s - self.lost_s

    def longest(self, cost: CostModel, limit: int) -> int:
        """`limit`, or else the longest shorter draft among the lengths the planner chooses (measured
        verify sizes) whose verification, were none of it kept, costs no more over a plain round than
        is left; 0: a plain round."""
        one = cost.verify(1)
        room = self.room_s(one)
        if limit <= 0 or cost.verify(limit + 1) - one <= room:
            return max(limit, 0)
        return max((n - 1 for n in cost.verify_s if 1 <= n - 1 < limit and cost.verify(n) - one <= room),
                   default=0)

    def observe(self, tokens: int, seconds: float, drafted: bool, one_s: float) -> None:
        """A round produced `tokens` in `seconds`; `drafted`: it verified a draft."""
        self.plain_s += tokens * one_s
        if drafted:
            self.lost_s += seconds - tokens * one_s

"""The "ngram" drafter: copies from the request itself, priced by what copies of each age did."""

from __future__ import annotations

from typing import Callable, Sequence

from localspec.engine.adaptive import (ANSWER_COPY_PRIORS, COPY_PRIOR_STRENGTHS, PROMPT_COPY_PRIORS, CopyAcceptance,
                                       best_length, margin_for)
from localspec.engine.drafters.base import Draft, Drafter, Offer, Plan, Sources, Turn
from localspec.engine.drafters.ngram import NgramDrafter, OpeningDrafter, copy_of
from localspec.engine.drafters.respelling import Respelling


class CopyDrafter(Drafter):
    """Copies of the prompt and of the answer so far (`NgramDrafter`, one per request), and at an
    answer's start how this session's other answers opened (`OpeningDrafter`, shared). Copies are
    priced by their age, apart for copies of the prompt (an edit's input) and of the answer; each
    request starts again from the priors (an edit's record carried into a code question drafts its
    prompt's words at a loss)."""

    name = "ngram"
    max_len = 15      # longest copy (free to draft; 16 positions batch well on CPUs)

    def __init__(self, ends_copy: Callable[[int], bool] | None = None, openings: OpeningDrafter | None = None,
                 respelling: Respelling | None = None):
        self.ends_copy = ends_copy  # tokens a copy stops after (NgramDrafter.ends_copy)
        self.openings = openings
        self.respelling = respelling  # renames carried to a name's other tokens (NgramDrafter.respelling)

    @classmethod
    def build(cls, sources: Sources) -> "CopyDrafter":
        vocab = sources.target.vocab
        return cls(vocab.is_control, OpeningDrafter(), Respelling.of(vocab))

    def begin(self, prompt: Sequence[int], plan: Plan) -> "CopyTurn":
        return CopyTurn(self, prompt)


class CopyTurn(Turn):
    """One request's copies: its lookup and what its copies of each age did."""

    def __init__(self, drafter: CopyDrafter, prompt: Sequence[int]):
        self.drafter = drafter
        self.lookup = NgramDrafter(ends_copy=drafter.ends_copy, respelling=drafter.respelling)
        self.lookup.reset(prompt_len=len(prompt))
        self.conversation = OpeningDrafter.conversation(prompt)
        self.prompt_len = len(prompt)
        self.acceptance = {True: CopyAcceptance(priors=PROMPT_COPY_PRIORS, prior_strength=COPY_PRIOR_STRENGTHS),
                           False: CopyAcceptance(priors=ANSWER_COPY_PRIORS, prior_strength=COPY_PRIOR_STRENGTHS)}

    def offer(self, context: Sequence[int], room: int, plan: Plan) -> Offer | None:
        cap = min(plan.fixed_len if plan.fixed_len is not None else self.drafter.max_len, room)
        proposal = self.lookup.propose(context, cap)
        offers = []
        if proposal.tokens:
            if plan.fixed_len is not None:
                offers.append(Offer(len(proposal.tokens), float("inf"), proposal))
            else:
                offers.append(self._price(proposal, plan))
        openings = self.drafter.openings
        if openings is not None and plan.fixed_len is None:
            opening, rates = openings.propose(context, cap, self.conversation, self.prompt_len)
            if opening.tokens:
                offers.append(Offer(*best_length(rates, plan.cost, 0.0, one_off=True), opening, rates))
        return max(offers, key=lambda o: (o.length > 0, o.rate)) if offers else None

    def _price(self, proposal: Draft, plan: Plan) -> Offer:
        """Each position priced by what copies of its age did: a young copy's first tokens carry its
        low rates into every length, so it is drafted long only where long batches cost little more
        than short ones and young copies have been holding (adaptive.COPY_PRIOR_STRENGTHS)."""
        copy = copy_of(proposal)
        copies = self.acceptance[copy.from_prompt]
        rates = copies.rates(copy.age, len(proposal.tokens))
        return Offer(*best_length(rates, plan.cost, 0.0, margin_for(copies.evidence(copy.age)), one_off=True),
                     proposal, rates)

    def observe(self, draft: Draft, accepted: int, token: int | None) -> None:
        copy = copy_of(draft)
        if copy.opening:
            return
        self.acceptance[copy.from_prompt].observe(copy.age, len(draft.tokens), accepted)
        self.lookup.observe(draft, accepted, token)

    def end(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        if self.drafter.openings is not None:
            self.drafter.openings.remember(prompt, answer)

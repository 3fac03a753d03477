"""The "ngram" drafter: copies from the request itself, priced by what copies of each age did."""

from __future__ import annotations

from typing import Callable, Sequence

from localspec.engine.adaptive import (ANSWER_COPY_PRIORS, COPY_PRIOR_STRENGTHS, MEASURED_FROM_AGE, PROMPT_COPY_PRIORS,
                                       CopyAcceptance, best_length, margin_for)
from localspec.engine.drafters.base import Draft, Drafter, Offer, Plan, Sources, Turn
from localspec.engine.drafters.ngram import NgramDrafter, OpeningDrafter, copy_of
from localspec.engine.drafters.respelling import Respelling

# A copy of the prompt that the answer's code began with (its first token right after the answer's
# opening fence line, every token since agreeing with the source) is priced as a copy this old: an
# edit's answer writes the code it was given out again from its first line (docs/tuning.md, "Copies
# that open the code").
CODE_OPENING_AGE = MEASURED_FROM_AGE
FENCE = b"```"
OPENING_LINE_TOKENS = 12  # an answer's first line longer than this is no fence line


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
        # The target's spelling: renames carried to a name's other tokens (NgramDrafter.respelling), and
        # where an answer's code begins (CopyTurn._find_code_start).
        self.respelling = respelling

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
        if drafter.respelling is not None:  # the renames the prompt asks for, from the answer's first copy
            self.lookup.rename(drafter.respelling.asked(prompt))
        self.conversation = OpeningDrafter.conversation(prompt)
        self.prompt_len = len(prompt)
        self._code_at: int | None = None  # the answer's first code token (CopyTurn._find_code_start); -1: none
        self.acceptance = {True: CopyAcceptance(priors=PROMPT_COPY_PRIORS, prior_strength=COPY_PRIOR_STRENGTHS),
                           False: CopyAcceptance(priors=ANSWER_COPY_PRIORS, prior_strength=COPY_PRIOR_STRENGTHS)}

    def offer(self, context: Sequence[int], room: int, plan: Plan) -> Offer | None:
        cap = min(plan.fixed_len if plan.fixed_len is not None else self.drafter.max_len, room)
        proposal = self.lookup.propose(context, cap)
        self._find_code_start(context)
        offers = []
        if proposal.tokens:
            if plan.fixed_len is not None:
                offers.append(Offer(len(proposal.tokens), float("inf"), proposal))
            else:
                offers.append(self._price(proposal, plan, len(context) - self.prompt_len))
        openings = self.drafter.openings
        if openings is not None and plan.fixed_len is None:
            opening, rates = openings.propose(context, cap, self.conversation, self.prompt_len)
            if opening.tokens:
                offers.append(Offer(*best_length(rates, plan.cost, 0.0, one_off=True), opening, rates))
        return max(offers, key=lambda o: (o.length > 0, o.rate)) if offers else None

    def _price(self, proposal: Draft, plan: Plan, written: int) -> Offer:
        """Each position priced by what copies of its age did: a young copy's first tokens carry its
        low rates into every length, so it is drafted long only where long batches cost little more
        than short ones and young copies have been holding (adaptive.COPY_PRIOR_STRENGTHS). A copy
        the answer's code opened with (`written` tokens into the answer) is as old as CODE_OPENING_AGE."""
        copy = copy_of(proposal)
        copies = self.acceptance[copy.from_prompt]
        age = copy.age
        if copy.from_prompt and self._code_at is not None and 0 <= self._code_at < written <= self._code_at + age:
            age = max(age, CODE_OPENING_AGE)
        rates = copies.rates(age, len(proposal.tokens))
        return Offer(*best_length(rates, plan.cost, 0.0, margin_for(copies.evidence(age)), one_off=True),
                     proposal, rates)

    def _find_code_start(self, context: Sequence[int]) -> None:
        """Find where the answer's code begins, once its first line is written: after an opening fence
        line (`FENCE` first), else nowhere (-1)."""
        if self._code_at is not None or self.drafter.respelling is None:
            return
        spell = self.drafter.respelling.spell
        line = b""
        for i, token in enumerate(context[self.prompt_len:self.prompt_len + OPENING_LINE_TOKENS]):
            line += spell(token)
            if b"\n" in line:
                fence = line.lstrip().startswith(FENCE) and line.endswith(b"\n") and line.count(b"\n") == 1
                self._code_at = i + 1 if fence else -1
                return
        if len(context) - self.prompt_len >= OPENING_LINE_TOKENS:
            self._code_at = -1

    def observe(self, draft: Draft, accepted: int, token: int | None) -> None:
        copy = copy_of(draft)
        if copy.opening:
            return
        self.acceptance[copy.from_prompt].observe(copy.age, len(draft.tokens), accepted)
        self.lookup.observe(draft, accepted, token)

    def end(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        if self.drafter.openings is not None:
            self.drafter.openings.remember(prompt, answer)

"""Planning each round of one request: which drafter drafts and how long its draft is.

`Drafting` is what an engine's drafting keeps across requests (the target's verify costs, the drafters,
the probing back-off, what shared steps' drafts kept); `Drafting.planner` makes each request its own
`Planner`, which asks every drafter's turn for an offer each round and passes on how the round went.
A round alone takes `Planner.draft`; a step shared with other requests takes `Planner.shared_offer`
(engine/parallel.py chooses the lengths for the whole step).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from localspec.engine.adaptive import CostModel, Promises, expected_tokens
from localspec.engine.constraint import Constraint
from localspec.engine.drafters import Draft, Drafter, Offer, Plan, Turn, text_only
from localspec.engine.kv import KvSequence
from localspec.engine.loss_bound import LossBound
from localspec.engine.params import DRAFTER_SETTINGS
from localspec.engine.sampling import Sampler

# A draft promising less than this over plain decoding gives way to a plain round where plain decoding
# has not been measured at the context's length yet (Planner.plain_wanted): at most
# speedup.MIN_SAMPLES such rounds per context bucket, each costing at most this share of one round.
PLAIN_PROBE_GAIN = 0.3


@dataclass
class SharedOffer:
    """A request's offer for a step shared with other requests (`Planner.shared_offer`): at most `length`
    tokens from the drafter `source`, each kept with its chance (a forced length has none); a lookup's
    `draft` made already, else made by its `drafter` once the step has chosen the length, together with
    the other sequences' (`Drafter.draft_many`)."""

    source: str
    turn: Turn
    length: int
    chances: list[float]
    draft: Draft | None = None
    drafter: Drafter | None = None


@dataclass
class Probing:
    """When a drafter nothing was worth drafting with gets a one-token probe: after `every` such rounds,
    the one tried least recently, each probe doubling the wait for the next (up to `longest`) until a
    drafter wins a round on its own merit again. Learnt across requests (a model drafter that never
    pays on this machine is probed ever more rarely), so it is the engine's, not a request's."""

    every: int = 16
    longest: int = 256
    wait: int = 16                  # rounds to wait before the next probe
    waited: int = 0                 # rounds without a draft worth making since the last probe
    since_tried: dict[str, int] = field(default_factory=dict)  # rounds since each drafter drafted on request

    def __post_init__(self) -> None:
        self.wait = self.every


@dataclass
class Drafting:
    """What an engine's drafting keeps across requests: the target's verify costs, the registered
    drafters (each keeps what it learns), the probing back-off, what shared steps' drafts kept of their
    promise; `planner` makes each request's own."""

    cost: CostModel
    drafters: list[Drafter] = field(default_factory=list)
    learn_costs: bool = True
    plain_wanted: Callable[[int], bool] | None = None  # context length -> a plain round would be measured there
    probing: Probing = field(default_factory=Probing)
    promises: Promises = field(default_factory=Promises)  # shared steps' drafts (engine/parallel.py)
    queued: Callable[[], bool] = lambda: False  # requests are waiting for a slot (the server's queue)
    loss_bound: bool = True  # each request's drafts within what it may still lose (engine/loss_bound.py)
    bound_terms: dict[str, float] = field(default_factory=dict)  # LossBound's terms other than the shipped ones

    def drafter(self, name: str) -> Drafter | None:
        return next((d for d in self.drafters if d.name == name), None)

    def planner(self, prompt: Sequence[int], mode: str = "auto", fixed_len: int | None = None, budget: int = 512,
                replayable: bool = False, longest: int | None = None, shortest: int = 0) -> "Planner":
        """A request's planner: its plan, frozen now, and a turn of every drafter (Drafter.begin)."""
        if mode not in DRAFTER_SETTINGS:
            raise ValueError(f"unknown drafter '{mode}'; choose one of {', '.join(DRAFTER_SETTINGS)}")
        plan = Plan(cost=self.cost, budget=budget, fixed_len=fixed_len, replayable=replayable, mode=mode,
                    longest=longest, shortest=shortest)
        return Planner(self, plan, [(d.name, d.begin(prompt, plan)) for d in self.drafters], list(prompt))


class Planner:
    """One request's planning: chooses each round's drafter and draft length, and passes on how the
    round went. Made by `Drafting.planner` for each request and never shared: requests decoded side by
    side each have their own; what they learn in common lives in `Drafting`.

    Every turn the setting allows makes an offer (a length and the tokens per second it expects,
    priced from its own statistics and cost against the target's verify costs); the best offer wins,
    and none worth making is plain decoding. `fixed_len` set: always draft that many (experiments), a
    lookup's proposal first. After rounds in which nothing was worth drafting, a model drafter gets a
    one-token probe (`Probing`), so that a change in the text is noticed. Where `plain_wanted` says
    plain decoding has not been measured at this context length (engine/speedup.py), a draft promising
    less than PLAIN_PROBE_GAIN over plain decoding is skipped for a plain round: the speedup shown is
    then measured, for the price of a few small drafts. A round alone drafts no longer than what the
    request may still lose allows (engine/loss_bound.py), a replayed answer excepted, where a change of
    batch shape costs nothing (elsewhere the shape pricing decides).
    benchmarks/replay_planner.py replays these rules offline on recorded answers.
    """

    def __init__(self, drafting: Drafting, plan: Plan, turns: list[tuple[str, Turn]], prompt: list[int]):
        self.drafting = drafting
        self.base = plan
        self.turns = turns
        self.prompt = prompt
        # Answer tokens the request may still produce: its answer counts them (Core.add binds
        # Answer.remaining); a planner outside the core prices by its plan's whole budget.
        self.remaining: Callable[[], int] = lambda: plan.budget
        # What its drafting rounds may still lose (engine/loss_bound.py); unbounded: drafts priced alone.
        self.bound = LossBound(**drafting.bound_terms) if drafting.loss_bound else LossBound(start_tokens=math.inf)

    @property
    def mode(self) -> str:
        return self.base.mode

    @property
    def fixed_len(self) -> int | None:
        return self.base.fixed_len

    @property
    def cost(self) -> CostModel:
        return self.drafting.cost

    @property
    def budget(self) -> int:
        return self.remaining()

    @property
    def plan(self) -> Plan:
        return dataclasses.replace(self.base, budget=self.budget)

    def turn(self, name: str) -> Turn | None:
        return next((t for n, t in self.turns if n == name), None)

    @property
    def active(self) -> list[tuple[str, Turn]]:
        return [(n, t) for n, t in self.turns if self.mode in ("auto", n)]

    def prefill(self, context: list[int], target: KvSequence | None = None) -> None:
        """The prompt is in `target` (the request's KV sequence): the turns get ready to draft after it."""
        if target is not None:
            self.base = dataclasses.replace(self.base, target=target)
        plan = self.plan
        for _name, turn in self.active:
            turn.prefill(context, plan)
        self.cost.decoded(0)  # (the prompt's chunks: another batch shape)

    def draft(self, context: list[int], room: int, sampler: Sampler, grammar: Constraint | None = None) -> Draft:
        """This round's draft after `context` (at most `room` tokens, and within the request's longest and
        shortest: an offer shorter than that is not drafted, nor a probe); `grammar`: the request's
        grammar state after `context`, for drafters that read it. Never an image's position."""
        return text_only(self._draft(context, room, sampler, grammar))

    def _draft(self, context: list[int], room: int, sampler: Sampler, grammar: Constraint | None) -> Draft:
        room = self._within(room)
        if room <= 0 or self.mode == "none":
            return Draft.empty()
        plan = dataclasses.replace(self.base, budget=self.budget, grammar=grammar)
        probing = self.drafting.probing
        for key in probing.since_tried:
            probing.since_tried[key] += 1
        bounded = self.fixed_len is None and self.cost.changed_s is None  # (loss_bound.py: where shapes cost, not)
        stake = self.bound.longest(self.cost, room, self.plain_token_s()) if bounded else room
        choice = self._best_offer(context, room, plan)
        exact = choice is not None and choice[2].draft is not None and choice[2].draft.exact
        if choice is not None and choice[2].length > stake and not exact:  # chosen again within the stake
            choice = self._best_offer(context, stake, plan) if stake >= max(self.base.shortest, 1) else None
        if choice is not None:
            name, turn, offer = choice
            probing.wait = probing.every
            if self._plain_probe(len(context), offer):
                return Draft.empty()
        else:
            probe = self._probe(context, plan) if self.base.shortest <= 1 and stake > 0 else None
            if probe is None:
                return Draft.empty()
            name, turn, offer = probe
        if offer.draft is not None:
            offer.draft.tokens = offer.draft.tokens[:offer.length]
            return offer.draft
        probing.since_tried[name] = 0
        return turn.draft(context, offer.length, sampler)

    def _best_offer(self, context: list[int], room: int, plan: Plan) -> tuple[str, Turn, Offer] | None:
        """The offer promising the most tokens a second among those worth drafting within `room`."""
        offers = [(n, t, o) for n, t in self.active if (o := t.offer(context, room, plan)) is not None]
        viable = [(n, t, o) for n, t, o in offers if o.length > 0 and o.length >= self.base.shortest]
        return max(viable, key=lambda choice: choice[2].rate) if viable else None

    def shared_offer(self, context: list[int], room: int, grammar: Constraint | None = None) -> "SharedOffer | None":
        """For a step shared with other requests: the offer with the most expected tokens and the chance
        each of its tokens is kept, for the step to choose how much of every request's draft to verify
        (drafts of one length share a pass: adaptive.shared_lengths). A lookup's tokens come with it; a
        drafter that drafts in shared steps (`Drafter.drafts_together`: the draft model, a head) offers
        what its acceptance promises where a round alone would draft with it, and drafts once the step
        has chosen the length. A forced length (`fixed_len`) comes back as that length, with
        no chances. No probes; never an image's position. None: nothing to offer."""
        room = self._within(room)
        if room <= 0 or self.mode == "none":
            return None
        plan = dataclasses.replace(self.base, budget=self.budget, grammar=grammar)
        offers: list[tuple[SharedOffer, float]] = []
        for name, turn in self.active:
            offer = turn.offer(context, room, plan)
            if offer is None:
                continue
            if offer.draft is not None and (draft := text_only(offer.draft)).tokens:
                most = offer.length if self.fixed_len is not None else len(offer.chances)
                shared = SharedOffer(name, turn, min(most, len(draft.tokens)), offer.chances, draft)
            elif offer.draft is None and offer.length > 0 and (drafter := self.drafting.drafter(name)) is not None \
                    and drafter.drafts_together:
                most = offer.length if self.fixed_len is not None else len(offer.chances)
                shared = SharedOffer(name, turn, most, offer.chances, drafter=drafter)
            else:
                continue
            offers.append((shared, offer.rate))
        if not offers:
            return None
        if self.fixed_len is not None:
            forced = max(offers, key=lambda o: o[1])[0]
            return dataclasses.replace(forced, chances=[])
        best = max((o for o, _rate in offers), key=lambda o: expected_tokens(o.chances[:o.length]))
        best.chances = best.chances[:best.length]
        return best if best.chances else None

    def _within(self, room: int) -> int:
        """The room a round may draft in: at most the request's longest draft, none below its shortest."""
        plan = self.base
        room = room if plan.longest is None else min(room, plan.longest)
        return room if room >= plan.shortest else 0

    def plain_token_s(self) -> float:
        """What a plain token takes now, as the bound values drafting's time: measured lately where
        costs are learnt from real rounds, else (a replay) its price."""
        return self.cost.plain_lately() if self.drafting.learn_costs else self.cost.verify(1)

    def _plain_probe(self, context_len: int, offer: Offer) -> bool:
        """Whether to decode this round plainly, to measure plain decoding at this context length."""
        wanted = self.drafting.plain_wanted
        if self.fixed_len is not None or wanted is None or offer.draft is not None and offer.draft.exact:
            return False
        return offer.rate < (1 + PLAIN_PROBE_GAIN) / self.cost.verify(1) and wanted(context_len)

    def _probe(self, context: list[int], plan: Plan) -> tuple[str, Turn, Offer] | None:
        """A one-token probe by the drafter tried least recently, when the wait is over; or None. Where a
        change of batch shape costs, the wait is longer by what a probe's detour costs there, except
        right after the prompt, where the shape changes whatever is decoded (a new prompt is also
        where a drafter's acceptance may have moved)."""
        probing = self.drafting.probing
        probing.waited += 1
        after_prompt = self.cost.changed_s is not None and self.cost.shape == 0
        if probing.waited < probing.wait * self.cost.detour_factor() and not after_prompt:
            return None
        candidates = [(probing.since_tried.get(n, 10**9), i, n, t, o) for i, (n, t) in enumerate(self.active)
                      if (o := t.probe(context, plan)) is not None]  # never tried: first
        if not candidates:
            return None
        _since, _i, name, turn, offer = max(candidates, key=lambda c: (c[0], -c[1]))
        probing.waited = 0
        probing.wait = min(probing.wait * 2, probing.longest)
        return name, turn, offer

    def observe(self, draft: Draft, accepted: int, verify_s: float, batch_n: int, token: int | None = None,
                learn_cost: bool = True) -> None:
        """How the round went; `learn_cost` False for a step shared with other requests (its time is
        not what `batch_n` positions of one sequence cost)."""
        # The round's time as the costs count it (a stall clamped), where they are learnt from real rounds.
        counted_s = self.cost.observe(batch_n, verify_s) if learn_cost and self.drafting.learn_costs else None
        self.bound.produced(accepted + 1)
        if learn_cost and draft.tokens and not draft.exact:
            spent = counted_s if counted_s is not None else self.cost.verify(batch_n)  # (a replay: its price)
            self.bound.drafted(accepted + 1, spent + draft.seconds)
        self.cost.decoded(batch_n if learn_cost else 0)  # (a shared step's batch: another shape)
        if draft.tokens and (turn := self.turn(draft.source)) is not None:
            turn.observe(draft, accepted, token)

    def finish(self, answer: Sequence[int]) -> None:
        """The request ended with this answer: evidence for every drafter, whoever drafted."""
        for _name, turn in self.turns:
            turn.end(self.prompt, answer)

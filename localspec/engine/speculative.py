"""The speculative loop: draft -> verify in one batch -> accept/reject -> roll back -> repeat.

Invariant between rounds: the target's KV cache holds every token of `context` except the last one,
which is *pending*. A round evaluates [pending] + draft in one batch with logits at every position:
row i is the target's distribution after the first i draft tokens, so k draft tokens yield k + 1
rows, the last one giving the bonus token after a full accept. Rejected positions are removed with
one KV truncation; the target's own token becomes the next pending token.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from localspec.engine.adaptive import CostModel, Promises, expected_tokens
from localspec.engine.constraint import Constraint
from localspec.engine.drafters import Draft, Drafter, Offer, Plan, Turn, text_only
from localspec.engine.events import TokenLogprob
from localspec.engine.kv import KvSequence, extend_together
from localspec.engine.params import DRAFTER_SETTINGS
from localspec.engine.sampling import Sampler, accept_greedy, accept_replayed, accept_sampled, token_logprob
from localspec.engine.tree import DraftTree, accept_greedy_tree, accept_sampled_tree

# A draft promising less than this over plain decoding gives way to a plain round where plain decoding
# has not been measured at the context's length yet (Planner.plain_wanted): at most
# speedup.MIN_SAMPLES such rounds per context bucket, each costing at most this share of one round.
PLAIN_PROBE_GAIN = 0.3
# A verify of at most this many positions runs llama.cpp's one-token kernels on CPUs, so its rows are
# bit-identical to plain decoding's; from 4 rows the repacked K-quant gemm sums in another order and a
# Q4_K_M file's log-probabilities move by a few hundredths. A request that asks
# for log-probabilities drafts within it, so the numbers it gets are plain decoding's.
EXACT_VERIFY_POSITIONS = 3


@dataclass
class Step:
    """The token-level outcome of one round."""

    draft: Draft
    accepted: int
    token: int
    verify_s: float
    shared: int = 0  # other sequences evaluated in the same decode (requests decoded together)
    logprobs: tuple[TokenLogprob, ...] = ()  # the kept tokens' (accepted draft, then the target's), if asked for
    candidates: int = 0  # a candidate tree's nodes, where the round verified one (`draft` is the branch kept)
    took_second: bool = False  # the kept path left the chain for a second candidate

    @property
    def kind(self) -> str:
        if not self.draft.tokens:
            return "plain"
        return "bonus" if self.accepted == len(self.draft.tokens) else "correction"


def speculative_round(target: KvSequence, context: list[int], planner: "Planner", sampler: Sampler,
                      constraint: Constraint | None = None) -> Step | None:
    """One draft/verify round of one sequence: `context` (its tokens, the pending one last) grows in place
    by what the round keeps, and the same invariant holds after; None when the context is full. With a
    `constraint` every token follows its grammar (engine/constraint.py), advanced by the kept tokens."""
    room = draft_room(target, sampler)
    if room < 0:
        return None
    proposal = propose(context, room, planner, sampler, constraint)
    try:
        return verify(target, context, proposal, planner, sampler, constraint, room)
    finally:
        proposal.close()


def draft_room(target: KvSequence, sampler: Sampler) -> int:
    """Draft tokens a round of this sequence may verify after its pending one (-1: its context is full)."""
    room = target.draft_room()
    if sampler.settings.logprobs is not None:
        room = min(room, EXACT_VERIFY_POSITIONS - 1)
    return room


def verify(target: KvSequence, context: list[int], proposal: "Proposal", planner: "Planner", sampler: Sampler,
           constraint: Constraint | None, room: int) -> Step:
    """A sequence's proposal verified in a decode of its own and settled: its candidate tree where it has
    one worth verifying, else the pending token and its chain, padded to the shape held; the planner
    learns the round's cost (the decode was this sequence's alone) and its drafter what was kept."""
    tree = proposal.draft.tree
    if tree is not None and constraint is None and sampler.settings.logprobs is None and tree_fits(tree, room):
        step, chain_kept = tree_round(target, context, proposal.draft, tree, sampler)
        planner.observe(proposal.draft, chain_kept, step.verify_s, 1 + len(tree), step.token)
        return step
    batch = padded(proposal.batch(context), planner.cost, room)
    t0 = time.perf_counter()
    logits = extend_together([(target, batch, len(batch))])[0]
    step = settle(target, context, proposal, logits, sampler, time.perf_counter() - t0, constraint)
    planner.observe(proposal.draft, step.accepted, step.verify_s, len(batch), step.token)
    return step


def padded(batch: list[int], cost: CostModel, room: int) -> list[int]:
    """The verify batch padded up to the shape held where that is cheaper than changing it
    (`CostModel.shape_for`; never on a CPU): the pad repeats the last token, after every row that is
    read, so no read row sees it, and the rollback after the round drops it with the rejected draft."""
    size = cost.shape_for(len(batch))
    if size <= len(batch) or size - 1 > room:
        return batch
    return batch + [batch[-1]] * (size - len(batch))


@dataclass
class Proposal:
    """A round's draft as it will be verified: cut where the grammar forbids it, the grammar's state
    before each verify row (None: free text), and the draft's distribution at the cut."""

    draft: Draft
    rows: list[Constraint | None]
    q_next: np.ndarray | None = None

    @staticmethod
    def plain(constraint: Constraint | None = None) -> "Proposal":
        return Proposal(Draft.empty(), [constraint])

    def batch(self, context: list[int]) -> list[int]:
        """What the verify evaluates: the pending token and the draft."""
        return [context[-1], *self.draft.tokens]

    def close(self) -> None:
        for row in self.rows[1:]:
            if row is not None:
                row.close()


def propose(context: list[int], room: int, planner: "Planner", sampler: Sampler,
            constraint: Constraint | None = None) -> Proposal:
    """The planner's draft after `context` (at most `room` tokens), within the grammar."""
    draft = planner.draft(context, room, sampler, constraint)
    return proposal_of(draft, constraint)


def proposal_of(draft: Draft, constraint: Constraint | None = None) -> Proposal:
    """A draft as it will be verified: cut before the first token the grammar forbids."""
    if constraint is None:
        return Proposal(draft, [None] * (len(draft.tokens) + 1))
    return Proposal(*within_grammar(draft, constraint))


def settle(target: KvSequence, context: list[int], proposal: Proposal, logits: np.ndarray, sampler: Sampler,
           verify_s: float, constraint: Constraint | None = None, shared: int = 0) -> Step:
    """A verified proposal (`logits`: one row per position of `proposal.batch`): the longest acceptable
    draft prefix and the target's next token. `context`, the KV cache and the grammar keep what was
    accepted."""
    draft = proposal.draft
    accepted, token = decide(logits, context, draft, sampler, proposal.rows, proposal.q_next)
    kept = [*draft.tokens[:accepted], token]
    top = sampler.settings.logprobs
    # Row i is the target's distribution before kept token i, drafted or not: the same row plain
    # decoding would have had, so the log-probabilities are plain decoding's.
    logprobs = () if top is None else tuple(token_logprob(logits[i], t, top) for i, t in enumerate(kept))
    target.rewind(len(context) + accepted)  # keep pending + accepted draft tokens
    context.extend(draft.tokens[:accepted])
    context.append(token)
    if constraint is not None:
        for t in kept:
            constraint.accept(t)
    return Step(draft=draft, accepted=accepted, token=token, verify_s=verify_s, shared=shared, logprobs=logprobs)


def tree_fits(tree: DraftTree, room: int) -> bool:
    """Whether a candidate tree is worth verifying as one (more than a chain) and its deepest node fits."""
    return not tree.is_chain() and max(tree.depth(n) for n in range(len(tree))) <= room


def tree_round(target: KvSequence, context: list[int], draft: Draft, tree: DraftTree,
               sampler: Sampler) -> tuple[Step, int]:
    """A round that verifies a candidate tree (engine/tree.py) instead of the draft's chain: the step,
    whose draft is the branch the target followed, and how many of the chain's own tokens were kept (what
    its drafter's acceptance learns from). Free text only: no grammar, no log-probabilities."""
    pending = context[-1]
    t0 = time.perf_counter()
    logits, placement = target.verify_tree(pending, tree)
    verify_s = time.perf_counter() - t0
    tail = sampler.penalty_tail(context)
    if sampler.greedy:
        path, token = accept_greedy_tree(tree, lambda row, drafted: sampler.argmax(logits[row], tail + drafted))
    else:
        path, token = accept_sampled_tree(tree, lambda row, drafted: sampler.probs(logits[row], tail + drafted),
                                          sampler.uniform, sampler.draw)
    target.keep_path(pending, tree, placement, path)
    kept = [tree.tokens[n] for n in path]
    context.extend(kept)
    context.append(token)
    # the chain's tokens are the tree's first nodes (tree.with_alternates): kept while the path is them
    chain_kept = next((i for i, n in enumerate(path) if n != i or i >= len(draft.tokens)), len(path))
    followed = dataclasses.replace(draft, tokens=tree.branch_through(path[-1]) if path else draft.tokens)
    return Step(draft=followed, accepted=len(path), token=token, verify_s=verify_s, candidates=len(tree),
                took_second=chain_kept < len(path)), chain_kept


def within_grammar(draft: Draft, constraint: Constraint) -> tuple[Draft, list[Constraint | None], np.ndarray | None]:
    """The draft cut before its first token the grammar forbids (free: it could only be rejected), the
    grammar's state before each verify row (the first is `constraint` itself), and the draft's
    distribution at the cut, if it has one (`accept_sampled`'s q_next)."""
    rows: list[Constraint | None] = [constraint]
    for i, token in enumerate(draft.tokens):
        state = rows[-1]
        assert state is not None
        if not state.allows([token])[0]:
            q_next = draft.q[i] if draft.q is not None else None
            cut = dataclasses.replace(draft, tokens=draft.tokens[:i], q=draft.q[:i] if draft.q is not None else None)
            return cut, rows, q_next
        nxt = state.fork()
        nxt.accept(token)
        rows.append(nxt)
    return draft, rows, None


def decide(logits: np.ndarray, context: list[int], draft: Draft, sampler: Sampler, rows: list[Constraint | None],
           q_next: np.ndarray | None = None) -> tuple[int, int]:
    """From the verify rows (one per draft token, plus one): how many draft tokens are accepted, and
    the target's next token. With no draft, a plain round's token."""
    tail = sampler.penalty_tail(context)
    if sampler.greedy:
        choices = _LazyChoices(lambda i: sampler.argmax(logits[i], tail + draft.tokens[:i], rows[i]))
        if draft.exact and sampler.settings.replayable:
            accepted, token = accept_replayed(draft.tokens, choices,
                                              lambda i, t: float(logits[i].max() - logits[i][t]))
        else:
            accepted, token = accept_greedy(draft.tokens, choices)
    else:
        p = np.stack([sampler.probs(logits[i], tail + draft.tokens[:i], rows[i])
                      for i in range(len(draft.tokens) + 1)])
        accepted, token = accept_sampled(draft.tokens, p, draft.q, sampler.uniform, sampler.draw, q_next)
    return accepted, token


class _LazyChoices:
    """The target's choice at row i, computed only if the acceptance check gets that far."""

    def __init__(self, choose):
        self._choose = choose

    def __getitem__(self, i: int) -> int:
        return self._choose(i)


# ----------------------------------------------------------------------------- planning


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
    then measured, for the price of a few small drafts. benchmarks/replay_planner.py replays these rules
    offline on recorded answers.
    """

    def __init__(self, drafting: Drafting, plan: Plan, turns: list[tuple[str, Turn]], prompt: list[int]):
        self.drafting = drafting
        self.base = plan
        self.turns = turns
        self.prompt = prompt
        # Answer tokens the request may still produce: its answer counts them (Core.add binds
        # Answer.remaining); a planner outside the core prices by its plan's whole budget.
        self.remaining: Callable[[], int] = lambda: plan.budget

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
        offers = [(n, t, o) for n, t in self.active if (o := t.offer(context, room, plan)) is not None]
        for key in probing.since_tried:
            probing.since_tried[key] += 1
        viable = [(n, t, o) for n, t, o in offers if o.length > 0 and o.length >= self.base.shortest]
        if viable:
            name, turn, offer = max(viable, key=lambda choice: choice[2].rate)
            probing.wait = probing.every
            if self._plain_probe(len(context), offer):
                return Draft.empty()
        else:
            probe = self._probe(context, plan) if self.base.shortest <= 1 else None
            if probe is None:
                return Draft.empty()
            name, turn, offer = probe
        if offer.draft is not None:
            offer.draft.tokens = offer.draft.tokens[:offer.length]
            return offer.draft
        probing.since_tried[name] = 0
        return turn.draft(context, offer.length, sampler)

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
        if learn_cost and self.drafting.learn_costs:
            self.cost.observe(batch_n, verify_s)
        self.cost.decoded(batch_n if learn_cost else 0)  # (a shared step's batch: another shape)
        if draft.tokens and (turn := self.turn(draft.source)) is not None:
            turn.observe(draft, accepted, token)

    def finish(self, answer: Sequence[int]) -> None:
        """The request ended with this answer: evidence for every drafter, whoever drafted."""
        for _name, turn in self.turns:
            turn.end(self.prompt, answer)

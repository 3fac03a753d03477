"""Several sequences in one evaluation per step: the shared step of the engine core (engine/core.py).

A shared step is one evaluation holding each lane's pending token, on its own KV sequence, and each
takes its next token from its own row exactly as a plain round alone would (`speculative.decide`: the
same sampler, seed and grammar), so each answer is the one it would be alone (greedy: token for token;
sampled: the same draws), and one that ends (or is cancelled) leaves the next step. The completions of
one prompt (llama.cpp's `n_cmpl`, OpenAI's `n`) share its evaluation: it is evaluated once into one
slot and copied to the others.

Every prompt is evaluated in chunks within the steps: each step holds the others' pending tokens and
at most `chunk(rows)` of the oldest unfinished prompt (the engine sizes it by the calibrated costs;
alone, PROMPT_CHUNK), so a long prompt slows the running streams instead of freezing them for all its
evaluation. A prompt's last token is evaluated as its first step's pending token, as alone (the first
round evaluates it).

A lane with a planner (not the completions of one prompt, which draw as single requests with their
seeds would) drafts in the shared steps too: each offers its best proposal (a copy, the history, what
its grammar forces) or the draft model's promise (it has a sequence per request, and drafts for every
lane that chose it at once: one catch-up decode, then one decode per draft token holding every chain,
`Drafter.draft_many`), and the step verifies one length of all of them (`adaptive.shared_lengths`):
with a KV cache per sequence llama.cpp takes as many tokens from every sequence in a micro-batch, so
drafts of one length share a pass and a longer one adds its own (`adaptive.step_cost`), and the draft
model's decodes add theirs. A draft is worth the later steps it saves (`adaptive.steps_saved_s`):
the others decode as many steps whatever one sequence drafts, so one sequence's draft pays only for
what its pending token adds to a step, while drafts in every sequence save whole steps; the chances
promised count for what shared drafts kept (`Promises.trust`). A lane with the step to itself is the
one-lane case of the same step: it drafts as its planner chooses for a round alone (any drafter, a
candidate tree, a probe) and its round is verified in a decode of its own (`speculative.verify`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from localspec.engine.adaptive import CostModel, expected_tokens, shared_lengths
from localspec.engine.answer import Answer
from localspec.engine.drafters import Draft, Drafter
from localspec.engine.events import Event, Prefill
from localspec.engine.kv import KvSequence, extend_together
from localspec.engine.planner import Planner, SharedOffer
from localspec.engine.request import Request
from localspec.engine.sampling import Sampler
from localspec.engine.speculative import Proposal, Step, draft_room, propose, proposal_of, settle, verify
from localspec.errors import LocalspecError


# A shared step evaluates joining prompts beside the others' pending tokens for at most STEP_S at the
# calibrated verify costs (which price a logits row per position, so a prompt's chunk, with one row,
# costs less), but never fewer than LEAST_CHUNK tokens: smaller chunks make every joining prompt dearer
# and its first token later (benchmarks/serve_suite.py --scenarios chats measures it).
STEP_S = 1.0
LEAST_CHUNK = 64
# A prompt with nothing else in the step is evaluated at most this many tokens a step (llama.cpp's
# default batch): a client that leaves during a long prompt is seen between two.
PROMPT_CHUNK = 512
MAX_STEP_OUTPUTS = 64  # logits rows one shared decode may return (backend.MAX_LOGITS_PER_CALL)


def prompt_chunk(rows: int, verify: Callable[[int], float], room: int, step_s: float = STEP_S,
                 least: int = LEAST_CHUNK) -> int:
    """Prompt tokens one shared step may evaluate beside `rows` pending tokens: the most that keep the
    step within `step_s` at the costs `verify(n)`, at least `least`, at most `room - rows` (the batch).
    With nothing pending, all that fits up to PROMPT_CHUNK: nobody waits for it."""
    most = max(room - rows, 0)
    if rows == 0:
        return min(most, PROMPT_CHUNK)
    lo, hi = min(least, most), most
    while lo < hi:  # the largest n in [least, most] within step_s (verify grows with n)
        mid = (lo + hi + 1) // 2
        if verify(rows + mid) <= step_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Lane:
    """One request's sequence in the engine core: its request, slot, context (the last token pending)
    and answer."""

    request: Request
    kv: KvSequence
    context: list[int]
    sampler: Sampler
    answer: Answer
    everyone: threading.Event      # cancels every sequence of its request (the client went away)
    prefill: Prefill | None        # its own, or the shared prompt's (nothing evaluated); None while its
                                   # prompt is still evaluated in chunks
    cached: int = 0                # prompt tokens its slot held already (a joining request's)
    chunks: int = 0                # steps that evaluated a chunk of its prompt
    deliver: Callable[[Event | Exception], None] | None = None  # where its events go (the core hands them over)
    planner: Planner | None = None  # its own, if it drafts (not the completions of one prompt)
    follows: "Lane | None" = None   # the lane whose prompt it copies once that is in (one prompt's completions)
    # Its events are yielded by an iterator (Engine.generate) that frees its slot once they are all
    # consumed, not when the core retires it: its consumer still sees its slot held while it reads
    # the last round (the server's scheduler admits waiting requests by the slots free then).
    iterated: bool = False
    started: float = field(default_factory=time.perf_counter)  # its time to first token counts from here
    waited_at_prompt: float = 0.0  # its request's waited_s when its prompt came in (its answer's time starts)
    ended: str | None = None
    failure: Exception | None = None  # its own evaluation failed (`step_together`): it ends with this error

    def stops_before_step(self) -> str | None:
        """Why this sequence cannot take part in the next step, if it cannot."""
        if self.request.cancel.is_set() or self.everyone.is_set():
            return "cancelled"
        if self.kv.room() < 1:
            return "context"
        return None

    def finish(self, estimate_tokens_per_s: float) -> list:
        """Its last events: held-back text, then the summary (its Prefill first if it ended before its
        prompt was in)."""
        opening: list[Event] = [] if self.prefill is not None else [self.prefilled()]
        prefill = self.prefill
        assert prefill is not None
        # Generation only: from when its prompt was in, less the steps that left it out since.
        wall = (time.perf_counter() - self.started - prefill.seconds
                - (self.request.waited_s - self.waited_at_prompt))
        return opening + list(self.answer.finish(self.ended or "cancelled", prefill, wall,
                                                 estimate_tokens_per_s, self.request.label, len(self.kv.tokens)))

    def unevaluated(self) -> list[int]:
        """Its context's tokens not in its cache yet: the pending token, or, while its prompt is
        evaluated in chunks, the rest of the prompt."""
        return self.context[len(self.kv.tokens):]

    @property
    def prompt_in(self) -> bool:
        """Whether its cache holds all its context but the pending token (its prompt is in)."""
        return len(self.context) - len(self.kv.tokens) == 1

    def prefilled(self) -> Prefill:
        """Its Prefill, once its prompt is in or it ended before (evaluated: as alone, its last token too,
        which its first step evaluates)."""
        evaluated = len(self.kv.tokens) + self.prompt_in - self.cached
        self.waited_at_prompt = self.request.waited_s
        self.prefill = Prefill(prompt_tokens=len(self.request.prompt), evaluated=evaluated,
                               cached=self.cached, seconds=time.perf_counter() - self.started,
                               chunks=max(self.chunks, 1))
        return self.prefill


def step_together(lanes: list[Lane], chunks: dict[int, int] | None = None,
                  proposals: dict[int, Proposal] | None = None,
                  alone: bool = False) -> tuple[list[Step | None], list[int]]:
    """One evaluation holding every lane's pending token and its draft, if `proposals` (by position in
    `lanes`) has one, or, for the lanes in `chunks`, that many more tokens of its prompt (never its
    last). Each lane that evaluated its pending token gets its round settled as alone
    (`speculative.settle`: the same accept rules, sampler, seed and grammar); a prompt's chunk gets None.
    `alone`: one lane with a planner and nothing else, verified as a sequence's own round
    (`speculative.verify`: its candidate tree where it has one, the batch padded to the shape held, the
    round's cost learnt). Returns the steps and the tokens each lane had in it."""
    chunks, proposals = chunks or {}, proposals or {}
    if alone:
        return [_own_round(lanes[0], proposals[0])], [1]
    parts = []
    for i, lane in enumerate(lanes):
        if i in chunks:
            parts.append((lane.kv, lane.unevaluated()[:chunks[i]], 1))
        else:
            proposal = proposals.setdefault(i, Proposal.plain(lane.request.constraint))
            parts.append((lane.kv, proposal.batch(lane.context), len(proposal.draft.tokens) + 1))
    t0 = time.perf_counter()
    try:
        rows = _isolated(lanes, parts)
        seconds = time.perf_counter() - t0
        steps: list[Step | None] = []
        for i, (lane, logits) in enumerate(zip(lanes, rows)):
            if i in chunks or logits is None:
                steps.append(None)
                continue
            proposal = proposals[i]
            step = settle(lane.kv, lane.context, proposal, logits, lane.sampler, seconds, lane.request.constraint,
                          shared=len(lanes) - 1)
            if lane.planner is not None:
                lane.planner.observe(proposal.draft, step.accepted, seconds, len(parts[i][1]), step.token,
                                     learn_cost=False)
            steps.append(step)
    finally:
        for proposal in proposals.values():
            proposal.close()
    return steps, [len(tokens) for _kv, tokens, _outputs in parts]


def _own_round(lane: Lane, proposal: Proposal) -> Step | None:
    """A lane's round in a decode of its own; its failure is its own (`Lane.failure`), as in a shared step."""
    assert lane.planner is not None
    try:
        return verify(lane.kv, lane.context, proposal, lane.planner, lane.sampler, lane.request.constraint,
                      draft_room(lane.kv, lane.sampler))
    except (LocalspecError, ValueError) as own:
        lane.failure = own
        return None
    finally:
        proposal.close()


def _isolated(lanes: list[Lane], parts: list[tuple[KvSequence, list[int], int]]) -> list[np.ndarray | None]:
    """Every part evaluated in one decode; if llama.cpp refuses it, each part alone, so that one
    sequence's failure (its `Lane.failure`, its rows None) never ends the others' answers."""
    try:
        return list(extend_together(parts))
    except (LocalspecError, ValueError) as shared:
        if len(parts) == 1:
            lanes[0].failure = shared
            return [None]
    rows: list[np.ndarray | None] = []
    for lane, part in zip(lanes, parts):
        try:
            rows.append(extend_together([part])[0])
        except (LocalspecError, ValueError) as own:
            lane.failure = own
            rows.append(None)
    return rows


def _drafts(lanes: list[Lane], chunks: list[int]) -> tuple[dict[int, Proposal], dict[int, float]]:
    """Each decoding lane's draft for a step holding every lane's pending token and the prompts'
    `chunks`: each lane with a planner offers what it would draft (`Planner.shared_offer`: a lookup's
    proposal, or the draft model's promise), and the step verifies one length of all of them, the one
    that saves the most time (`adaptive.shared_lengths`: drafts of one length share a pass, a longer
    one adds its own, the draft model's decodes add theirs), its promised tokens worth what shared
    drafts have kept of theirs (`Promises.trust`); within the batch and the logits rows one decode
    takes. A forced length (`fixed_len`) is drafted as offered. Returns the proposals and the draft
    tokens each priced one promised (forced lengths promise nothing). Priced as the queue stands
    (`Drafting.queued`: requests waiting for a slot)."""
    offered: dict[int, SharedOffer] = {}
    for i, lane in enumerate(lanes):
        if lane.planner is not None:
            offer = lane.planner.shared_offer(lane.context, draft_room(lane.kv, lane.sampler), lane.request.constraint)
            if offer is not None:
                offered[i] = offer
    if not offered:
        return {}, {}
    room = min(lanes[0].kv.model.n_batch - len(lanes) - sum(chunks), MAX_STEP_OUTPUTS - len(lanes) - len(chunks))
    for offer in offered.values():
        if not offer.chances:  # a forced length: as offered, within what is left of the room
            offer.length = min(offer.length, max(room, 0))
            room -= offer.length
    planner = lanes[next(iter(offered))].planner
    assert planner is not None
    lengths = shared_lengths(planner.cost, [offered[i].chances if i in offered else [] for i in range(len(lanes))],
                             chunks, room, trust=planner.drafting.promises.trust, queued=planner.drafting.queued(),
                             drafting_s=lambda ks: _drafting_s(offered, ks, planner.cost))
    for i, offer in offered.items():
        if offer.chances:
            offer.length = lengths[i]
    drafts = _made(lanes, offered)
    proposals: dict[int, Proposal] = {}
    promised: dict[int, float] = {}
    for i, offer in offered.items():
        if offer.chances and drafts[i].tokens:
            promised[i] = expected_tokens(offer.chances[:len(drafts[i].tokens)]) - 1
        proposals[i] = proposal_of(drafts[i], lanes[i].request.constraint)
    if not promised and any(offer.chances for offer in offered.values()):
        planner.drafting.promises.passed()
    return proposals, promised


def _drafting_s(offered: dict[int, SharedOffer], lengths: Sequence[int], cost: CostModel) -> float:
    """Seconds the drafters would take to draft these lengths (by lane) of these offers (lookups: none);
    a decode of several rows priced as the target's verify costs scale with rows (the draft model's own
    are measured for one row only)."""
    def rows_cost(rows: int) -> float:
        return cost.verify(rows) / cost.verify(1)

    return sum(drafter.drafting_s([lengths[i] for i in which], rows_cost)
               for drafter, which in _by_drafter(offered, lengths))


def _by_drafter(offered: dict[int, SharedOffer], lengths: Sequence[int]) -> list[tuple[Drafter, list[int]]]:
    """The offers their drafter makes once the step has chosen the lengths, each drafter with the lanes
    it drafts for (those given a length)."""
    asks: dict[int, tuple[Drafter, list[int]]] = {}
    for i, offer in offered.items():
        if offer.drafter is not None and offer.draft is None and lengths[i] > 0:
            asks.setdefault(id(offer.drafter), (offer.drafter, []))[1].append(i)
    return list(asks.values())


def _made(lanes: list[Lane], offered: dict[int, SharedOffer]) -> dict[int, Draft]:
    """Each offer's draft at its chosen length: a lookup's proposal cut to it; a drafter's made by it
    for all its lanes at once (`Drafter.draft_many`)."""
    lengths = [offered[i].length if i in offered else 0 for i in range(len(lanes))]
    drafts = {i: Draft.empty() if offer.draft is None
              else dataclasses.replace(offer.draft, tokens=offer.draft.tokens[:offer.length], tree=None)
              for i, offer in offered.items()}
    for drafter, which in _by_drafter(offered, lengths):
        made = drafter.draft_many([(offered[i].turn, lanes[i].context, lengths[i], lanes[i].sampler) for i in which])
        drafts.update(zip(which, made))
    return drafts


def whole_images(tokens: list[int], n: int) -> int:
    """A prompt chunk of `n` tokens, longer where it would end inside an image (one negative id per row,
    counting down: engine/backend/vision.py): an image's rows are evaluated in one step, as one whose
    attention is non-causal must be (it attends within its batch only)."""
    while 0 < n < len(tokens) - 1 and tokens[n] < 0 and tokens[n] == tokens[n - 1] - 1:
        n += 1
    return n


def advance(lanes: list[Lane], chunk: Callable[[int], int] = lambda rows: 1 << 30,
            learn: Callable[[Step, int], None] | None = None) -> list[tuple[Lane, Event]]:
    """One step of every lane that can go on: the lanes' events (each round's time is its share of the
    step, drafting included, by the positions it had in it; a prompt's Prefill when its last chunk is
    in). Prompts still being evaluated get `chunk(rows)` tokens in all (rows: the pending tokens of the
    step), the oldest first; at least one token when nothing else is in the step. A lane with a planner
    that has the step to itself drafts as its planner chooses for a round alone (any drafter, a
    candidate tree, a probe), its round timed as a plain round where it drafted nothing (so the speedup
    shown measures plain decoding on the same loop) and `learn`t from; beside others, every lane with a
    planner drafts as priced for the step (`_drafts`). A lane whose own evaluation failed ends with
    `failure` set."""
    for lane in lanes:
        lane.ended = lane.stops_before_step()
    going = [lane for lane in lanes if lane.ended is None]
    together = [lane for lane in going if lane.prompt_in]
    budget = max(chunk(len(together)), 0 if together else 1)
    pending = len(together)
    chunks: dict[int, int] = {}
    for lane in going:
        if not lane.prompt_in and budget > 0:
            n = whole_images(lane.unevaluated(), min(budget, len(lane.unevaluated()) - 1))
            chunks[len(together)] = n
            lane.chunks += 1
            together.append(lane)
            budget -= n
    if not together:
        return []
    t0 = time.perf_counter()
    alone = pending == 1 and not chunks and together[0].planner is not None
    if alone:
        own = together[0]
        assert own.planner is not None
        proposals = {0: propose(own.context, draft_room(own.kv, own.sampler), own.planner, own.sampler,
                                own.request.constraint)}
        promised: dict[int, float] = {}
    else:
        proposals, promised = _drafts(together[:pending], list(chunks.values()))
    steps, tokens = step_together(together, chunks, proposals, alone)
    seconds = time.perf_counter() - t0
    for i, promise in promised.items():  # every lane that offered has a planner, all of one engine's
        planner, step = together[i].planner, steps[i]
        if planner is not None and step is not None:
            planner.drafting.promises.observe(promise, step.accepted)
    events: list[tuple[Lane, Event]] = []
    for lane, step, n in zip(together, steps, tokens):
        if lane.failure is not None:
            lane.ended = "error"
        elif step is not None:
            context_len = len(lane.context) - step.accepted - 1
            if alone and learn is not None:
                learn(step, context_len)
            event, lane.ended = lane.answer.add(step, context_len, seconds * n / sum(tokens),
                                                priced=not alone or bool(step.draft.tokens))
            events.append((lane, event))
        elif lane.prompt_in:  # its first token is decoded in the next step
            events.append((lane, lane.prefilled()))
    return events

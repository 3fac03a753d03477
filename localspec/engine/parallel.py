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
seeds would) drafts in the shared steps too: each offers its lookups' best proposal (a copy, the
history, what its grammar forces; the draft model has a sequence per request but drafts only when its
request decodes alone), and the step verifies one length of all of them (`adaptive.shared_lengths`):
with a KV cache per sequence llama.cpp takes as many tokens from every sequence in a micro-batch, so
drafts of one length share a pass and a longer one adds its own (`adaptive.step_cost`). A draft is worth the later steps it saves (`adaptive.steps_saved_s`):
the others decode as many steps whatever one sequence drafts, so one sequence's draft pays only for
what its pending token adds to a step, while drafts in every sequence save whole steps; the chances
promised count for what shared drafts kept (`Promises.trust`). A lane left alone drafts as alone again
(the core's one-lane step: speculative rounds on its own sequence, the draft model included).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from localspec.engine.answer import Answer
from localspec.engine.adaptive import expected_tokens, shared_lengths
from localspec.engine.drafters import Draft
from localspec.engine.events import Event, Prefill
from localspec.engine.kv import KvSequence, extend_together
from localspec.engine.request import Request
from localspec.engine.sampling import Sampler
from localspec.engine.speculative import EXACT_VERIFY_POSITIONS, Planner, Proposal, Step, proposal_of, settle
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
                  proposals: dict[int, Proposal] | None = None) -> tuple[list[Step | None], float, list[int]]:
    """One evaluation holding every lane's pending token and its draft, if `proposals` (by position in
    `lanes`) has one, or, for the lanes in `chunks`, that many more tokens of its prompt (never its
    last). Each lane that evaluated its pending token gets its round settled as alone
    (`speculative.settle`: the same accept rules, sampler, seed and grammar); a prompt's chunk gets None.
    Returns the steps, the evaluation's seconds and the tokens each lane had in it."""
    chunks, proposals = chunks or {}, proposals or {}
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
    return steps, seconds, [len(tokens) for _kv, tokens, _outputs in parts]


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
    `chunks`: each lane with a planner offers its best lookup proposal, and the step verifies one
    length of all of them, the one that saves the most time (`adaptive.shared_lengths`: drafts of
    one length share a pass, a longer one adds its own), its promised tokens worth what
    shared drafts have kept of theirs (`Promises.trust`); within the batch and the logits rows one
    decode takes. A forced length (`fixed_len`) is drafted as offered. Returns the proposals and the
    draft tokens each priced one promised (forced lengths promise nothing). Priced as the queue
    stands (`Drafting.queued`: requests waiting for a slot)."""
    offered: dict[int, tuple[Draft, list[float]]] = {}
    for i, lane in enumerate(lanes):
        if lane.planner is not None:
            room = lane.kv.draft_room()
            if lane.sampler.settings.logprobs is not None:  # (speculative.EXACT_VERIFY_POSITIONS)
                room = min(room, EXACT_VERIFY_POSITIONS - 1)
            draft, chances = lane.planner.shared_offer(lane.context, room, lane.request.constraint)
            if draft.tokens:
                offered[i] = (draft, chances)
    if not offered:
        return {}, {}
    room = min(lanes[0].kv.model.n_batch - len(lanes) - sum(chunks), MAX_STEP_OUTPUTS - len(lanes) - len(chunks))
    for draft, chances in offered.values():
        if not chances:  # a forced length: as offered, within what is left of the room
            draft.tokens = draft.tokens[:max(room, 0)]
            room -= len(draft.tokens)
    planner = lanes[next(iter(offered))].planner
    assert planner is not None
    lengths = shared_lengths(planner.cost, [offered[i][1] if i in offered else [] for i in range(len(lanes))],
                             chunks, room, trust=planner.drafting.promises.trust, queued=planner.drafting.queued())
    proposals: dict[int, Proposal] = {}
    promised: dict[int, float] = {}
    for i, (draft, chances) in offered.items():
        if chances:
            draft.tokens = draft.tokens[:lengths[i]]
            if draft.tokens:
                promised[i] = expected_tokens(chances[:len(draft.tokens)]) - 1
        proposals[i] = proposal_of(draft, lanes[i].request.constraint)
    if not promised and any(chances for _draft, chances in offered.values()):
        planner.drafting.promises.passed()
    return proposals, promised


def whole_images(tokens: list[int], n: int) -> int:
    """A prompt chunk of `n` tokens, longer where it would end inside an image (one negative id per row,
    counting down: engine/backend/vision.py): an image's rows are evaluated in one step, as one whose
    attention is non-causal must be (it attends within its batch only)."""
    while 0 < n < len(tokens) - 1 and tokens[n] < 0 and tokens[n] == tokens[n - 1] - 1:
        n += 1
    return n


def advance(lanes: list[Lane], chunk: Callable[[int], int] = lambda rows: 1 << 30) -> list[tuple[Lane, Event]]:
    """One shared step of every lane that can go on: the lanes' events (each round's time is its share of
    the step, by the positions it had in it; a prompt's Prefill when its last chunk is in). Prompts still
    being evaluated get `chunk(rows)` tokens in all (rows: the pending tokens of the step), the oldest
    first; at least one token when nothing else is in the step. Lanes with a planner draft lookups
    priced for the step (`_drafts`). A lane whose own evaluation failed ends with `failure` set."""
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
    proposals, promised = _drafts(together[:pending], list(chunks.values()))
    steps, seconds, tokens = step_together(together, chunks, proposals)
    for i, promise in promised.items():  # every lane that offered has a planner, all of one engine's
        planner, step = together[i].planner, steps[i]
        if planner is not None and step is not None:
            planner.drafting.promises.observe(promise, step.accepted)
    events: list[tuple[Lane, Event]] = []
    for lane, step, n in zip(together, steps, tokens):
        if lane.failure is not None:
            lane.ended = "error"
        elif step is not None:
            event, lane.ended = lane.answer.add(step, len(lane.context) - step.accepted - 1, seconds * n / sum(tokens),
                                                priced=True)
            events.append((lane, event))
        elif lane.prompt_in:  # its first token is decoded in the next step
            events.append((lane, lane.prefilled()))
    return events

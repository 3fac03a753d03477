"""Several sequences in one evaluation per step: the completions of one prompt (llama.cpp's `n_cmpl`,
OpenAI's `n`), and requests that join a running generation (`Guests`).

Every step is one evaluation holding each unfinished sequence's pending token, on its own KV
sequence, and each takes its next token from its own row exactly as a plain round alone would
(`speculative.decide`: the same sampler, seed and grammar), so each answer is the one it would be
alone (greedy: token for token; sampled: the same draws), and one that ends (or is cancelled) leaves
the next step. The completions of one prompt share its evaluation: it is evaluated once into one
slot and copied to the others.

A joining request's prompt is evaluated in chunks within the shared steps (`Guests`): each step
holds the others' pending tokens and at most `chunk(rows)` of the oldest unfinished prompt (the
engine sizes it by the calibrated costs), so a long prompt slows the running streams instead of
freezing them for all its evaluation. A prompt's last token is evaluated as its first step's pending
token, as alone (the first round evaluates it).

No drafts while several sequences share a step: on a CPU a step of n sequences already costs about
what n - 1 draft tokens would (calibration: 3 positions ~2x one on a 2-core AVX2 CPU), which is where
speculation turns into a slowdown; drafts priced for a batch are not built. A generation that others
joined drafts again once it is alone, and so does the last guest left after it ended (`Guests.step`'s
`alone`: speculative rounds on its own sequence).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from localspec.engine.answer import Answer
from localspec.engine.drafters import Draft
from localspec.engine.events import Event, Prefill
from localspec.engine.kv import KvSequence, extend_together
from localspec.engine.request import Request
from localspec.engine.sampling import Sampler
from localspec.engine.speculative import Planner, Step, decide


# A shared step evaluates joining prompts beside the others' pending tokens for at most STEP_S at the
# calibrated verify costs (which price a logits row per position: a prompt's chunk, with one, costs
# about half that on a 2-core AVX2 CPU), but never fewer than LEAST_CHUNK tokens: smaller chunks make
# every joining prompt dearer and its first token later. Measured: scripts/chats_at_once.py
# (docs/performance.md, "Chats at once").
STEP_S = 1.0
LEAST_CHUNK = 64


def prompt_chunk(rows: int, verify: Callable[[int], float], room: int, step_s: float = STEP_S,
                 least: int = LEAST_CHUNK) -> int:
    """Prompt tokens one shared step may evaluate beside `rows` pending tokens: the most that keep the
    step within `step_s` at the costs `verify(n)`, at least `least`, at most `room - rows` (the batch).
    With nothing pending, all that fits: nobody waits for it."""
    most = max(room - rows, 0)
    if rows == 0:
        return most
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
    """One sequence of a shared step: its request, slot, context (the last token pending) and answer."""

    index: int
    request: Request
    kv: KvSequence
    context: list[int]
    sampler: Sampler
    answer: Answer
    everyone: threading.Event      # cancels the whole group (the client went away)
    prefill: Prefill | None        # its own, or the shared prompt's (nothing evaluated); None while its
                                   # prompt is still evaluated in chunks
    cached: int = 0                # prompt tokens its slot held already (a joining request's)
    chunks: int = 0                # steps that evaluated a chunk of its prompt
    deliver: Callable[[Event], None] | None = None  # where a guest's events go (a group's are yielded)
    planner: Planner | None = None  # its own, once it drafts (the last guest left: Engine._lone_round)
    started: float = field(default_factory=time.perf_counter)  # its wall time counts from here
    ended: str | None = None

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
        return opening + list(self.answer.finish(self.ended or "cancelled", prefill, time.perf_counter() - self.started,
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
        self.prefill = Prefill(prompt_tokens=len(self.request.prompt), evaluated=evaluated,
                               cached=self.cached, seconds=time.perf_counter() - self.started,
                               chunks=max(self.chunks, 1))
        return self.prefill


def step_together(lanes: list[Lane], chunks: dict[int, int] | None = None) -> tuple[list[Step | None], float, int]:
    """One evaluation holding every lane's pending token, or, for the lanes in `chunks` (by position in
    `lanes`), that many more tokens of its prompt (never its last). Each lane that evaluated its pending
    token gets its next token, chosen as a plain round alone would choose it; a prompt's chunk gets None.
    Returns the steps, the evaluation's seconds and the tokens it held."""
    chunks = chunks or {}
    parts = [(lane.kv, lane.unevaluated()[:chunks[i]] if i in chunks else [lane.context[-1]])
             for i, lane in enumerate(lanes)]
    t0 = time.perf_counter()
    rows = extend_together(parts)
    seconds = time.perf_counter() - t0
    steps: list[Step | None] = []
    for i, (lane, logits) in enumerate(zip(lanes, rows)):
        if i in chunks:
            steps.append(None)
            continue
        constraint = lane.request.constraint
        _accepted, token = decide(logits[None, :], lane.context, Draft.empty(), lane.sampler, [constraint])
        lane.context.append(token)
        if constraint is not None:
            constraint.accept(token)
        steps.append(Step(draft=Draft.empty(), accepted=0, token=token, verify_s=seconds, shared=len(lanes) - 1))
    return steps, seconds, sum(len(tokens) for _kv, tokens in parts)


def _advance(lanes: list[Lane], host: Lane | None = None, chunk: Callable[[int], int] = lambda rows: 1 << 30,
             ) -> tuple[list[tuple[Lane, Event]], Step | None, float]:
    """One shared step of `host` (if any) and every lane that can go on: the lanes' events (each token's
    time is its share of the step; a prompt's Prefill when its last chunk is in), the host's step, and
    that share. Prompts still being evaluated get `chunk(rows)` tokens in all (rows: the pending tokens
    of the step), the oldest first; at least one token when nothing else is in the step."""
    for lane in lanes:
        lane.ended = lane.stops_before_step()
    going = [lane for lane in lanes if lane.ended is None]
    decoding = [lane for lane in going if lane.prompt_in]
    together = ([host] if host is not None else []) + decoding
    budget = max(chunk(len(together)), 0 if together else 1)
    chunks: dict[int, int] = {}
    for lane in going:
        if not lane.prompt_in and budget > 0:
            n = min(budget, len(lane.unevaluated()) - 1)
            chunks[len(together)] = n
            lane.chunks += 1
            together.append(lane)
            budget -= n
    if not together:
        return [], None, 0.0
    steps, seconds, tokens = step_together(together, chunks)
    share = seconds / tokens
    host_step = steps.pop(0) if host is not None else None
    events: list[tuple[Lane, Event]] = []
    for lane, step in zip(together[1:] if host is not None else together, steps):
        if step is not None:
            event, lane.ended = lane.answer.add(step, len(lane.context) - 1, share, priced=True)
            events.append((lane, event))
        elif lane.prompt_in:  # its first token is decoded in the next step
            events.append((lane, lane.prefilled()))
    return events, host_step, share


def decode_together(lanes: list[Lane], estimate_tokens_per_s: float) -> Iterator[tuple[int, Event]]:
    """Step every unfinished lane together until all have ended: (lane index, event), each lane's
    rounds and then its summary as soon as it ends."""
    live = lanes
    while live:
        rounds, _host, _share = _advance(live)
        for lane, event in rounds:
            yield lane.index, event
        for lane in live:
            if lane.ended is not None:
                for last in lane.finish(estimate_tokens_per_s):
                    yield lane.index, last
        live = [lane for lane in live if lane.ended is None]


class Guests:
    """Requests that joined the running generation: each step of that generation (then on alone, the
    guests' own steps) holds their pending tokens too. Their events go to each one's `deliver`."""

    def __init__(self, estimate_tokens_per_s: Callable[[], float], chunk: Callable[[int], int]):
        self.lanes: list[Lane] = []
        self._estimate = estimate_tokens_per_s
        self._chunk = chunk  # prompt tokens a step may evaluate beside `rows` pending tokens

    def __bool__(self) -> bool:
        return bool(self.lanes)

    def join(self, lane: Lane) -> None:
        """A request from the next step on: its prompt (what its slot does not hold) is evaluated in
        chunks within the steps, then it decodes with the others."""
        assert lane.deliver is not None
        if lane.prefill is None and lane.prompt_in:  # its slot held all of it but the last
            lane.prefilled()
        if lane.prefill is not None:
            lane.deliver(lane.prefill)
        self.lanes.append(lane)

    def step(self, host: Lane | None = None,
             alone: Callable[[Lane], Step | None] | None = None) -> tuple[Step | None, float]:
        """One step: the host's (if any) with every guest's (or a chunk of a guest's prompt); the guests'
        events delivered, those that ended retired (their slots free). Returns the host's step and its
        share of the step's time. With no host and one guest left, `alone` (if given) makes that guest's round instead: a
        speculative one, None when its context is full."""
        if host is None and alone is not None and len(self.lanes) == 1 and self.lanes[0].prefill is not None:
            rounds, host_step, share = self._alone(self.lanes[0], alone), None, 0.0
        else:
            rounds, host_step, share = _advance(self.lanes, host, self._chunk)
        for lane, event in rounds:
            assert lane.deliver is not None
            lane.deliver(event)
        for lane in [lane for lane in self.lanes if lane.ended is not None]:
            assert lane.deliver is not None
            for last in lane.finish(self._estimate()):
                lane.deliver(last)
            lane.request.close()
            self.lanes.remove(lane)
        return host_step, share

    @staticmethod
    def _alone(lane: Lane, round_of: Callable[[Lane], Step | None]) -> list[tuple[Lane, Event]]:
        lane.ended = lane.stops_before_step()
        if lane.ended is not None:
            return []
        t0 = time.perf_counter()
        step = round_of(lane)
        if step is None:
            lane.ended = "context"
            return []
        event, lane.ended = lane.answer.add(step, len(lane.context) - step.accepted - 1, time.perf_counter() - t0,
                                            priced=bool(step.draft.tokens))
        return [(lane, event)]

    def drop(self) -> None:
        """The generation they joined failed: let go of their slots (the caller tells their clients)."""
        for lane in self.lanes:
            lane.request.close()
        self.lanes.clear()

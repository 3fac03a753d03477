"""Several sequences in one evaluation per step: the completions of one prompt (llama.cpp's `n_cmpl`,
OpenAI's `n`), and requests that join a running generation (`Guests`).

Every step is one evaluation holding each unfinished sequence's pending token, on its own KV
sequence, and each takes its next token from its own row exactly as a plain round alone would
(`speculative.decide`: the same sampler, seed and grammar), so each answer is the one it would be
alone (greedy: token for token; sampled: the same draws), and one that ends (or is cancelled) leaves
the next step. The completions of one prompt share its evaluation: it is evaluated once into one
slot and copied to the others.

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
from localspec.engine.speculative import Step, decide


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
    prefill: Prefill               # its own, or the shared prompt's (nothing evaluated)
    deliver: Callable[[Event], None] | None = None  # where a guest's events go (a group's are yielded)
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
        """Its last events: held-back text, then the summary."""
        return self.answer.finish(self.ended or "cancelled", self.prefill, time.perf_counter() - self.started,
                                  estimate_tokens_per_s, self.request.label, len(self.kv.tokens))


def step_together(lanes: list[Lane]) -> tuple[list[Step], float]:
    """One evaluation holding every lane's pending token; each lane's next token, chosen as a plain
    round alone would choose it. Returns each lane's step and the evaluation's seconds."""
    t0 = time.perf_counter()
    rows = extend_together([(lane.kv, [lane.context[-1]]) for lane in lanes])
    seconds = time.perf_counter() - t0
    steps = []
    for lane, logits in zip(lanes, rows):
        constraint = lane.request.constraint
        _accepted, token = decide(logits[None, :], lane.context, Draft.empty(), lane.sampler, [constraint])
        lane.context.append(token)
        if constraint is not None:
            constraint.accept(token)
        steps.append(Step(draft=Draft.empty(), accepted=0, token=token, verify_s=seconds))
    return steps, seconds


def _advance(lanes: list[Lane], host: Lane | None = None) -> tuple[list[tuple[Lane, Event]], Step | None, float]:
    """One shared step of `host` (if any) and every lane that can go on: the lanes' rounds (each token's
    time is its share of the step), the host's step, and that share."""
    for lane in lanes:
        lane.ended = lane.stops_before_step()
    stepping = [lane for lane in lanes if lane.ended is None]
    together = ([host] if host is not None else []) + stepping
    if not together:
        return [], None, 0.0
    steps, seconds = step_together(together)
    share = seconds / len(together)
    host_step = steps.pop(0) if host is not None else None
    rounds: list[tuple[Lane, Event]] = []
    for lane, step in zip(stepping, steps):
        event, lane.ended = lane.answer.add(step, len(lane.context) - 1, share, priced=True)
        rounds.append((lane, event))
    return rounds, host_step, share


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

    def __init__(self, estimate_tokens_per_s: Callable[[], float]):
        self.lanes: list[Lane] = []
        self._estimate = estimate_tokens_per_s

    def __bool__(self) -> bool:
        return bool(self.lanes)

    def join(self, lane: Lane) -> None:
        assert lane.deliver is not None
        lane.deliver(lane.prefill)
        self.lanes.append(lane)

    def step(self, host: Lane | None = None,
             alone: Callable[[Lane], Step | None] | None = None) -> tuple[Step | None, float]:
        """One step: the host's (if any) with every guest's; the guests' events delivered, those that
        ended retired (their slots free). Returns the host's step and its share of the step's time.
        With no host and one guest left, `alone` (if given) makes that guest's round instead: a
        speculative one, None when its context is full."""
        if host is None and alone is not None and len(self.lanes) == 1:
            rounds, host_step, share = self._alone(self.lanes[0], alone), None, 0.0
        else:
            rounds, host_step, share = _advance(self.lanes, host)
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

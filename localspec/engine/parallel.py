"""Several completions of one prompt decoded together (llama.cpp's `n_cmpl`, OpenAI's `n`).

The prompt is evaluated once into one slot and copied to the others; then every step is one
evaluation holding each unfinished completion's pending token, on its own sequence, and each
completion takes its next token from its own row exactly as a plain round alone would
(`speculative.decide`: the same sampler, seed and grammar), so each completion is the one it would
be alone, and a completion that ends (or is cancelled) leaves the next step.

No drafts here: on a CPU a step of n sequences already costs about what n - 1 draft tokens would
(calibration: 3 positions ~2x one on a 2-core AVX2 CPU), so drafting on top of it is the case where
speculation turns into a slowdown; pricing drafts for a batch is not done yet.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

from localspec.engine.answer import Answer
from localspec.engine.drafters import Draft
from localspec.engine.events import Event, Prefill
from localspec.engine.kv import KvSequence, extend_together
from localspec.engine.request import Request
from localspec.engine.sampling import Sampler
from localspec.engine.speculative import Step, decide


@dataclass
class Lane:
    """One completion of the group: its request, slot, context (the last token pending) and answer."""

    index: int
    request: Request
    kv: KvSequence
    context: list[int]
    sampler: Sampler
    answer: Answer
    everyone: threading.Event      # cancels the whole group (the client went away)
    prefill: Prefill               # the first completion's, or the shared prompt's (nothing evaluated)
    ended: str | None = None

    def stops_before_step(self) -> str | None:
        """Why this completion cannot take part in the next step, if it cannot."""
        if self.request.cancel.is_set() or self.everyone.is_set():
            return "cancelled"
        if self.kv.room() < 1:
            return "context"
        return None


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


def decode_together(lanes: list[Lane], estimate_tokens_per_s: float) -> Iterator[tuple[int, Event]]:
    """Step every unfinished lane together until all have ended: (lane index, event), each lane's
    rounds and then its summary as soon as it ends. Each token's time is its share of the step."""
    t_start = time.perf_counter()
    live = lanes
    while live:
        for lane in live:
            lane.ended = lane.stops_before_step()
        stepping = [lane for lane in live if lane.ended is None]
        if stepping:
            steps, seconds = step_together(stepping)
            for lane, step in zip(stepping, steps):
                event, lane.ended = lane.answer.add(step, len(lane.context) - 1, seconds / len(stepping),
                                                    priced=True)
                yield lane.index, event
        for lane in live:
            if lane.ended is not None:
                for last in lane.answer.finish(lane.ended, lane.prefill, time.perf_counter() - t_start,
                                               estimate_tokens_per_s, lane.request.label, len(lane.kv.tokens)):
                    yield lane.index, last
        live = [lane for lane in live if lane.ended is None]

"""The engine core: every request being generated is a lane of one step loop.

A lane (engine/parallel.py: its request, slot, context, sampler, answer and planner) is `add`ed with its
prompt in its slot already or still to be evaluated; `step` advances the lanes it is given (all, unless
the caller's policy names some) and hands each its events through its `deliver`; `abort` cancels one,
which ends at the next step that takes it; `drop` lets go of every lane after a failure no lane can
survive. A step is one of two shapes, by what it holds:
- one lane alone, its prompt in, with a planner: a speculative round on its own sequence
  (`solo_round`: the request's planner, the draft model included), timed as a plain round where it
  drafted nothing, so the speedup shown measures plain decoding on the same loop;
- anything else: one evaluation holding every lane's pending token with its lookup draft, and chunks
  of the prompts still being evaluated (`parallel.advance`), each lane's round settled as alone.
So a request decodes the same way whoever else is running: alone it is the one-lane case of the loop
that shares steps, not a second loop. A lane a step leaves out waits: that time is not its answer's
(`Request.waited_s`). Which lanes a step takes is policy (the engine's `generate`: every lane, an
interjection: its own), never the core's.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from localspec.engine.events import Event
from localspec.engine.parallel import Lane, advance
from localspec.engine.speculative import Step


class Core:
    def __init__(self, solo_round: Callable[[Lane], Step | None], chunk: Callable[[int], int],
                 estimate_tokens_per_s: Callable[[], float]):
        self.lanes: list[Lane] = []
        self._solo_round = solo_round  # a lane's speculative round on its own sequence; None: context full
        self._chunk = chunk            # prompt tokens a shared step may evaluate beside `rows` pending tokens
        self._estimate = estimate_tokens_per_s

    def __bool__(self) -> bool:
        return bool(self.lanes)

    def __len__(self) -> int:
        return len(self.lanes)

    def add(self, lane: Lane) -> None:
        """A lane from the next step on. One whose slot held all its prompt but the last token gets its
        Prefill now; one whose prompt is to be evaluated gets it once its last chunk is in."""
        assert lane.deliver is not None
        if lane.prefill is None and lane.prompt_in:
            lane.prefilled()
        if lane.prefill is not None:
            lane.deliver(lane.prefill)
        self.lanes.append(lane)

    @staticmethod
    def abort(lane: Lane) -> None:
        """It ends (its summary says "cancelled") at the next step that takes it."""
        lane.request.cancel.set()

    def step(self, only: Sequence[Lane] | None = None) -> None:
        """One step of `only` (every lane if None); lanes that ended are retired, their slots free."""
        lanes = [lane for lane in self.lanes if only is None or any(lane is o for o in only)]
        t0 = time.perf_counter()
        if len(lanes) == 1 and lanes[0].prefill is not None and lanes[0].planner is not None:
            rounds = self._alone(lanes[0])
        else:
            rounds = advance(lanes, self._chunk)
        for lane, event in rounds:
            self._send(lane, event)
        for lane in [lane for lane in lanes if lane.ended is not None]:
            self._retire(lane)
        waited = time.perf_counter() - t0
        for lane in self.lanes:
            if not any(lane is taken for taken in lanes):
                lane.request.waited_s += waited

    def _alone(self, lane: Lane) -> list[tuple[Lane, Event]]:
        lane.ended = lane.stops_before_step()
        if lane.ended is not None:
            return []
        t0 = time.perf_counter()
        step = self._solo_round(lane)
        if step is None:
            lane.ended = "context"
            return []
        event, lane.ended = lane.answer.add(step, len(lane.context) - step.accepted - 1, time.perf_counter() - t0,
                                            priced=bool(step.draft.tokens))
        return [(lane, event)]

    @staticmethod
    def _send(lane: Lane, event: Event | Exception) -> None:
        assert lane.deliver is not None
        lane.deliver(event)

    def _retire(self, lane: Lane) -> None:
        """Its last events (or its own failure), its slot freed, its answer evidence for the drafters."""
        if lane.failure is not None:
            self._send(lane, lane.failure)  # its client gets the error; the others go on
        else:
            for last in lane.finish(self._estimate()):
                self._send(lane, last)
        self._forget(lane)

    def _forget(self, lane: Lane) -> None:
        if not lane.iterated:
            lane.request.close()
        if lane.planner is not None:  # its answer is evidence, as any request's
            lane.planner.finish(lane.context[len(lane.request.prompt):])
        self.lanes = [other for other in self.lanes if other is not lane]

    def remove(self, lane: Lane) -> None:
        """Let go of one lane without its last events (its consumer went away)."""
        if any(other is lane for other in self.lanes):
            self._forget(lane)

    def drop(self) -> None:
        """Let go of every lane (the caller tells their clients why)."""
        for lane in list(self.lanes):
            self._forget(lane)

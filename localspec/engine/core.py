"""The engine core: every request being generated is a lane of one step loop.

A lane (engine/parallel.py: its request, slot, context, sampler, answer and planner) comes in with its
prompt evaluated at once (`open`, `open_group` for the completions of one prompt) or still to be
evaluated within the steps (`join`); `step` advances the lanes it is given (all, unless the caller's
policy names some) and hands each its events through its `deliver`; `abort` cancels one, which ends at
the next step that takes it; `drop` lets go of every lane after a failure no lane can survive. A step
is one of two shapes, by what it holds:
- one lane alone, its prompt in, with a planner: a speculative round on its own sequence (the
  request's planner, the draft model included), timed as a plain round where it drafted nothing, so
  the speedup shown measures plain decoding on the same loop;
- anything else: one evaluation holding every lane's pending token with its lookup draft, and chunks
  of the prompts still being evaluated (`parallel.advance`), each lane's round settled as alone.
So a request decodes the same way whoever else is running: alone it is the one-lane case of the loop
that shares steps, not a second loop. A lane a step leaves out waits: that time is not its answer's
(`Request.waited_s`). Which lanes a step takes is policy (the engine's `generate`: every lane, an
interjection: its own), never the core's.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Iterator, Sequence

from localspec.engine.adaptive import CostModel
from localspec.engine.answer import Answer
from localspec.engine.events import Event, Prefill
from localspec.engine.model import LanguageModel
from localspec.engine.parallel import Lane, advance, prompt_chunk
from localspec.engine.request import Request
from localspec.engine.sampling import InfillVocab, Sampler
from localspec.engine.slots import Slots
from localspec.engine.speculative import Planner, Step, speculative_round
from localspec.engine.speedup import PlainRounds, SpeedupMeter

Deliver = Callable[[Event | Exception], None]


class Inbox:
    """What the core delivers to the lanes an iterator yields for (`Core.events`): their events, or the
    failure of their own evaluation (which ends them and no other lane)."""

    def __init__(self) -> None:
        self.items: deque = deque()
        self.failure: Exception | None = None

    def __call__(self, item) -> None:
        if isinstance(item, Exception):
            self.failure = item
        else:
            self.items.append(item)


class Core:
    def __init__(self, target: LanguageModel, slots: Slots, cost: CostModel, plain_rounds: PlainRounds,
                 learn: Callable[[Step, int], None] = lambda step, context_len: None):
        self.lanes: list[Lane] = []
        self.target = target
        self.slots = slots
        self.cost = cost
        self.plain_rounds = plain_rounds  # plain decoding's measured speed: every answer's baseline
        self._learn = learn               # what a lone round tells the calibration

    # ------------------------------------------------------------------ requests in

    def open(self, request: Request, planner: Planner | None, deliver: Deliver,
             everyone: threading.Event | None = None) -> Lane:
        """The request's prompt into a free slot at once, then its lane (its Prefill delivered); the lanes
        already there wait meanwhile. Its consumer frees its slot (`Lane.iterated`)."""
        t0 = time.perf_counter()
        prefill = self._prefill(request, planner, t0)
        for other in self.lanes:
            other.request.waited_s += prefill.seconds
        lane = self._lane(request, prefill, t0, deliver, everyone)
        lane.planner, lane.iterated = planner, True
        self.add(lane)
        return lane

    def open_group(self, group: list[Request], deliver: Callable[[int], Deliver],
                   everyone: threading.Event) -> list[Lane]:
        """Completions of one prompt (two or more), one free slot each: the prompt evaluated into the slot
        holding most of it and copied to the others; they decode together without drafts (each draws as
        alone would)."""
        t0 = time.perf_counter()
        lead = group[0]
        prefill = self._prefill(lead, None, t0)
        assert lead.kv is not None
        for request, kv in zip(group[1:], self.slots.free()):
            kv.copy_from(lead.kv)
            self.slots.take(kv)
            request.kv = kv
        shared = Prefill(prompt_tokens=prefill.prompt_tokens, evaluated=0, cached=prefill.prompt_tokens,
                         seconds=prefill.seconds)
        lanes = []
        for i, request in enumerate(group):
            lanes.append(self._lane(request, prefill if i == 0 else shared, t0, deliver(i), everyone))
            lanes[-1].iterated = True
            self.add(lanes[-1])
        return lanes

    def join(self, request: Request, planner: Planner, deliver: Deliver) -> None:
        """The request in a free slot now, holding what it can of its prompt; the rest is evaluated in
        chunks within the following steps (its Prefill once it is in)."""
        t0 = time.perf_counter()
        try:
            request.kv, cached = self.slots.place(request.prompt)
        except BaseException:
            request.close()
            raise
        lane = self._lane(request, None, t0, deliver, None, cached)
        lane.planner = planner
        self.add(lane)

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

    def events(self, lanes: list[Lane], inbox: Inbox, only: list[Lane] | None = None) -> Iterator:
        """Step (`only` those lanes, else every lane) until `lanes` are retired, yielding what they get
        (through `inbox`, their `deliver`); their own failure is raised."""
        while True:
            while inbox.items:
                yield inbox.items.popleft()
            if inbox.failure is not None:
                raise inbox.failure
            if not any(lane is held for lane in lanes for held in self.lanes):
                return
            self.step(only)

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
            rounds = advance(lanes, lambda rows: prompt_chunk(rows, self.cost.verify, self.target.n_batch))
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
        assert lane.planner is not None
        step = speculative_round(lane.kv, lane.context, lane.planner, lane.sampler, lane.request.constraint)
        if step is not None:
            self._learn(step, len(lane.context) - step.accepted - 1)
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
            for last in lane.finish(self.cost.plain_tokens_per_s):
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

    # ------------------------------------------------------------------ lanes

    def _lane(self, request: Request, prefill: Prefill | None, t0: float, deliver: Deliver,
              everyone: threading.Event | None, cached: int = 0) -> Lane:
        """A request's lane: its slot, context, sampler and answer (time to its first token counted from
        `t0`); `everyone` cancels its group. Without `prefill`, its prompt is evaluated within shared
        steps (its slot held `cached` of it)."""
        assert request.kv is not None
        meter = SpeedupMeter(self.plain_rounds, lambda: self.cost.verify(1))
        vocab = self.target.vocab
        infill = InfillVocab(is_eog=vocab.is_eog, piece=vocab.token_bytes, eot=vocab.eot if vocab.eot >= 0 else vocab.eos)
        return Lane(request, request.kv, list(request.prompt), Sampler(request.sampling, infill),
                    Answer(vocab, request.max_tokens, request.stop, meter, t0),
                    everyone or request.cancel, prefill, cached, deliver=deliver)

    def _prefill(self, request: Request, planner: Planner | None, t0: float) -> Prefill:
        """The request's prompt into a free slot (Slots.prefill); its drafters get ready for it."""
        prompt = request.prompt
        request.kv, keep = self.slots.prefill(prompt, request.cancel)
        evaluated = len(prompt) - keep  # (its last token too: the first round evaluates it)
        if len(request.kv.tokens) < len(prompt) - 1:  # its client left meanwhile: no round follows
            evaluated = len(request.kv.tokens) - keep
        elif planner is not None:
            planner.prefill(prompt, request.kv)
        return Prefill(prompt_tokens=len(prompt), evaluated=evaluated, cached=keep, seconds=time.perf_counter() - t0)

"""The engine core: every request being generated is a lane of one step loop.

A lane (engine/parallel.py: its request, slot, context, sampler, answer and planner) comes in with
`add`: it takes a free slot holding what it can of its prompt, and the rest of the prompt is evaluated
in chunks within the following steps (a lane that `follows` another, a completion of the same prompt,
copies that one's cache instead). `step` advances the lanes it is given (all, unless the caller's
policy names some) and hands each its events through its `deliver`; `abort` cancels one, which ends at
the next step that takes it; `drop` lets go of every lane after a failure no lane can survive. Every
step is `parallel.advance` over the lanes it takes, and decodes the target once (`kv.extend_together`,
or `kv.verify_tree` for a lone lane's candidate tree): every lane's pending token with the draft its
planner chose (a lone lane's priced as a round alone, the draft model included; several lanes' priced
for the step, the draft model drafting for all of them at once), and chunks of the prompts still being
evaluated; each lane settles its own rows (a shared decode llama.cpp refuses is retried lane by lane,
and a recurrent state that cannot go back replays what it keeps). A lone lane's round is timed as a plain round where it
drafted nothing, so the speedup shown measures plain decoding on the same loop.
So a request decodes the same way whoever else is running: alone it is the one-lane case of the loop
that shares steps, not a second loop. A lane a step leaves out waits: that time is not its answer's
(`Request.waited_s`). Every call into the core runs on the engine's one thread (engine/driver.py), and
which lanes a step takes is its policy's (readers pulling: every lane; the server's scheduler: an
editor's completion within its share), never the core's.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

from localspec.engine.adaptive import CostModel
from localspec.engine.answer import Answer
from localspec.engine.events import Event, Prefill
from localspec.engine.kv import common_prefix
from localspec.engine.model import LanguageModel
from localspec.engine.parallel import Lane, advance, prompt_chunk
from localspec.engine.planner import Planner
from localspec.engine.request import Request
from localspec.engine.sampling import InfillVocab, Sampler
from localspec.engine.slots import Slots
from localspec.engine.speculative import Step
from localspec.engine.speedup import PlainRounds, SpeedupMeter

Deliver = Callable[[Event | Exception], None]


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

    def add(self, request: Request, planner: Planner | None, deliver: Deliver, *,
            everyone: threading.Event | None = None, follows: Lane | None = None, iterated: bool = False) -> Lane:
        """The request's lane from the next step on, in a free slot holding what it can of its prompt
        (`Slots.place`); the rest is evaluated in chunks within the steps, and its Prefill is delivered
        once it is in. A lane that `follows` another (a completion of the same prompt) evaluates nothing:
        it takes a copy of that lane's cache once its prompt is in. `everyone` cancels every sequence of
        its request; an `iterated` lane's consumer frees its slot (`Lane.iterated`)."""
        try:
            if follows is None:
                request.kv, cached = self.slots.place(request.prompt)
            else:
                request.kv, cached = self.slots.free()[0], 0
                self.slots.take(request.kv)
        except BaseException:
            request.close()
            raise
        lane = self._lane(request, time.perf_counter(), deliver, everyone, cached)
        lane.planner, lane.follows, lane.iterated = planner, follows, iterated
        if planner is not None:
            planner.remaining = lane.answer.remaining  # the budget is counted by the answer alone
        self.lanes.append(lane)
        if follows is None and lane.prompt_in:
            self._prompt_in(lane, lane.prefilled())
        self._copy_prompts()
        return lane

    def add_sequences(self, sequences: list[Request], planner: Callable[[Request], Planner],
                      deliver: Callable[[int], Deliver], everyone: threading.Event,
                      iterated: bool = False) -> list[Lane]:
        """A request's sequences (completions of one prompt), one free slot each: one alone, with its
        `planner`, as any request; several, the prompt evaluated once into the first one's slot and
        copied to the others', without drafts (each draws as alone would)."""
        if len(sequences) == 1:
            return [self.add(sequences[0], planner(sequences[0]), deliver(0), everyone=everyone, iterated=iterated)]
        lead = self.add(sequences[0], None, deliver(0), everyone=everyone, iterated=iterated)
        return [lead] + [self.add(request, None, deliver(i), everyone=everyone, follows=lead, iterated=iterated)
                         for i, request in enumerate(sequences[1:], 1)]

    def _prompt_in(self, lane: Lane, prefill: Prefill) -> None:
        """Its prompt is in: a point its slot can return to (a recurrent state's checkpoint), its drafters
        ready to draft after it, its Prefill delivered."""
        lane.kv.checkpoint()  # a follow-up's prompt parts from this one at its end at the earliest
        if lane.planner is not None:
            lane.planner.prefill(lane.context, lane.kv)
        self._send(lane, prefill)

    def _copy_prompts(self) -> None:
        """Lanes that follow another take its prompt once it is in (evaluated once, copied), or what it
        had of it when it ended first (the rest evaluated on their own)."""
        for lane in self.lanes:
            lead = lane.follows
            if lead is None or (len(lead.kv.tokens) < len(lead.request.prompt) - 1 and lead.ended is None):
                continue
            lane.follows = None
            lane.kv.copy_from(lead.kv)
            lane.kv.rewind(min(common_prefix(lane.kv.tokens, lane.request.prompt), len(lane.request.prompt) - 1))
            if lane.prompt_in:
                shared = lead.prefill or lead.prefilled()
                lane.prefill = Prefill(prompt_tokens=shared.prompt_tokens, evaluated=0, cached=shared.prompt_tokens,
                                       seconds=time.perf_counter() - lane.started)
                lane.waited_at_prompt = lane.request.waited_s
                self._send(lane, lane.prefill)
            else:
                lane.cached = len(lane.kv.tokens)

    def __bool__(self) -> bool:
        return bool(self.lanes)

    def __len__(self) -> int:
        return len(self.lanes)

    def abort(self, lane: Lane) -> None:
        """It ends (its summary says "cancelled") at the next step that takes it."""
        lane.request.cancel.set()

    def step(self, only: Sequence[Lane] | None = None) -> None:
        """One step of `only` (every lane if None); lanes that ended are retired, their slots free."""
        lanes = [lane for lane in self.lanes if only is None or any(lane is o for o in only)]
        t0 = time.perf_counter()
        own = [lane for lane in lanes if lane.follows is None]
        for lane in lanes:
            if lane.follows is not None:  # (waiting for the prompt it copies)
                lane.ended = lane.stops_before_step()
        rounds = advance(own, lambda rows: prompt_chunk(rows, self.cost.verify, self.target.n_batch), self._learn)
        for lane, event in rounds:
            if isinstance(event, Prefill):
                self._prompt_in(lane, event)
            else:
                self._send(lane, event)
        self._copy_prompts()
        for lane in [lane for lane in lanes if lane.ended is not None]:
            self._retire(lane)
        waited = time.perf_counter() - t0
        for lane in self.lanes:
            if not any(lane is taken for taken in lanes):
                lane.request.waited_s += waited

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

    def drop(self, failure: Exception | None = None) -> None:
        """Let go of every lane, handing each the `failure` no lane survived."""
        for lane in list(self.lanes):
            if failure is not None:
                self._send(lane, failure)
            self._forget(lane)

    # ------------------------------------------------------------------ lanes

    def _lane(self, request: Request, t0: float, deliver: Deliver, everyone: threading.Event | None,
              cached: int) -> Lane:
        """A request's lane: its slot (holding `cached` of its prompt), context, sampler and answer (time
        to its first token counted from `t0`); `everyone` cancels its request's every sequence."""
        assert request.kv is not None
        meter = SpeedupMeter(self.plain_rounds, lambda: self.cost.verify(1))
        vocab = self.target.vocab
        infill = InfillVocab(is_eog=vocab.is_eog, piece=vocab.token_bytes, eot=vocab.eot if vocab.eot >= 0 else vocab.eos)
        return Lane(request, request.kv, list(request.prompt), Sampler(request.sampling, infill),
                    Answer(vocab, request.params, meter, t0),
                    everyone or request.cancel, None, cached, deliver=deliver, started=t0)

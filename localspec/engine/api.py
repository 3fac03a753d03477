"""The engine every front door uses: load a target (and a draft), then `generate` or `chat`.

    from localspec import load
    engine = load("qwen2.5-coder-1.5b")          # a catalog pair, or paths: load("t.gguf", draft="d.gguf")
                                                  # (localspec.loader resolves ids, then calls load_files)
    for event in engine.chat([{"role": "user", "content": "Reverse a list in Python"}]):
        ...                                       # Prefill, then one Round per step, then a Summary
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from localspec.engine.adaptive import CostModel
from localspec.engine.calibration import Calibrator, Interrupted
from localspec.engine.contract import ServedEngine, available_drafters
from localspec.engine.drafters import CopyDrafter, Drafter, Sources, build
from localspec.engine.events import Event
from localspec.engine.kv import KvSequence
from localspec.engine.model import LanguageModel, PredictionHead, Vocabulary
from localspec.engine.core import Core, Deliver, Inbox
from localspec.engine.parallel import Lane
from localspec.engine.request import Request, check
from localspec.engine.sampling import SamplingSettings
from localspec.engine.session import ChatTemplate, Message
from localspec.engine.slots import Slots
from localspec.engine.speculative import Drafting, Planner, Step
from localspec.engine.speedup import PlainRounds
from localspec.errors import LocalspecError


@dataclass(frozen=True)
class EngineOptions:
    drafter: str = "auto"            # one of contract.DRAFTER_SETTINGS
    draft_len: int | None = None     # None: adaptive; N: always draft N
    draft_p_min: float = 0.5         # stop a model draft when its top probability falls below this
    calibrate: bool = True           # measure verify costs at load (cached per model file and machine)
    learn_costs: bool = True         # refine those costs with the timings of real rounds
    history_drafts: bool = True      # draft from earlier requests' text (the "history" drafter)
    cache_reuse: int = 0             # reuse cached runs of at least this many tokens that moved (0: prefix only)


def plain_only_warning(target: LanguageModel) -> str:
    """Why a target whose recurrent state cannot be rolled back decodes without drafts."""
    architecture = target.meta("general.architecture") or "this architecture"
    return (f"{architecture} keeps a recurrent state that llama.cpp cannot roll back token by token: "
            "answers are decoded plainly, without drafts.")


class Engine:
    """A target model, an optional draft model, and the loop between them. One generation at a time."""

    def __init__(self, target: LanguageModel, draft: LanguageModel | None = None, options: EngineOptions | None = None,
                 *, cost: CostModel | None = None, draft_cost_s: float | None = None,
                 template: ChatTemplate | None = None, self_draft: LanguageModel | None = None,
                 history_file: Path | None = None, eagle3: PredictionHead | None = None):
        self.target = target
        self.draft = draft
        self.self_draft = self_draft
        self.options = options or EngineOptions()
        self.slots = Slots(target, self.options.cache_reuse)  # the target's KV sequences (engine/slots.py)
        # The target's verify costs: given (tests), or calibrated (trusted cache, or measured now and
        # measured again between requests while untrusted or contradicted: engine/calibration.py).
        self.calibrator = None if cost is not None else Calibrator(target, self.options.calibrate)
        self.cost = cost or CostModel(verify_s=dict(self.calibrator.current.costs if self.calibrator else {}))
        self.plain_rounds = PlainRounds()  # what plain decoding measured here: the speedup's baseline
        opts = self.options
        self._drafters: list[Drafter] = build(Sources(
            target=target, draft=draft, self_draft=self_draft, eagle3=eagle3, p_min=opts.draft_p_min,
            calibrate=opts.calibrate,
            learn_costs=opts.learn_costs, draft_cost_s=draft_cost_s, history=opts.history_drafts,
            history_file=history_file))
        self._template = template
        # Whether requests wait for a slot (the server's scheduler sets it): shared steps price drafts by it.
        self.queued: Callable[[], bool] = lambda: False
        # What drafting learns across requests; each request plans with a Planner of its own from it.
        self.drafting = Drafting(self.cost, self._drafters, learn_costs=opts.learn_costs,
                                 plain_wanted=self.plain_rounds.wanted, queued=lambda: self.queued())
        # Urgent requests (an editor's completions) draft copies of their own context and the history
        # (each request has its own turn of it; their answers are recorded, so an editor's repeated
        # completion replays), not the draft model: the chats' draft sequences stay as they were.
        history = [d for d in self._drafters if d.name == "history"]
        self._side = Drafting(self.cost, [CopyDrafter(target.vocab.is_control), *history],
                              learn_costs=opts.learn_costs, plain_wanted=self.plain_rounds.wanted,
                              queued=lambda: self.queued())
        self._owner: int | None = None  # the thread whose requests hold the engine (`_hold`)
        # Every request being generated is a lane of the core's one step loop (engine/core.py).
        self.core = Core(target, self.slots, self.cost, self.plain_rounds, learn=self._learn)
        self._lock = threading.Lock()
        self._maintaining = False
        self._make_way = threading.Event()  # a request asks maintenance to stop

    # ------------------------------------------------------------------ setup

    @property
    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = ChatTemplate.for_model(self.target)
        return self._template

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    @property
    def drafters(self) -> tuple[str, ...]:
        return available_drafters(d.name for d in self._drafters)

    def drafter(self, name: str) -> Drafter | None:
        """The registered drafter of that name, if this engine has it."""
        return next((d for d in self._drafters if d.name == name), None)

    @property
    def warnings(self) -> list[str]:
        """Problems met at load that the user should hear about (a stored history ignored, say)."""
        warnings = [d.warning for d in self._drafters if d.warning]
        if self.target.max_rollback == 0:
            warnings.append(plain_only_warning(self.target))
        return warnings

    @property
    def baseline_tokens_per_s(self) -> float:
        """Plain decoding at a short context: measured in this process when it has been, else the estimate."""
        measured = self.plain_rounds.per_token_s(0)
        return 1.0 / measured if measured else self.cost.plain_tokens_per_s

    @property
    def kv(self) -> KvSequence:
        """The slot the latest request took."""
        return self.slots.latest

    @property
    def vocab(self) -> Vocabulary:
        return self.target.vocab

    @property
    def chat_template(self) -> str:
        return self.template.text

    def slot_tokens(self) -> list[int]:
        return [len(slot.tokens) for slot in self.slots]

    def slots_busy(self) -> list[bool]:
        return [slot.busy for slot in self.slots]

    def chat_tokens(self, messages: Sequence[Message], tools: Sequence[dict] | None = None) -> list[int]:
        return self.template.tokens(self.target.vocab, messages, tools)

    # ------------------------------------------------------------------ generation

    def chat(self, messages: Sequence[Message], *, max_tokens: int = 512, sampling: SamplingSettings | None = None,
             drafter: str | None = None, draft_len: int | None | str = "default", stop: Sequence[str] = (),
             cancel: threading.Event | None = None) -> Iterator[Event]:
        return self.generate(self.chat_tokens(messages), max_tokens=max_tokens, sampling=sampling, drafter=drafter,
                             draft_len=draft_len, stop=stop, cancel=cancel)

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 512,
                 sampling: SamplingSettings | None = None, drafter: str | None = None,
                 draft_len: int | None | str = "default", stop: Sequence[str] = (),
                 cancel: threading.Event | None = None) -> Iterator[Event]:
        """Prefill, then one Round per draft/verify step, then a Summary: the request submitted, and the
        core stepped (with whatever else was submitted) until it ends."""
        request = self._request(prompt, max_tokens, sampling, drafter, draft_len, stop, cancel)
        return self._generate(request)

    def _generate(self, request: Request) -> Iterator[Event]:
        inbox = Inbox()
        lane = None
        self._hold()
        try:
            lane = self.core.add(request, self._planner(request), inbox, iterated=True)
            yield from self.core.events([lane], inbox)
        except BaseException:
            if inbox.failure is None:  # (its own evaluation failed: the others go on)
                self.core.drop()  # they cannot go on without it
            raise
        finally:
            request.close()
            if lane is not None:
                self.core.remove(lane)
            self._let_go()

    def generate_many(self, prompt: str | Sequence[int], samplings: Sequence[SamplingSettings], *,
                      max_tokens: int = 512, stop: Sequence[str] = (), drafter: str | None = None,
                      cancel: threading.Event | None = None,
                      cancels: Sequence[threading.Event] | None = None) -> Iterator[tuple[int, Event]]:
        """One completion of `prompt` per sampling setting (llama.cpp's n_cmpl, OpenAI's n), decoded
        together without drafts: (which completion, event), each completion's events those of
        `generate`. More completions than free slots run in groups, one group after another; with a
        single free slot they run one after another with `drafter`. `cancel` ends them all, `cancels`
        (one per completion) each."""
        requests = self._requests(prompt, samplings, max_tokens, stop, drafter, cancels)
        return self._many(requests, cancel or threading.Event())

    def _many(self, requests: list[Request], everyone: threading.Event) -> Iterator[tuple[int, Event]]:
        self._hold()
        try:
            width = self.free_slots()
            if width == 0:
                raise LocalspecError("No KV slot is free for another request.")
            for first in range(0, len(requests), width):
                group, inbox = requests[first:first + width], Inbox()

                def deliver(i: int, first: int = first, inbox: Inbox = inbox) -> Deliver:
                    return lambda event: inbox(event if isinstance(event, Exception) else (first + i, event))

                lanes: list[Lane] = []
                try:
                    lanes = self._add_group(group, deliver, everyone, iterated=True)
                    yield from self.core.events(lanes, inbox, only=lanes)
                finally:
                    for lane in lanes:
                        self.core.remove(lane)
                    for request in group:
                        request.close()  # its slot is free for the next group
        finally:
            for request in requests:
                request.close()
            self._let_go()

    def submit(self, prompt: str | Sequence[int], deliver: Deliver, *, max_tokens: int = 512,
               sampling: SamplingSettings | None = None, drafter: str | None = None,
               draft_len: int | None | str = "default", stop: Sequence[str] = (),
               cancel: threading.Event | None = None, urgent: bool = False) -> Lane:
        """A request added to the core: decoded in its steps from the next on (`step`), its events handed
        to `deliver` (or the exception that ended it, where its own evaluation failed: the others go
        on); `cancel` ends it at the next step. The first request takes the engine; the others come
        from the thread stepping it. An `urgent` one (an editor's completion) drafts copies and the
        history only: the draft model's sequences stay as the others left them. Raises LocalspecError for
        a request the engine refuses, or when no slot is free."""
        request = self._request(prompt, max_tokens, sampling, drafter, draft_len, stop, cancel)
        self._hold()
        try:
            return self.core.add(request, self._planner(request, self._side if urgent else self.drafting), deliver)
        finally:
            self._let_go()

    def submit_group(self, prompt: str | Sequence[int], samplings: Sequence[SamplingSettings],
                     deliver: Callable[[int], Deliver], *, max_tokens: int = 512, stop: Sequence[str] = (),
                     drafter: str | None = None, cancel: threading.Event | None = None,
                     cancels: Sequence[threading.Event] | None = None) -> list[Lane]:
        """Completions of one prompt added to the core (at most one per free slot), as `generate_many`
        decodes them; `deliver(i)` takes the i-th one's events."""
        requests = self._requests(prompt, samplings, max_tokens, stop, drafter, cancels)
        if len(requests) > self.free_slots():
            for request in requests:
                request.close()
            raise LocalspecError("No KV slot is free for another request.")
        self._hold()
        try:
            return self._add_group(requests, deliver, cancel or threading.Event())
        finally:
            self._let_go()

    def step(self, only: Sequence[Lane] | None = None) -> bool:
        """One step of the core (`only` those lanes, else every one); False once none is left (the engine
        is free again)."""
        try:
            self.core.step(only)
        except BaseException:
            self.core.drop()
            raise
        finally:
            self._let_go()
        return bool(self.core)

    def _add_group(self, group: list[Request], deliver: Callable[[int], Deliver], everyone: threading.Event,
                   iterated: bool = False) -> list[Lane]:
        """Completions of one prompt in the core: alone, one with its planner, as `generate`; else the
        prompt evaluated once into the first one's slot and copied to the others', without drafts."""
        if len(group) == 1:
            return [self.core.add(group[0], self._planner(group[0]), deliver(0), everyone=everyone, iterated=iterated)]
        lead = self.core.add(group[0], None, deliver(0), everyone=everyone, iterated=iterated)
        return [lead] + [self.core.add(request, None, deliver(i), everyone=everyone, follows=lead, iterated=iterated)
                         for i, request in enumerate(group[1:], 1)]

    def _requests(self, prompt: str | Sequence[int], samplings: Sequence[SamplingSettings], max_tokens: int,
                  stop: Sequence[str], drafter: str | None,
                  cancels: Sequence[threading.Event] | None) -> list[Request]:
        if not samplings:
            raise LocalspecError("Ask for at least one completion.")
        each = list(cancels) if cancels is not None else [threading.Event() for _ in samplings]
        return [self._request(prompt, max_tokens, sampling, drafter, "default", stop, own)
                for sampling, own in zip(samplings, each, strict=True)]

    def _request(self, prompt: str | Sequence[int], max_tokens: int, sampling: SamplingSettings | None,
                 drafter: str | None, draft_len: int | None | str, stop: Sequence[str],
                 cancel: threading.Event | None) -> Request:
        """A request checked before it takes the engine (request.check)."""
        return check(self.target, self.drafters, prompt, max_tokens=max_tokens, sampling=sampling or SamplingSettings(),
                     mode=drafter or self.options.drafter, draft_len=draft_len, default_len=self.options.draft_len,
                     stop=stop, cancel=cancel or threading.Event())

    @property
    def concurrent(self) -> bool:
        """Whether requests can be decoded side by side (`submit` while others run): a KV slot each."""
        return len(self.slots) > 1

    def _hold(self) -> None:
        """The engine for this thread's requests: taken by the first, shared by those it steps with."""
        if self.core:
            if self._owner != threading.get_ident():
                raise LocalspecError("This engine is already generating; one generation at a time.")
            return
        self._acquire()
        self._owner = threading.get_ident()

    def _let_go(self) -> None:
        """Free once no request is left in the core."""
        if not self.core and self._owner is not None:
            self._owner = None
            self._lock.release()

    def _acquire(self) -> None:
        if not self._lock.acquire(blocking=False):
            if not self._maintaining:
                raise LocalspecError("This engine is already generating; one generation at a time.")
            self._make_way.set()  # maintenance lets go within one calibration batch
            try:
                if not self._lock.acquire(timeout=30):
                    raise LocalspecError("The engine is busy measuring its costs; try again.")
            finally:
                self._make_way.clear()

    def free_slots(self) -> int:
        """KV slots no request is generating on."""
        return len(self.slots.free())

    def _planner(self, request: Request, drafting: Drafting | None = None) -> Planner:
        """The request's own planner, from the engine's drafting (or the urgent requests')."""
        return (drafting or self.drafting).planner(request.prompt, request.mode, request.fixed, request.max_tokens,
                                                   request.sampling.replayable)

    def planner_for(self, mode: str, fixed: int | None, budget: int = 512, replayable: bool = False,
                    prompt: Sequence[int] = ()) -> Planner:
        """A planner for a request with these settings (what `generate` makes for each request)."""
        return self.drafting.planner(prompt, mode, fixed, budget, replayable)

    def _learn(self, step: Step, context_len: int) -> None:
        """What a round tells the calibration: a plain round's decode time, the learnt speed factor."""
        if self.calibrator is None:
            return
        if not step.draft.tokens:
            self.calibrator.observe_plain(context_len, step.verify_s)
        self.calibrator.observe_scale(self.cost.scale)

    # ------------------------------------------------------------------ between requests

    def maintain(self, interrupt=lambda: False) -> str:
        """Between requests, never during an answer: measure the target's verify costs again when its
        calibration is due (untrusted at load, or contradicted by live rounds) and the machine is quiet.
        `interrupt` is asked between calibration batches; a request that arrives meanwhile stops it too
        (generate waits for it to let go). Returns what was done, "" when nothing."""
        calibrator = self.calibrator
        if calibrator is None or not (why := calibrator.due):
            return ""
        self._maintaining = True
        if not self._lock.acquire(blocking=False):
            self._maintaining = False
            return ""
        measured = calibrator.measurements
        try:
            fresh = calibrator.remeasure(self.cost.scale, interrupt=lambda: self._make_way.is_set() or interrupt())
        except Interrupted:
            fresh = None
        finally:
            if calibrator.measurements != measured:
                self.slots[0].reset()  # measuring used (and emptied) sequence 0
            self._maintaining = False
            self._lock.release()
        if fresh is None:
            return ""
        self.cost.recalibrate(fresh.costs, calibrator.reference_scale)
        return f"measured the target's verify costs again: {why}"

    # ------------------------------------------------------------------ lifetime

    def reset(self) -> None:
        """Forget the cached prompt (the next generation evaluates its whole prompt)."""
        for slot in self.slots:
            slot.reset()
        for drafter in self._drafters:
            drafter.reset()

    def close(self) -> None:
        for drafter in self._drafters:
            drafter.close()
        for model in (self.self_draft, self.draft, self.target):
            if model is not None:
                model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_served: type[ServedEngine] = Engine  # the contract every front door relies on, checked by mypy

__all__ = ["Engine", "EngineOptions", "SamplingSettings"]

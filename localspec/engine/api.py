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
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from localspec.engine.adaptive import CostModel
from localspec.engine.calibration import Calibrator, Interrupted
from localspec.engine.constraint import Constraint, check_size, trigger_token
from localspec.engine.contract import ServedEngine, available_drafters, unavailable_drafter
from localspec.engine.drafters import CopyDrafter, Drafter, Sources, build
from localspec.engine.answer import Answer
from localspec.engine.events import Event, Prefill
from localspec.engine.kv import KvSequence
from localspec.engine.model import LanguageModel, PredictionHead, Vocabulary
from localspec.engine.core import Core
from localspec.engine.parallel import Lane, prompt_chunk
from localspec.engine.request import Request
from localspec.engine.sampling import InfillVocab, Sampler, SamplingSettings
from localspec.engine.session import ChatTemplate, Message
from localspec.engine.slots import Slots
from localspec.engine.speculative import Drafting, Planner, Step, speculative_round
from localspec.engine.speedup import PlainRounds, SpeedupMeter
from localspec.errors import ContextOverflowError, LocalspecError


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
        # Interjections draft copies of their own context and the history (each request has its own turn
        # of it; their answers are recorded, so an editor's repeated completion replays), not the draft
        # model: the waiting generation's draft sequence stays as it was.
        history = [d for d in self._drafters if d.name == "history"]
        self._side = Drafting(self.cost, [CopyDrafter(target.vocab.is_control), *history],
                              learn_costs=opts.learn_costs, plain_wanted=self.plain_rounds.wanted,
                              queued=lambda: self.queued())
        self._current: Request | None = None  # the generation holding the engine
        self._paused_on: int | None = None    # the thread consuming it, while it waits between rounds
        # Every request being generated is a lane of the core's one step loop (engine/core.py).
        self.core = Core(self._solo_round, chunk=lambda rows: prompt_chunk(rows, self.cost.verify, target.n_batch),
                         estimate_tokens_per_s=lambda: self.cost.plain_tokens_per_s)
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

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 512,
        sampling: SamplingSettings | None = None,
        drafter: str | None = None,
        draft_len: int | None | str = "default",
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        interject: bool = False,
    ) -> Iterator[Event]:
        """Prefill, then one Round per draft/verify step, then a Summary. With `interject`, a short
        request run while the current generation waits between two rounds (see `_interjection`)."""
        request = self._request(prompt, max_tokens, sampling or SamplingSettings(), drafter or self.options.drafter,
                                draft_len, stop, cancel or threading.Event(), interject)
        return self._interjection(request) if interject else self._generate(request)

    def generate_many(self, prompt: str | Sequence[int], samplings: Sequence[SamplingSettings], *,
                      max_tokens: int = 512, stop: Sequence[str] = (), drafter: str | None = None,
                      cancel: threading.Event | None = None, cancels: Sequence[threading.Event] | None = None,
                      interject: bool = False) -> Iterator[tuple[int, Event]]:
        """One completion of `prompt` per sampling setting (llama.cpp's n_cmpl, OpenAI's n), decoded
        together (engine/parallel.py, no drafts): (which completion, event), each completion's events
        those of `generate`. More completions than free slots run in groups, one group after another;
        with a single free slot they run one after another with `drafter`. `cancel` ends them all,
        `cancels` (one per completion) each."""
        if not samplings:
            raise LocalspecError("Ask for at least one completion.")
        everyone = cancel or threading.Event()
        each = list(cancels) if cancels is not None else [threading.Event() for _ in samplings]
        mode = drafter or self.options.drafter
        requests = [self._request(prompt, max_tokens, sampling, mode, "default", stop, own, interject)
                    for sampling, own in zip(samplings, each, strict=True)]
        return self._many(requests, everyone, interject)

    def _request(self, prompt: str | Sequence[int], max_tokens: int, sampling: SamplingSettings, mode: str,
                 draft_len: int | None | str, stop: Sequence[str], cancel: threading.Event,
                 interject: bool) -> Request:
        """A request checked before it takes the engine (a bad one is refused with a clear message)."""
        problem = unavailable_drafter(mode, self.drafters)
        if problem:
            raise LocalspecError(problem)
        if isinstance(draft_len, str) and draft_len != "default":
            raise LocalspecError(f"draft_len must be a number of tokens, none, or 'default' (got '{draft_len}').")
        fixed = self.options.draft_len if isinstance(draft_len, str) else draft_len
        tokens = list(prompt) if not isinstance(prompt, str) else self.target.vocab.tokenize(prompt, add_special=True)
        if not tokens:
            raise LocalspecError("The prompt is empty.")
        outside = [t for t in tokens if not 0 <= t < self.target.n_vocab]
        if outside:  # llama.cpp would fail the decode (or read out of bounds) on it
            raise LocalspecError(f"Token id {outside[0]} is outside this model's vocabulary (0 to "
                                 f"{self.target.n_vocab - 1}).")
        if max_tokens < 1:
            raise LocalspecError("max_tokens must be at least 1.")
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"The prompt is {len(tokens)} tokens but the context window holds {self.n_ctx}. "
                "Shorten the prompt or the conversation, or load the model with a larger context (--ctx)."
            )
        if interject and not self.interjects:
            raise LocalspecError("This engine has one KV slot; nothing can run beside a generation.")
        # A grammar that does not parse is refused here, before the request takes the engine.
        constraint = self._constraint(sampling)
        return Request(tokens, max_tokens, sampling, mode, fixed, tuple(stop), cancel, constraint)

    def _constraint(self, sampling: SamplingSettings) -> Constraint | None:
        """The request's grammar state. A lazy grammar (tool_choice auto) needs its trigger to be one
        token (Vocabulary.grammar); where it is several, the answer stays free text (as without it)."""
        if sampling.grammar is None:
            return None
        check_size(sampling.grammar)
        trigger, vocab = sampling.grammar_trigger, self.target.vocab
        if trigger is not None and trigger_token(vocab, trigger) is None:
            return None
        return vocab.grammar(sampling.grammar, trigger)

    @property
    def interjects(self) -> bool:
        """Whether a short request can run between the rounds of a generation (`generate(interject=True)`):
        it needs a KV slot of its own."""
        return len(self.slots) > 1

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

    def _generate(self, request: Request) -> Iterator[Event]:
        self._acquire()
        self._current = request
        inbox = _Inbox()
        lane = None
        try:
            lane = self._open(request, self._planner(request), inbox)
            for event in self._drive([lane], inbox):
                self._paused_on = threading.get_ident()  # between rounds: an interjection may run now
                yield event
                self._paused_on = None
        except BaseException:
            if inbox.failure is None:  # (its own evaluation failed: the lanes that joined it go on)
                self.core.drop()  # they cannot go on without it
            raise
        finally:
            self._paused_on = None
            self._current = None
            request.close()
            if lane is not None:
                self.core.remove(lane)
            if not self.core:  # (lanes left: the engine is theirs until step_guests says it is free)
                self._lock.release()

    def _interjection(self, request: Request) -> Iterator[Event]:
        """A short request run to its end while the current generation waits between two rounds (its
        consumer, on the same thread, is not asking for the next one): a lane the core steps alone, on
        another KV slot, drafting copies and the history with a planner of its own (the waiting
        generation's turns and the draft model's cache stay as they were); costs and measured plain
        rounds are shared."""
        self._waiting_generation()
        inbox = _Inbox()
        lane = None
        try:
            lane = self._open(request, self._planner(request, self._side), inbox)
            yield from self._drive([lane], inbox, only=[lane])
        finally:
            if lane is not None:
                self.core.remove(lane)
            self._paused_on = threading.get_ident()
            request.close()

    def _drive(self, lanes: list[Lane], inbox: "_Inbox", only: list[Lane] | None = None) -> Iterator:
        """Step the core (`only` those lanes, else all) until `lanes` are retired, yielding what they get."""
        while True:
            while inbox.items:
                yield inbox.items.popleft()
            if inbox.failure is not None:
                raise inbox.failure
            if not any(lane is held for lane in lanes for held in self.core.lanes):
                return
            self.core.step(only)

    def _open(self, request: Request, planner: Planner | None, deliver: Callable[[Event | Exception], None],
              everyone: threading.Event | None = None) -> Lane:
        """The request's prompt into a free slot at once, then its lane in the core (its Prefill delivered).
        The lanes already there wait meanwhile."""
        t0 = time.perf_counter()
        prefill = self._prefill(request, planner, t0)
        for other in self.core.lanes:
            other.request.waited_s += prefill.seconds
        lane = self._lane(request, prefill, t0, deliver=deliver, everyone=everyone)
        lane.planner, lane.iterated = planner, True
        self.core.add(lane)
        return lane

    def _waiting_generation(self) -> Request:
        """The generation an interjection runs beside (it waits between two rounds, on this thread)."""
        current = self._current
        if current is None or current.kv is None or self._paused_on != threading.get_ident():
            raise LocalspecError("An interjection runs only between two rounds of a generation, on its thread.")
        self._paused_on = None  # no interjection inside this one
        return current

    def _many(self, requests: list[Request], everyone: threading.Event,
              interject: bool) -> Iterator[tuple[int, Event]]:
        current = self._waiting_generation() if interject else None
        if current is None:
            self._acquire()
        try:
            width = self.free_slots()  # (not the waiting generation's, nor those of requests that joined it)
            if width == 0:
                raise LocalspecError("No KV slot is free for another request.")
            for first in range(0, len(requests), width):
                group = requests[first:first + width]
                inbox = _Inbox()
                lanes: list[Lane] = []
                try:
                    lanes = self._open_group(group, first, everyone, inbox, self._side if current else self.drafting)
                    yield from self._drive(lanes, inbox, only=lanes)
                finally:
                    for lane in lanes:
                        self.core.remove(lane)
                    for request in group:
                        request.close()  # its slot is free for the next group
        finally:
            for request in requests:
                request.close()
            if current is None:
                self._lock.release()
            else:
                self._paused_on = threading.get_ident()

    def _open_group(self, group: list[Request], first: int, everyone: threading.Event, inbox: "_Inbox",
                    drafting: Drafting) -> list[Lane]:
        """The lanes of a group of completions of one prompt, one free slot each. One alone drafts with its
        own planner, as `generate` would; several share the prompt, evaluated into the slot holding most
        of it and copied to the others, and decode together without drafts (each draws as alone)."""
        def deliver(i: int) -> Callable[[Event | Exception], None]:
            return lambda event: inbox(event if isinstance(event, Exception) else (first + i, event))

        if len(group) == 1:
            return [self._open(group[0], self._planner(group[0], drafting), deliver(0), everyone)]
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
            lanes.append(self._lane(request, prefill if i == 0 else shared, t0, deliver=deliver(i), everyone=everyone))
            lanes[-1].iterated = True
            self.core.add(lanes[-1])
        return lanes

    def join(self, prompt: str | Sequence[int], deliver: Callable[[Event | Exception], None], *, max_tokens: int = 512,
             sampling: SamplingSettings | None = None, stop: Sequence[str] = (),
             cancel: threading.Event | None = None, drafter: str | None = None) -> None:
        """A request decoded together with the running generation from its next step on: called between
        two of its rounds on the thread consuming it (as an interjection is), or once it has ended, between
        two `step_guests`. It takes a free slot now; its prompt is evaluated in chunks within the
        following steps (engine/parallel.py); its events go to `deliver` (its Prefill once its prompt is
        in), its rounds from inside the running generation's steps. It drafts with `drafter` and a
        planner of its own: lookups priced for the shared step while several share it
        (engine/parallel.py), the draft model too once it is the last one left after the generation
        ended (the core's one-lane step). Raises LocalspecError for a request the engine refuses, or when no
        slot is free."""
        request = self._request(prompt, max_tokens, sampling or SamplingSettings(), drafter or self.options.drafter,
                                "default", stop, cancel or threading.Event(), False)
        current = self._current
        paused = current is not None and self._paused_on == threading.get_ident()
        if not (paused or (current is None and self.core)):
            request.close()
            raise LocalspecError("A request joins only between two rounds of a generation, on its thread.")
        if not self.free_slots():
            request.close()
            raise LocalspecError("No KV slot is free for another request.")
        t0 = time.perf_counter()
        try:
            request.kv, cached = self.slots.place(request.prompt)
        except BaseException:
            request.close()
            raise
        lane = self._lane(request, None, t0, deliver=deliver, cached=cached)
        lane.planner = self._planner(request)
        self.core.add(lane)
        if paused and current is not None:
            current.waited_s += time.perf_counter() - t0

    def step_guests(self) -> bool:
        """One step of the requests that joined a generation that has ended (each `join` may add one
        between two steps). False once none is left: the engine is free again."""
        if self._current is not None or not self.core:
            return False
        try:
            self.core.step()
        except BaseException:
            self.core.drop()
            raise
        finally:
            if not self.core:
                self._lock.release()
        return bool(self.core)

    def _solo_round(self, lane: Lane) -> Step | None:
        """A lane's speculative round on its own sequence (the core's one-lane step), with its own planner,
        the draft model included (when it is the only lane stepped, nothing else uses the draft model's
        cache meanwhile). None when its context is full."""
        assert lane.planner is not None
        step = speculative_round(lane.kv, lane.context, lane.planner, lane.sampler, lane.request.constraint)
        if step is not None:
            self._learn(step, len(lane.context) - step.accepted - 1)
        return step

    @property
    def joins(self) -> bool:
        """Whether a request can join a running generation (`join`): it needs a KV slot of its own."""
        return len(self.slots) > 1

    def free_slots(self) -> int:
        """KV slots no request is generating on."""
        return len(self.slots.free())

    def _planner(self, request: Request, drafting: Drafting | None = None) -> Planner:
        """The request's own planner, from the engine's drafting (or the interjections')."""
        return (drafting or self.drafting).planner(request.prompt, request.mode, request.fixed, request.max_tokens,
                                                   request.sampling.replayable)

    def planner_for(self, mode: str, fixed: int | None, budget: int = 512, replayable: bool = False,
                    prompt: Sequence[int] = ()) -> Planner:
        """A planner for a request with these settings (what `generate` makes for each request)."""
        return self.drafting.planner(prompt, mode, fixed, budget, replayable)

    def _lane(self, request: Request, prefill: Prefill | None, t0: float, *,
              everyone: threading.Event | None = None,
              deliver: Callable[[Event | Exception], None] | None = None, cached: int = 0) -> Lane:
        """A request's sequence: its slot, context, sampler and answer (time to its first token counted
        from `t0`); `everyone` cancels its group. Without `prefill`, its prompt is evaluated within shared
        steps (its slot held `cached` of it)."""
        assert request.kv is not None  # (set by _prefill)
        meter = SpeedupMeter(self.plain_rounds, lambda: self.cost.verify(1))
        return Lane(request, request.kv, list(request.prompt),
                    Sampler(request.sampling, self._infill_vocab()),
                    Answer(self.target.vocab, request.max_tokens, request.stop, meter, t0),
                    everyone or request.cancel, prefill, cached, deliver=deliver)

    def _learn(self, step: Step, context_len: int) -> None:
        """What a round tells the calibration: a plain round's decode time, the learnt speed factor."""
        if self.calibrator is None:
            return
        if not step.draft.tokens:
            self.calibrator.observe_plain(context_len, step.verify_s)
        self.calibrator.observe_scale(self.cost.scale)

    def _infill_vocab(self) -> InfillVocab:
        vocab = self.target.vocab
        return InfillVocab(is_eog=vocab.is_eog, piece=vocab.token_bytes, eot=vocab.eot if vocab.eot >= 0 else vocab.eos)

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


class _Inbox:
    """What the core delivers to the lanes an iterator yields for: their events, or the failure of their
    own evaluation (which ends them and no one else)."""

    def __init__(self) -> None:
        self.items: deque = deque()
        self.failure: Exception | None = None

    def __call__(self, item) -> None:
        if isinstance(item, Exception):
            self.failure = item
        else:
            self.items.append(item)


_served: type[ServedEngine] = Engine  # the contract every front door relies on, checked by mypy

__all__ = ["Engine", "EngineOptions", "SamplingSettings"]

"""The engine every front door uses: load a target (and a draft), then `generate` or `chat`.

    from localspec import load
    engine = load("qwen2.5-coder-1.5b")          # a catalog pair, or paths: load("t.gguf", draft="d.gguf")
                                                  # (localspec.loader resolves ids, then calls load_files)
    for event in engine.chat([{"role": "user", "content": "Reverse a list in Python"}]):
        ...                                       # Prefill, then one Round per step, then a Summary
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterator, Sequence

from localspec.engine.adaptive import CostModel
from localspec.engine.calibration import Calibrator, remeasure_if_due
from localspec.engine.contract import ServedEngine, available_drafters
from localspec.engine.core import Core, Deliver
from localspec.engine.driver import Driver, Pull
from localspec.engine.drafters import CopyDrafter, Drafter, Sources, build
from localspec.engine.drafters.respelling import Respelling
from localspec.engine.events import Event
from localspec.engine.kv import KvSequence
from localspec.engine.model import BlockHead, LanguageModel, PredictionHead, Vocabulary
from localspec.engine.options import EngineOptions, plain_only_warning
from localspec.engine.parallel import Lane
from localspec.engine.params import GenerationParams
from localspec.engine.planner import Drafting, Planner
from localspec.engine.request import Request, check
from localspec.engine.sampling import SamplingSettings
from localspec.engine.session import NO_PROJECTOR, ChatTemplate, Message
from localspec.engine.slots import Slots
from localspec.engine.speculative import Step
from localspec.engine.speedup import PlainRounds
from localspec.errors import LocalspecError


class Engine:
    """A target model, an optional draft model, and the loop between them: every request a lane of one
    engine core, and every call into the core on the engine's one thread (engine/driver.py)."""

    def __init__(self, target: LanguageModel, draft: LanguageModel | None = None, options: EngineOptions | None = None,
                 *, cost: CostModel | None = None, draft_cost_s: float | None = None,
                 template: ChatTemplate | None = None, self_draft: LanguageModel | None = None,
                 history_file: Path | None = None, eagle3: PredictionHead | None = None,
                 dflash: BlockHead | None = None, assistant: PredictionHead | None = None):
        self.target = target
        self.draft = draft
        self.self_draft = self_draft
        self.options = options or EngineOptions()
        # The one thread that calls into the models, from their first measurement on: llama.cpp's CPU
        # threads are a team per thread that decodes, and a second team in one process slows both.
        self.driver = Driver()
        self.slots = Slots(target, self.options.cache_reuse)  # the target's KV sequences (engine/slots.py)
        # The target's verify costs: given (tests), or calibrated (trusted cache, or measured now and
        # measured again between requests while untrusted or contradicted: engine/calibration.py).
        self.calibrator = None if cost is not None else self.driver.run(
            lambda: Calibrator(target, self.options.calibrate))
        steady, changed = self.calibrator.current.tables() if self.calibrator else ({}, None)
        self.cost = cost or CostModel(verify_s=steady, changed_s=changed)
        self.plain_rounds = PlainRounds()  # what plain decoding measured here: the speedup's baseline
        opts = self.options
        self._drafters: list[Drafter] = self.driver.run(lambda: build(Sources(
            target=target, draft=draft, self_draft=self_draft, eagle3=eagle3, dflash=dflash, assistant=assistant,
            p_min=opts.draft_p_min,
            calibrate=opts.calibrate,
            learn_costs=opts.learn_costs, draft_cost_s=draft_cost_s, history=opts.history_drafts,
            history_file=history_file, tree_leaves=opts.tree_leaves)))
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
        copies = CopyDrafter(target.vocab.is_control, respelling=Respelling.of(target.vocab))
        self._side = Drafting(self.cost, [copies, *history],
                              learn_costs=opts.learn_costs, plain_wanted=self.plain_rounds.wanted,
                              queued=lambda: self.queued())
        # Every request being generated is a lane of the core's one step loop (engine/core.py).
        self.core = Core(target, self.slots, self.cost, self.plain_rounds, learn=self._learn)
        # Readers pull (every lane steps while one waits); a server's scheduler drives the driver with
        # its own policy beside them.
        self._pull = self.driver.readers = Pull(self.driver, self._step, self.core.__bool__)
        self.load_warnings: list[str] = []  # what the loader met and the user should hear (files.load_files)

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
        warnings = [d.warning for d in self._drafters if d.warning] + self.load_warnings
        if self.target.max_rollback == 0 and self.options.drafter != "none":
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
        return self.template.tokens(self.target.vocab, messages, tools, media=self.projector)

    @property
    def sees_images(self) -> bool:
        return self.projector is not None

    @property
    def projector(self):
        """What turns images into the target's input (backend/vision.py), or None: a text-only model."""
        return self.target.projector

    def image_tokens(self, text: str, images: Sequence[bytes]) -> list[int]:
        """A raw prompt with images, one MEDIA_MARKER where each stands (special tokens parsed)."""
        if self.projector is None:
            raise LocalspecError(NO_PROJECTOR)
        return self.projector.tokenize(text, images)

    # ------------------------------------------------------------------ generation

    def chat(self, messages: Sequence[Message], *, max_tokens: int = 512, sampling: SamplingSettings | None = None,
             drafter: str | None = None, draft_len: int | None | str = "default", stop: Sequence[str] = (),
             cancel: threading.Event | None = None, draft_max: int | None = None,
             draft_min: int = 0) -> Iterator[Event]:
        return self.generate(self.chat_tokens(messages), max_tokens=max_tokens, sampling=sampling, drafter=drafter,
                             draft_len=draft_len, stop=stop, cancel=cancel, draft_max=draft_max, draft_min=draft_min)

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 512,
                 sampling: SamplingSettings | None = None, drafter: str | None = None,
                 draft_len: int | None | str = "default", stop: Sequence[str] = (),
                 cancel: threading.Event | None = None, draft_max: int | None = None,
                 draft_min: int = 0) -> Iterator[Event]:
        """Prefill, then one Round per draft/verify step, then a Summary: the request added to the core
        at the first `next`, stepped with whatever else is in it (from any thread) while this reader
        waits. No draft is longer than `draft_max` (0: none at all) nor shorter than `draft_min`."""
        params = GenerationParams.one(sampling, max_tokens=max_tokens, stop=tuple(stop), drafter=drafter,
                                      draft_len=draft_len, draft_max=draft_max, draft_min=draft_min)
        requests = self._requests(prompt, params, [0], [cancel or threading.Event()])
        return (event for _, event in self._read(requests, [0], requests[0].cancel))

    def generate_many(self, prompt: str | Sequence[int], samplings: Sequence[SamplingSettings], *,
                      max_tokens: int = 512, stop: Sequence[str] = (), drafter: str | None = None,
                      cancel: threading.Event | None = None,
                      cancels: Sequence[threading.Event] | None = None) -> Iterator[tuple[int, Event]]:
        """One completion of `prompt` per sampling setting (llama.cpp's n_cmpl, OpenAI's n), decoded
        together without drafts: (which completion, event), each completion's events those of
        `generate`. More completions than free slots run in waves, one after another; with a
        single free slot they run one after another with `drafter`. `cancel` ends them all, `cancels`
        (one per completion) each."""
        params = GenerationParams(max_tokens, tuple(samplings), tuple(stop), drafter)
        requests = self._requests(prompt, params, range(params.n), cancels)
        return self._waves(requests, cancel or threading.Event())

    def _waves(self, requests: list[Request], everyone: threading.Event) -> Iterator[tuple[int, Event]]:
        try:
            width = self.driver.run(self.free_slots)
            if width == 0:
                raise LocalspecError("No KV slot is free for another request.")
            for first in range(0, len(requests), width):
                wave = requests[first:first + width]
                yield from self._read(wave, range(first, first + len(wave)), everyone)
        finally:
            for request in requests:
                request.close()

    def _read(self, requests: list[Request], sequences: Sequence[int],
              everyone: threading.Event) -> Iterator[tuple[int, Event]]:
        """The `requests` (those `sequences` of one prompt) added to the core, and their events read as
        the driver steps it: (sequence, event) until each has its Summary; the failure that ended them is
        raised. A reader that stops early lets go of its lanes at once (their slots free)."""
        reader = self._pull.reader()

        def each(i: int) -> Deliver:
            return lambda item: reader(item if isinstance(item, Exception) else (sequences[i], item))

        lanes: list[Lane] = []
        try:
            lanes = self.driver.run(lambda: self.core.add_sequences(requests, self._planner, each, everyone,
                                                                    iterated=True))
            yield from reader.answers(len(lanes))
        finally:
            self.driver.run(lambda: self._let_go(lanes, requests))

    def _let_go(self, lanes: Sequence[Lane], requests: Sequence[Request]) -> None:
        for lane in lanes:
            self.core.remove(lane)
        for request in requests:
            request.close()

    def submit(self, prompt: str | Sequence[int], params: GenerationParams,
               deliver: Callable[[tuple[int, Event] | Exception], None], *,
               cancel: threading.Event | None = None, cancels: Sequence[threading.Event] | None = None,
               sequences: Sequence[int] | None = None, urgent: bool = False) -> list[Lane]:
        """A request's `sequences` (of its `params.n`; all by default) added to the core: decoded in its
        steps from the next on (`step`), each one's events handed to `deliver` as (sequence, event), or
        the exception that ended them where their own evaluation failed (the others go on); `cancel`
        ends them all at the next step, `cancels` (one per sequence) each. Several sequences share the
        prompt: evaluated once into the first one's slot and copied, decoded without drafts (each
        draws as alone would). Runs on the driver's thread (the caller waits). An `urgent` one (an
        editor's completion) drafts copies and the history only: the draft model's sequences stay as
        the others left them. Raises LocalspecError for a request the engine refuses, or for more
        sequences than free slots."""
        chosen = list(range(params.n) if sequences is None else sequences)
        requests = self._requests(prompt, params, chosen, cancels)
        drafting = self._side if urgent else self.drafting

        def each(i: int) -> Deliver:
            return lambda item: deliver(item if isinstance(item, Exception) else (chosen[i], item))

        def add() -> list[Lane]:
            if len(requests) > self.free_slots():
                raise LocalspecError("No KV slot is free for another request.")
            return self.core.add_sequences(requests, lambda request: self._planner(request, drafting), each,
                                           cancel or threading.Event())

        try:
            return self.driver.run(add)
        except BaseException:
            for request in requests:
                request.close()
            raise

    def step(self, only: Sequence[Lane] | None = None) -> bool:
        """One step of the core (`only` those lanes, else every one), on the driver's thread; False once
        none is left. A failure no lane survives is handed to every lane, then raised."""
        return self.driver.run(lambda: self._step(only))

    def _step(self, only: Sequence[Lane] | None = None) -> bool:
        try:
            self.core.step(only)
        except BaseException as exc:
            self.core.drop(exc if isinstance(exc, Exception) else None)
            raise
        return bool(self.core)

    def abort(self, lane: Lane) -> None:
        """The lane ends (its summary says "cancelled") at the next step that takes it."""
        self.core.abort(lane)

    def _requests(self, prompt: str | Sequence[int], params: GenerationParams, sequences: Sequence[int],
                  cancels: Sequence[threading.Event] | None) -> list[Request]:
        """The request's `sequences`, each checked before it takes the engine (request.check); each
        sequence's cancel its own of `cancels`."""
        tokens = self.target.vocab.tokenize(prompt, add_special=True) if isinstance(prompt, str) else prompt
        return [check(self.target, self.drafters, tokens, params, seq, self.options,
                      cancels[seq] if cancels is not None else threading.Event())
                for seq in sequences]

    @property
    def concurrent(self) -> bool:
        """Whether requests can be decoded side by side (`submit` while others run): a KV slot each."""
        return len(self.slots) > 1

    def free_slots(self) -> int:
        """KV slots no request is generating on."""
        return len(self.slots.free())

    def _planner(self, request: Request, drafting: Drafting | None = None) -> Planner:
        """The request's own planner, from the engine's drafting (or the urgent requests')."""
        return (drafting or self.drafting).planner(request.prompt, request.mode, request.fixed, request.max_tokens,
                                                   request.sampling.replayable, request.longest, request.shortest)

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
        (it waits for the batch being measured). Returns what was done, "" when nothing."""
        def measure() -> str:
            if self.core:
                return ""
            return remeasure_if_due(self.calibrator, self.cost, self.slots[0].reset,
                                    lambda: interrupt() or self.driver.pending)

        return self.driver.run(measure)

    # ------------------------------------------------------------------ lifetime

    def reset(self) -> None:
        """Forget the cached prompt (the next generation evaluates its whole prompt)."""
        def forget() -> None:
            for slot in self.slots:
                slot.reset()
            for drafter in self._drafters:
                drafter.reset()

        self.driver.run(forget)

    def close(self) -> None:
        self.driver.close()
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

__all__ = ["Engine", "EngineOptions", "SamplingSettings", "plain_only_warning"]

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
from typing import Iterator, Sequence

from localspec.engine.adaptive import CostModel
from localspec.engine.calibration import Calibrator, Interrupted
from localspec.engine.contract import ServedEngine, available_drafters, unavailable_drafter
from localspec.engine.drafters import CopyDrafter, Drafter, NgramDrafter, Sources, build
from localspec.engine.events import Event, Prefill, Round, Tally
from localspec.engine.kv import KvSequence, common_prefix
from localspec.engine.model import LanguageModel, Vocabulary
from localspec.engine.request import Request
from localspec.engine.sampling import InfillVocab, Sampler, SamplingSettings
from localspec.engine.session import ChatTemplate, Message, TextStream
from localspec.engine.speculative import Planner, Step, speculate
from localspec.engine.speedup import PlainRounds, Speedup, SpeedupMeter
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


class Engine:
    """A target model, an optional draft model, and the loop between them. One generation at a time."""

    def __init__(self, target: LanguageModel, draft: LanguageModel | None = None, options: EngineOptions | None = None,
                 *, cost: CostModel | None = None, draft_cost_s: float | None = None,
                 template: ChatTemplate | None = None, self_draft: LanguageModel | None = None,
                 history_file: Path | None = None):
        self.target = target
        self.draft = draft
        self.self_draft = self_draft
        self.options = options or EngineOptions()
        # Slots: the target's KV sequences. Each request takes the one holding the longest prefix of its
        # prompt, or the least recently used, so an editor's cache-warming request or a second client
        # does not evict the cache the completions at the cursor keep using (llama-server's slots).
        self.slots = [KvSequence(target, seq=i) for i in range(target.n_seq)]
        self.kv = self.slots[0]
        self._requests = 0
        # The target's verify costs: given (tests), or calibrated (trusted cache, or measured now and
        # measured again between requests while untrusted or contradicted: engine/calibration.py).
        self.calibrator = None if cost is not None else Calibrator(target, self.options.calibrate)
        self.cost = cost or CostModel(verify_s=dict(self.calibrator.current.costs if self.calibrator else {}))
        self.plain_rounds = PlainRounds()  # what plain decoding measured here: the speedup's baseline
        opts = self.options
        self._drafters: list[Drafter] = build(Sources(
            target=target, draft=draft, self_draft=self_draft, p_min=opts.draft_p_min, calibrate=opts.calibrate,
            learn_costs=opts.learn_costs, draft_cost_s=draft_cost_s, history=opts.history_drafts,
            history_file=history_file))
        self._template = template
        self._planner: Planner | None = None
        self._side: Planner | None = None   # interjections' planner (copies only)
        self._current: Request | None = None  # the generation holding the engine
        self._paused_on: int | None = None    # the thread consuming it, while it waits between rounds
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
        return [d.warning for d in self._drafters if d.warning]

    @property
    def baseline_tokens_per_s(self) -> float:
        """Plain decoding at a short context: measured in this process when it has been, else the estimate."""
        measured = self.plain_rounds.per_token_s(0)
        return 1.0 / measured if measured else self.cost.plain_tokens_per_s

    @property
    def vocab(self) -> Vocabulary:
        return self.target.vocab

    @property
    def chat_template(self) -> str:
        return self.template.text

    def slot_tokens(self) -> list[int]:
        return [len(slot.tokens) for slot in self.slots]

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
        sampling = sampling or SamplingSettings()
        mode = drafter or self.options.drafter
        problem = unavailable_drafter(mode, self.drafters)
        if problem:
            raise LocalspecError(problem)
        if isinstance(draft_len, str) and draft_len != "default":
            raise LocalspecError(f"draft_len must be a number of tokens, none, or 'default' (got '{draft_len}').")
        fixed = self.options.draft_len if isinstance(draft_len, str) else draft_len
        tokens = list(prompt) if not isinstance(prompt, str) else self.target.vocab.tokenize(prompt, add_special=True)
        if not tokens:
            raise LocalspecError("The prompt is empty.")
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
        constraint = self.target.vocab.grammar(sampling.grammar) if sampling.grammar is not None else None
        request = Request(tokens, max_tokens, sampling, mode, fixed, tuple(stop), cancel or threading.Event(),
                          constraint)
        return self._interjection(request) if interject else self._generate(request)

    @property
    def interjects(self) -> bool:
        """Whether a short request can run between the rounds of a generation (`generate(interject=True)`):
        it needs a KV slot of its own."""
        return len(self.slots) > 1

    def _generate(self, request: Request) -> Iterator[Event]:
        if not self._lock.acquire(blocking=False):
            if not self._maintaining:
                raise LocalspecError("This engine is already generating; one generation at a time.")
            self._make_way.set()  # maintenance lets go within one calibration batch
            try:
                if not self._lock.acquire(timeout=30):
                    raise LocalspecError("The engine is busy measuring its costs; try again.")
            finally:
                self._make_way.clear()
        self._current = request
        try:
            for event in self._run(request, self.planner_for(request.mode, request.fixed, request.max_tokens,
                                                             request.sampling.replayable)):
                self._paused_on = threading.get_ident()  # between rounds: an interjection may run now
                yield event
                self._paused_on = None
        finally:
            self._paused_on = None
            self._current = None
            self._lock.release()
            request.close()

    def _interjection(self, request: Request) -> Iterator[Event]:
        """A short request run to its end while the current generation waits between two rounds (its
        consumer, on the same thread, is not asking for the next one): on another KV slot, drafting only
        copies of its own context (a planner of its own: the waiting generation's drafters, their state
        and the draft model's cache stay as they were); costs and measured plain rounds are shared."""
        current = self._current
        if current is None or current.kv is None or self._paused_on != threading.get_ident():
            raise LocalspecError("An interjection runs only between two rounds of a generation, on its thread.")
        self._paused_on = None  # no interjection inside this one
        request.avoid = current.kv
        t0 = time.perf_counter()
        try:
            yield from self._run(request, self._side_planner(request))
        finally:
            self._paused_on = threading.get_ident()
            current.waited_s += time.perf_counter() - t0
            request.close()

    def _side_planner(self, request: Request) -> Planner:
        if self._side is None:
            copies = CopyDrafter(NgramDrafter(ends_copy=self.target.vocab.is_control))
            self._side = Planner(mode=request.mode, cost=self.cost, drafters=[copies],
                                 learn_costs=self.options.learn_costs, plain_wanted=self.plain_rounds.wanted)
        self._side.configure(request.mode, request.fixed, request.max_tokens, request.sampling.replayable)
        return self._side

    def planner_for(self, mode: str, fixed: int | None, budget: int | None = None, replayable: bool = False) -> Planner:
        """One planner for the engine's lifetime: what the drafters learned and its probing back-off
        carry over from one request to the next (each drafter decides what restarts per request)."""
        if self._planner is None:
            self._planner = Planner(mode=mode, cost=self.cost, drafters=self._drafters, fixed_len=fixed,
                                    learn_costs=self.options.learn_costs, plain_wanted=self.plain_rounds.wanted)
        self._planner.configure(mode, fixed, budget, replayable)
        return self._planner

    def _run(self, request: Request, planner: Planner) -> Iterator[Event]:
        planner.start(request.prompt)
        context = list(request.prompt)
        try:
            yield from self._rounds(request, context, planner)
        finally:
            planner.finish(request.prompt, context[len(request.prompt):])  # also when cancelled: evidence

    def _rounds(self, request: Request, context: list[int], planner: Planner) -> Iterator[Event]:
        max_tokens, stop, cancel = request.max_tokens, request.stop, request.cancel
        t0 = time.perf_counter()
        prefill = self._prefill(request, planner, t0)
        yield prefill
        kv = request.kv
        assert kv is not None  # (set by _prefill)

        sampler, stream, tally = Sampler(request.sampling, self._infill_vocab()), TextStream(stop), Tally()
        meter = SpeedupMeter(self.plain_rounds, lambda: self.cost.verify(1))
        first_token_s = 0.0
        stop_reason = "cancelled"
        t_start = t_round = time.perf_counter()
        waited = 0.0
        for step in speculate(kv, context, planner, sampler, cancel, request.constraint):
            # Time this generation waited for an interjection is not its rounds' (nor its plain baseline's).
            now = time.perf_counter()
            seconds, t_round, waited = now - t_round - (request.waited_s - waited), now, request.waited_s
            kept, ended = self._within_budget(step, max_tokens - tally.generated)
            context_len = len(context) - step.accepted - 1
            speedup = meter.add(context_len, seconds, len(kept), bool(step.draft.tokens))
            self._learn(step, context_len)
            event = self._round(step, kept, ended, stream, tally.rounds, seconds, speedup)
            ended = ended or ("stop" if stream.stopped else None)
            tally.add(event)
            if not first_token_s and event.emitted:
                first_token_s = time.perf_counter() - t0
            yield event
            if ended:
                stop_reason = ended
                break
        else:
            stop_reason = "cancelled" if cancel.is_set() else "context"
        wall = time.perf_counter() - t_start - request.waited_s
        tail = stream.flush()
        if tail:
            # Text held back for a possible stop string that never came: release it as a last round.
            yield Round(index=tally.rounds, drafter="none", accepted=(), rejected=(), token=None, token_kind="",
                        accepted_text="", rejected_text="", token_text="", text=tail, draft_s=0.0, verify_s=0.0)
        yield tally.summary(text=stream.text, stop_reason=stop_reason, prefill=prefill, wall_s=wall,
                            baseline_tokens_per_s=self.cost.plain_tokens_per_s,
                            drafter=request.mode if request.fixed is None else f"{request.mode} (fixed {request.fixed})",
                            first_token_s=first_token_s, kv_tokens=len(kv.tokens))

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

    def slot_for(self, prompt: Sequence[int], avoid: KvSequence | None = None) -> tuple[KvSequence, int]:
        """The slot holding the longest prefix of `prompt`, when that prefix is at least a tenth of the
        prompt (llama-server's slot similarity), otherwise the least recently used one; and how many
        of the prompt's tokens it already holds. Never `avoid` (a waiting generation's slot)."""
        free = [s for s in self.slots if s is not avoid]
        held = [common_prefix(s.tokens, prompt) for s in free]
        i = max(range(len(free)), key=lambda j: (held[j], -free[j].last_used))
        if held[i] > 0 and held[i] * 10 >= len(prompt):
            return free[i], held[i]
        oldest = min(range(len(free)), key=lambda j: free[j].last_used)
        return free[oldest], held[oldest]

    def _prefill(self, request: Request, planner: Planner, t0: float) -> Prefill:
        """The prompt into a slot's KV cache, all but its last token (the first round evaluates that
        one); the longest cached prefix is kept, and with `cache_reuse` the cached runs that moved."""
        prompt = request.prompt
        kv, reuse = self.slot_for(prompt, request.avoid)
        request.kv = self.kv = kv
        self._requests += 1
        kv.last_used = self._requests
        if self.options.cache_reuse:
            reuse = kv.reuse(prompt, self.options.cache_reuse)
        keep = min(reuse, len(prompt) - 1)
        kv.rewind(keep)
        kv.extend(prompt[keep:-1])
        planner.prefill(prompt)
        return Prefill(prompt_tokens=len(prompt), evaluated=len(prompt) - keep, cached=keep,
                       seconds=time.perf_counter() - t0)

    def _within_budget(self, step, room: int) -> tuple[list[int], str | None]:
        """The round's tokens (accepted draft, then the target's own) up to the end of the answer: an
        end-of-generation token, or the token budget."""
        kept: list[int] = []
        for tok in [*step.draft.tokens[:step.accepted], step.token]:
            if self.target.vocab.is_eog(tok):
                return kept, "eog"
            kept.append(tok)
            if len(kept) >= room:
                return kept, "length"
        return kept, None

    def _round(self, step, kept: list[int], ended: str | None, stream: TextStream, index: int, seconds: float,
               speedup: Speedup) -> Round:
        """The round as the front doors see it: what was kept, rejected and supplied, and its text."""
        vocab = self.target.vocab
        accepted = tuple(kept[:step.accepted])
        token = kept[step.accepted] if len(kept) > step.accepted else None
        rejected = tuple(step.draft.tokens[step.accepted:]) if ended is None or token is not None else ()
        pieces, shown = [], ""
        for t in accepted:  # token by token: front doors that apply per-token rules get each token's text
            decoded, visible = stream.feed(vocab.token_bytes(t))
            pieces.append(decoded)
            shown += visible
        accepted_text = "".join(pieces)
        rejected_text = stream.piece(b"".join(vocab.token_bytes(t) for t in rejected))
        token_text = ""
        if token is not None:
            token_text, visible = stream.feed(vocab.token_bytes(token))
            pieces.append(token_text)
            shown += visible
        return Round(
            index=index,
            drafter=step.draft.source if step.draft.tokens else "none",
            accepted=accepted,
            rejected=rejected,
            token=token,
            token_kind=step.kind if token is not None else "",
            accepted_text=accepted_text,
            rejected_text=rejected_text,
            token_text=token_text,
            text=shown,
            draft_s=step.draft.seconds,
            verify_s=step.verify_s,
            evidence=step.draft.evidence,
            pieces=tuple(pieces),
            seconds=seconds,
            speedup=speedup.factor,
            baseline_tokens_per_s=speedup.baseline_tokens_per_s,
            baseline_measured=speedup.measured,
        )

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

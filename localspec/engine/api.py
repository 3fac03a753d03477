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
from localspec.engine.drafters import Drafter, Sources, build
from localspec.engine.events import Event, Prefill, Round, Tally
from localspec.engine.kv import KvSequence, common_prefix
from localspec.engine.model import LanguageModel, Vocabulary
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
    ) -> Iterator[Event]:
        """Prefill, then one Round per draft/verify step, then a Summary."""
        sampling = sampling or SamplingSettings()
        mode = drafter or self.options.drafter
        problem = unavailable_drafter(mode, self.drafters)
        if problem:
            raise LocalspecError(problem)
        fixed = self.options.draft_len if draft_len == "default" else draft_len
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
        # A grammar that does not parse is refused here, before the request takes the engine.
        constraint = self.target.vocab.grammar(sampling.grammar) if sampling.grammar is not None else None
        return self._generate(tokens, max_tokens, sampling, mode, fixed, stop, cancel or threading.Event(), constraint)

    def _generate(self, prompt, max_tokens, sampling, mode, fixed, stop, cancel, constraint) -> Iterator[Event]:
        if not self._lock.acquire(blocking=False):
            if not self._maintaining:
                raise LocalspecError("This engine is already generating; one generation at a time.")
            self._make_way.set()  # maintenance lets go within one calibration batch
            try:
                if not self._lock.acquire(timeout=30):
                    raise LocalspecError("The engine is busy measuring its costs; try again.")
            finally:
                self._make_way.clear()
        try:
            yield from self._run(prompt, max_tokens, sampling, mode, fixed, stop, cancel, constraint)
        finally:
            self._lock.release()
            if constraint is not None:
                constraint.close()

    def planner_for(self, mode: str, fixed: int | None, budget: int | None = None, replayable: bool = False) -> Planner:
        """One planner for the engine's lifetime: what the drafters learned and its probing back-off
        carry over from one request to the next (each drafter decides what restarts per request)."""
        if self._planner is None:
            self._planner = Planner(mode=mode, cost=self.cost, drafters=self._drafters, fixed_len=fixed,
                                    learn_costs=self.options.learn_costs, plain_wanted=self.plain_rounds.wanted)
        self._planner.configure(mode, fixed, budget, replayable)
        return self._planner

    def _run(self, prompt, max_tokens, sampling, mode, fixed, stop, cancel, constraint) -> Iterator[Event]:
        planner = self.planner_for(mode, fixed, max_tokens, sampling.replayable)
        planner.start(prompt)
        context = list(prompt)
        try:
            yield from self._rounds(prompt, context, planner, max_tokens, sampling, mode, fixed, stop, cancel,
                                    constraint)
        finally:
            planner.finish(prompt, context[len(prompt):])  # also when cancelled: what was written is evidence

    def _rounds(self, prompt, context, planner, max_tokens, sampling, mode, fixed, stop, cancel,
                constraint) -> Iterator[Event]:
        t0 = time.perf_counter()
        prefill = self._prefill(prompt, planner, t0)
        yield prefill

        sampler, stream, tally = Sampler(sampling, self._infill_vocab()), TextStream(stop), Tally()
        meter = SpeedupMeter(self.plain_rounds, lambda: self.cost.verify(1))
        first_token_s = 0.0
        stop_reason = "cancelled"
        t_start = t_round = time.perf_counter()
        for step in speculate(self.kv, context, planner, sampler, cancel, constraint):
            now = time.perf_counter()
            seconds, t_round = now - t_round, now
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
        wall = time.perf_counter() - t_start
        tail = stream.flush()
        if tail:
            # Text held back for a possible stop string that never came: release it as a last round.
            yield Round(index=tally.rounds, drafter="none", accepted=(), rejected=(), token=None, token_kind="",
                        accepted_text="", rejected_text="", token_text="", text=tail, draft_s=0.0, verify_s=0.0)
        yield tally.summary(text=stream.text, stop_reason=stop_reason, prefill=prefill, wall_s=wall,
                            baseline_tokens_per_s=self.cost.plain_tokens_per_s,
                            drafter=mode if fixed is None else f"{mode} (fixed {fixed})", first_token_s=first_token_s,
                            kv_tokens=len(self.kv.tokens))

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

    def slot_for(self, prompt: Sequence[int]) -> tuple[KvSequence, int]:
        """The slot holding the longest prefix of `prompt`, when that prefix is at least a tenth of the
        prompt (llama-server's slot similarity), otherwise the least recently used one; and how many
        of the prompt's tokens it already holds."""
        held = [common_prefix(s.tokens, prompt) for s in self.slots]
        i = max(range(len(self.slots)), key=lambda j: (held[j], -self.slots[j].last_used))
        if held[i] > 0 and held[i] * 10 >= len(prompt):
            return self.slots[i], held[i]
        oldest = min(range(len(self.slots)), key=lambda j: self.slots[j].last_used)
        return self.slots[oldest], held[oldest]

    def _prefill(self, prompt: list[int], planner: Planner, t0: float) -> Prefill:
        """The prompt into a slot's KV cache, all but its last token (the first round evaluates that
        one); the longest cached prefix is kept, and with `cache_reuse` the cached runs that moved."""
        self.kv, reuse = self.slot_for(prompt)
        self._requests += 1
        self.kv.last_used = self._requests
        if self.options.cache_reuse:
            reuse = self.kv.reuse(prompt, self.options.cache_reuse)
        keep = min(reuse, len(prompt) - 1)
        self.kv.rewind(keep)
        self.kv.extend(prompt[keep:-1])
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

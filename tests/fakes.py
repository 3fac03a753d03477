"""A scripted engine and provider for fast UI tests (the real engine has its own end-to-end test)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from localspec.engine.contract import ChatEngine, ServedEngine, available_drafters, unavailable_drafter
from localspec.engine.driver import Driver
from localspec.engine.events import Prefill, Round, Summary, Tally
from localspec.errors import ContextOverflowError, LocalspecError
from localspec.tui.provider import Choice

# Each step: (accepted text, rejected text, the target's own text)
STEPS = [
    ("def ", "", "add"),
    ("(a, b", ", c", ")"),
    (":\n    return a", " -", " +"),
    (" b\n", "", ""),
]


class ScriptedVocab:
    """A tokenizer with FIM tokens: one token per character (ids 100 + code point), specials below 100."""

    bos, eos, fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep = 1, 2, 3, 4, 5, 6, 7, 8
    add_bos = True

    def text(self, token: int) -> str:
        return {1: "<s>", 2: "</s>"}.get(token, chr(token - 100) if token >= 100 else f"<special{token}>")

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return ([self.bos] if add_special else []) + [100 + ord(c) for c in text]

    def is_eog(self, token: int) -> bool:
        return token == self.eos


@dataclass
class ScriptedEngine:
    """Implements `ChatEngine` and `ServedEngine` (localspec.engine.contract); mypy checks it does
    (tests/test_layers.py). Its `slots` sequences are stepped together, each step one event of each."""

    steps: list = field(default_factory=lambda: list(STEPS))
    delay: float = 0.0
    hold: threading.Event | None = None      # when set, the engine waits for it after the first round
    draft: bool = True                       # a draft model is loaded (offers the drafter "model")
    n_ctx: int = 4096
    fail_after: int | None = None            # raise mid-answer after this many rounds
    shared: int = 0                          # other requests decoded in the same steps (a server's)
    calls: list = field(default_factory=list)
    closed: bool = False
    baseline_tokens_per_s: float = 10.0
    warnings: list[str] = field(default_factory=list)
    vocab: ScriptedVocab = field(default_factory=ScriptedVocab)
    chat_template: str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    slots: int = 1
    running: list = field(default_factory=list)  # [sequence, its events, deliver, its cancel, the request's]
    _driver: Driver | None = None

    @property
    def driver(self) -> Driver:
        if self._driver is None:
            self._driver = Driver()
        return self._driver

    @property
    def concurrent(self) -> bool:
        return self.slots > 1

    def free_slots(self) -> int:
        return self.slots - len(self.running)

    def submit(self, prompt, params, deliver, *, cancel=None, cancels=None, sequences=None, urgent=False):
        chosen = list(range(params.n) if sequences is None else sequences)
        if len(chosen) > self.free_slots():
            raise LocalspecError("No KV slot is free for another request.")
        everyone = cancel or threading.Event()
        added = []
        for seq in chosen:
            own = cancels[seq] if cancels is not None else everyone
            events = self.generate(prompt, max_tokens=params.max_tokens, sampling=params.samplings[seq],
                                   drafter=params.drafter, draft_len=params.draft_len, stop=params.stop, cancel=own)
            added.append([seq, events, deliver, own, everyone])
        self.running.extend(added)
        return added

    def step(self, only=None):
        for entry in [e for e in self.running if only is None or any(e is o for o in only)]:
            seq, events, deliver, own, everyone = entry
            if everyone.is_set():
                own.set()
            try:
                event = next(events)
            except Exception as exc:
                self.running.remove(entry)
                deliver(exc)
                continue
            if isinstance(event, Summary):
                self.running.remove(entry)
            deliver((seq, event))
        return bool(self.running)

    def generate_many(self, prompt, samplings, *, max_tokens=512, stop=(), drafter=None, cancel=None, cancels=None):
        """Each completion generated in turn."""
        for seq, sampling in enumerate(samplings):
            own = cancels[seq] if cancels is not None else cancel
            for event in self.generate(prompt, max_tokens=max_tokens, sampling=sampling, drafter=drafter, stop=stop,
                                       cancel=own):
                yield seq, event

    @property
    def drafters(self) -> tuple[str, ...]:
        return available_drafters(["ngram", "history", *(["model"] if self.draft else [])])

    def chat(self, messages, *, max_tokens=512, sampling=None, drafter=None, draft_len="default", stop=(),
             cancel=None, draft_max=None, draft_min=0):
        self.calls.append({"messages": [dict(m) for m in messages], "max_tokens": max_tokens, "sampling": sampling,
                           "drafter": drafter, "draft_len": draft_len})
        problem = unavailable_drafter(drafter or "auto", self.drafters)
        if problem:
            raise LocalspecError(problem)
        if sum(len(m["content"]) for m in messages) > self.n_ctx:
            raise ContextOverflowError("The prompt is longer than the context window holds.")
        return self._events(cancel or threading.Event(), max_tokens)

    def slot_tokens(self) -> list[int]:
        return [0]

    def slots_busy(self) -> list[bool]:
        return [False]

    def chat_tokens(self, messages, tools=None):
        listed = "".join(f"<tool>{t['function']['name']}" for t in tools or ())
        return self.vocab.tokenize(listed + "".join(f"<{m['role']}>{m['content']}" for m in messages))

    projector = None  # (text only)
    sees_images = False

    def image_tokens(self, text, images):
        raise LocalspecError("This model cannot see images.")

    def generate(self, prompt, *, max_tokens=512, sampling=None, drafter=None, draft_len="default", stop=(),
                 cancel=None, draft_max=None, draft_min=0):
        tokens = self.vocab.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        self.calls.append({"tokens": tokens, "max_tokens": max_tokens, "sampling": sampling, "drafter": drafter,
                           "draft_len": draft_len, "stop": tuple(stop)})
        problem = unavailable_drafter(drafter or "auto", self.drafters)
        if problem:
            raise LocalspecError(problem)
        return self._events(cancel or threading.Event(), max_tokens)

    def _events(self, cancel, max_tokens=512):
        yield Prefill(prompt_tokens=10, evaluated=10, cached=0, seconds=0.01)
        tally, text = Tally(), ""
        stop = "eog"
        for i, (acc, rej, tok) in enumerate(self.steps):
            if cancel.is_set():
                stop = "cancelled"
                break
            if tally.generated >= max_tokens:
                stop = "length"
                break
            if self.fail_after is not None and i >= self.fail_after:
                raise RuntimeError("llama_decode returned -3")
            accepted = tuple(range(len(acc.split()) or (1 if acc else 0)))
            rejected = tuple(range(len(rej.split()) or (1 if rej else 0)))
            event = Round(index=i, drafter="model" if accepted or rejected else "none", accepted=accepted,
                          rejected=rejected, token=7 if tok else None, token_kind="correction" if rejected else "bonus",
                          accepted_text=acc, rejected_text=rej, token_text=tok, text=acc + tok,
                          draft_s=0.001, verify_s=0.01, pieces=tuple(p for p in (acc, tok) if p),
                          shared=self.shared)
            tally.add(event)
            text += acc + tok
            yield event
            if self.delay:
                time.sleep(self.delay)
            if self.hold is not None and i == 0:
                while not self.hold.is_set() and not cancel.is_set():
                    time.sleep(0.01)
        yield tally.summary(text=text, stop_reason=stop, prefill=Prefill(10, 10, 0, 0.01),
                            wall_s=tally.draft_s + tally.verify_s or 1e-3, baseline_tokens_per_s=10.0, drafter="auto",
                            kv_tokens=10 + tally.generated - 1)

    def maintain(self, interrupt=lambda: False) -> str:
        self.maintained = getattr(self, "maintained", 0) + 1
        return ""

    def close(self):
        self.closed = True


_chat: type[ChatEngine] = ScriptedEngine  # the contracts, checked by mypy
_served: type[ServedEngine] = ScriptedEngine


class ScriptedProvider:
    def __init__(self, engine: ScriptedEngine | None = None, ready: bool = True):
        self.engine = engine or ScriptedEngine()
        self.ready = ready
        self.loaded: list[str] = []
        self.pulled: list[str] = []

    def choices(self):
        return [Choice("pair-a", "pair", "target + draft", 2_000_000_000, self.ready, default=True),
                Choice("model-b", "model", "a single model", 1_000_000_000, self.ready)]

    def default_id(self):
        return "pair-a"

    def is_ready(self, entry_id):
        if entry_id not in ("pair-a", "model-b"):
            from localspec.errors import UnknownIdError

            raise UnknownIdError(f"Unknown model or pair '{entry_id}'.")
        return self.ready

    def pull(self, entry_id, say):
        say(f"pulling {entry_id}")
        time.sleep(0.05)
        self.pulled.append(entry_id)
        self.ready = True

    def pull_progress(self, entry_id):
        return (1, 2)

    def load(self, entry_id):
        self.loaded.append(entry_id)
        return self.engine

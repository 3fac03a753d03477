"""An engine in a child process, for a target on RPC workers.

ggml's RPC client ends the whole process when a worker dies mid-answer ("Remote RPC server crashed or
returned malformed response"). So with `--rpc` the engine is loaded in a child process and this side
keeps what front doors call between answers: the tokenizer and chat template (a vocabulary-only load),
the engine's figures, and every request's events as the child's engine steps them (several requests
share its steps, as in process; `hosted_child.py` is the child's side). When the child dies, the answer so far has been
delivered, the error names the worker that stopped answering (each is asked for its version), and the
next request loads a new child (failing with the same clear error while the worker is still down).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from localspec import errors, hosted_child, paths
from localspec.engine.api import Engine
from localspec.engine.driver import Driver, Pull
from localspec.engine.events import Event, Summary
from localspec.engine.model import Vocabulary
from localspec.engine.params import GenerationParams
from localspec.engine.sampling import SamplingSettings
from localspec.errors import EngineUnavailableError, LocalspecError

_ERRORS = {cls.__name__: cls for cls in (LocalspecError, errors.ContextOverflowError, EngineUnavailableError,
                                         errors.ModelFileError, errors.IncompatiblePairError, errors.UnknownIdError)}


@contextlib.contextmanager
def _stderr_with_a_file():
    """multiprocessing hands sys.stderr's file descriptor to its helper process; a terminal UI replaces
    sys.stderr with an object that has none ("bad value(s) in fds_to_keep"): lend it /dev/null."""
    try:
        usable = sys.stderr is not None and sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        usable = False
    if usable:
        yield
        return
    saved = sys.stderr
    with open(os.devnull, "w") as null:
        sys.stderr = null
        try:
            yield
        finally:
            sys.stderr = saved


def _last_words(log: Path) -> str:
    """ggml's abort message ("…/ggml-rpc.cpp:566: Remote RPC server crashed or …"), without the path."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    said = [m.group(1) for line in lines if (m := re.search(r"\.(?:c|cpp):\d+: (.+)", line))]
    return said[-1].strip()[:200] if said else ""


@dataclass
class _Remote:
    """A request in the child's engine, as this side follows it."""

    deliver: Callable[[Any], None]
    cancel: threading.Event
    cancels: Sequence[threading.Event] | None
    sequences: list[int]
    left: int                                   # summaries still to come
    answer: str | Exception = "waiting"         # the child's answer to the submit: "accepted" or its refusal
    told: set = field(default_factory=set)      # cancels sent on (None: all of them)


class HostedEngine:
    """A `ServedEngine` whose engine runs in a child process (see the module's docstring): requests are
    submitted to the child's engine, which steps them together in its slots as in process; this side's
    driver thread (`step`) forwards cancels and hands each request the events the child sends."""

    def __init__(self, opener: Callable[[], Engine], target_path: Path, workers: list[str]):
        """`opener`: a picklable callable (a `functools.partial` of a module-level function) that loads
        the engine in the child; `target_path`: the target's file, for its vocabulary on this side;
        `workers`: the RPC workers the child's engine uses, asked when it dies."""
        from localspec.engine.backend import VocabFile
        from localspec.engine.session import ChatTemplate

        self.workers, self._opener = workers, opener
        self.target = VocabFile(target_path)  # .path, .meta(), .vocab: what the server names the model by
        self._template = ChatTemplate.for_model(self.target)
        self.driver = Driver()
        self._pull = self.driver.readers = Pull(self.driver, self._turn, lambda: bool(self._open))
        self._open: dict[int, _Remote] = {}
        self._ids = itertools.count()
        self._proc: Any = None
        self._conn: Any = None
        self._start()

    # ------------------------------------------------------------------ the child

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process that holds llama.cpp threads
        self._conn, child = context.Pipe()
        self._log = paths.ensure(paths.cache_dir() / "logs") / "engine.log"
        self._proc = context.Process(target=hosted_child.run, args=(child, self._opener, str(self._log)),
                                     daemon=True, name="localspec-engine")
        with _stderr_with_a_file():
            self._proc.start()
        child.close()
        try:
            kind, *payload = self._conn.recv()
        except (EOFError, OSError):
            raise self._lost("while the model was loading") from None
        if kind == "failed":
            self._stop()
            raise _ERRORS.get(payload[2], LocalspecError)(payload[1])
        self._info: dict[str, Any] = payload[0]
        self._slot_tokens = list(self._info["slot_tokens"])
        self._busy = [False] * len(self._slot_tokens)

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def _stop(self) -> None:
        if self._proc is None:
            return
        try:
            self._conn.send(("close",))
        except (OSError, ValueError):
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._proc = self._conn = None

    def _lost(self, when: str) -> EngineUnavailableError:
        """The child died: say which worker is down (asked directly), and that the next request reloads."""
        from localspec.rpc import reachable

        if self._proc is not None:
            self._proc.join(5)
            self._conn.close()
        self._proc = self._conn = None
        down = [w for w in self.workers if not reachable(w)]
        who = f"The RPC worker {', '.join(down)}" if down else "An RPC worker"
        said = _last_words(self._log)
        return EngineUnavailableError(
            f"{who} stopped answering {when}, and llama.cpp ended the engine's process"
            f"{f' ({said})' if said else ''}. The model is loaded again at the next request"
            f"{' (once the worker is back)' if down else ''}.")

    # ------------------------------------------------------------------ the contract

    @property
    def n_ctx(self) -> int:
        return int(self._info["n_ctx"])

    @property
    def drafters(self) -> tuple[str, ...]:
        return tuple(self._info["drafters"])

    @property
    def baseline_tokens_per_s(self) -> float:
        return float(self._info["baseline_tokens_per_s"])

    @property
    def warnings(self) -> list[str]:
        return list(self._info["warnings"])

    @property
    def vocab(self) -> Vocabulary:
        return self.target.vocab

    @property
    def chat_template(self) -> str:
        return self._template.text

    def chat_tokens(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        return self._template.tokens(self.target.vocab, messages, tools)

    @property
    def sees_images(self) -> bool:
        return False

    @property
    def projector(self) -> None:
        return None  # (images are evaluated in process only)

    def image_tokens(self, text: str, images: Sequence[bytes]) -> list[int]:
        raise errors.LocalspecError("Images are not taken by an engine in a worker process; load the model in process.")

    def slot_tokens(self) -> list[int]:
        return list(self._slot_tokens)

    def slots_busy(self) -> list[bool]:
        return list(self._busy)

    @property
    def concurrent(self) -> bool:
        return len(self._slot_tokens) > 1

    def free_slots(self) -> int:
        return len(self._slot_tokens) - sum(remote.left for remote in self._open.values())

    def chat(self, messages: Sequence[dict[str, Any]], *, max_tokens: int = 512, sampling: SamplingSettings | None = None,
             drafter: str | None = None, draft_len: int | None | str = "default", stop: Sequence[str] = (),
             cancel: threading.Event | None = None, draft_max: int | None = None,
             draft_min: int = 0) -> Iterator[Event]:
        return self.generate(self.chat_tokens(messages), max_tokens=max_tokens, sampling=sampling, drafter=drafter,
                             draft_len=draft_len, stop=stop, cancel=cancel, draft_max=draft_max, draft_min=draft_min)

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 512, sampling: SamplingSettings | None = None,
                 drafter: str | None = None, draft_len: int | None | str = "default", stop: Sequence[str] = (),
                 cancel: threading.Event | None = None, draft_max: int | None = None,
                 draft_min: int = 0) -> Iterator[Event]:
        params = GenerationParams.one(sampling, max_tokens=max_tokens, stop=tuple(stop), drafter=drafter,
                                      draft_len=draft_len, draft_max=draft_max, draft_min=draft_min)
        return (event for _, event in self._read(prompt, params, [0], cancel or threading.Event(), None))

    def generate_many(self, prompt: str | Sequence[int], samplings: Sequence[SamplingSettings], *,
                      max_tokens: int = 512, stop: Sequence[str] = (), drafter: str | None = None,
                      cancel: threading.Event | None = None,
                      cancels: Sequence[threading.Event] | None = None) -> Iterator[tuple[int, Event]]:
        """Every completion at once where the slots allow, else in waves (as in process)."""
        params = GenerationParams(max_tokens, tuple(samplings), tuple(stop), drafter)
        return self._waves(prompt, params, cancel or threading.Event(), cancels)

    def _waves(self, prompt: str | Sequence[int], params: GenerationParams, everyone: threading.Event,
               cancels: Sequence[threading.Event] | None) -> Iterator[tuple[int, Event]]:
        width = self.driver.run(self.free_slots)
        if width <= 0:
            raise LocalspecError("No KV slot is free for another request.")
        for first in range(0, params.n, width):
            yield from self._read(prompt, params, range(first, min(first + width, params.n)), everyone, cancels)

    def _read(self, prompt: str | Sequence[int], params: GenerationParams, sequences: Sequence[int],
              everyone: threading.Event, cancels: Sequence[threading.Event] | None) -> Iterator[tuple[int, Event]]:
        """The request submitted at the first `next` and its events read as the driver receives them; a
        reader that stops early cancels it and waits for the child to let go of it (its slots free)."""
        reader = self._pull.reader()
        handles: list[int] = []
        try:
            handles = self.submit(prompt, params, reader, cancel=everyone, cancels=cancels, sequences=sequences)
            yield from reader.answers(len(sequences))
        finally:
            for rid in handles:
                self.driver.run(lambda: self._let_go(rid))

    def submit(self, prompt: str | Sequence[int], params: GenerationParams, deliver: Callable[[Any], None], *,
               cancel: threading.Event | None = None, cancels: Sequence[threading.Event] | None = None,
               sequences: Sequence[int] | None = None, urgent: bool = False) -> list[int]:
        """The request into the child's engine (loaded again first where its process has died); raises
        what the engine refused it with. `urgent` drafts as in process; the child steps every request it
        holds together."""
        chosen = list(range(params.n) if sequences is None else sequences)
        remote = _Remote(deliver, cancel or threading.Event(), cancels, chosen, len(chosen))
        message = prompt if isinstance(prompt, str) else list(prompt)
        return self.driver.run(lambda: self._submit(message, params, remote, urgent))

    def _submit(self, prompt: str | list[int], params: GenerationParams, remote: _Remote, urgent: bool) -> list[int]:
        if not self._alive():
            self._stop()
            self._start()
        rid = next(self._ids)
        self._open[rid] = remote
        self._send(("submit", rid, prompt, params, remote.sequences, urgent))
        while remote.answer == "waiting":
            self._receive(0.05)
        if isinstance(remote.answer, Exception):
            raise remote.answer
        return [rid]

    def step(self, only: Sequence[Any] | None = None) -> bool:
        """Events the child has sent, each handed to its request (the child steps all it holds: `only`
        is for engines in process); False once none is left."""
        return self.driver.run(self._turn)

    def _turn(self) -> bool:
        for rid, remote in list(self._open.items()):
            if remote.cancel.is_set() and None not in remote.told:
                remote.told.add(None)
                self._send(("cancel", rid, None))
            for seq in remote.sequences:
                if remote.cancels is not None and remote.cancels[seq].is_set() and seq not in remote.told:
                    remote.told.add(seq)
                    self._send(("cancel", rid, seq))
        if self._open:
            self._receive(0.05)
        while self._open and self._conn is not None and self._conn.poll():
            self._receive(0)
        return bool(self._open)

    def _let_go(self, rid: int) -> None:
        """(On the driver's thread.) The request cancelled, and followed to its end."""
        remote = self._open.get(rid)
        if remote is None:
            return
        if None not in remote.told:  # (the reader's cancel event stays as it was)
            remote.told.add(None)
            self._send(("cancel", rid, None))
        deadline = time.monotonic() + 30
        while rid in self._open and time.monotonic() < deadline:
            self._turn()
        self._open.pop(rid, None)

    def _send(self, message: tuple) -> None:
        try:
            self._conn.send(message)
        except (OSError, ValueError, AttributeError):
            self._lose()

    def _receive(self, wait: float) -> None:
        """One message from the child within `wait` seconds, handed to its request."""
        conn = self._conn
        try:
            if conn is None:
                raise EOFError
            if not conn.poll(wait):
                if self._proc.is_alive() or conn.poll():
                    return
                raise EOFError
            kind, *payload = conn.recv()
        except (EOFError, OSError):
            self._lose()
            return
        if kind == "slots":
            self._slot_tokens, self._busy = payload
            return
        rid, *rest = payload
        remote = self._open.get(rid)
        if remote is None:
            return
        if kind == "accepted":
            remote.answer = "accepted"
        elif kind == "refused":
            del self._open[rid]
            remote.answer = _ERRORS.get(rest[1], LocalspecError)(rest[0])
        elif kind == "failed":
            del self._open[rid]
            remote.deliver(_ERRORS.get(rest[1], RuntimeError)(rest[0]))
        elif kind == "event":
            event = rest[0][1]
            if isinstance(event, Summary):
                self._info["baseline_tokens_per_s"] = event.baseline_tokens_per_s
                remote.left -= 1
                if not remote.left:
                    del self._open[rid]
            remote.deliver(rest[0])

    def _lose(self) -> None:
        """The child died: every request it held ends with the error that says which worker is down."""
        if self._proc is None and not self._open:
            return
        failure = self._lost("in the middle of an answer")
        for remote in self._open.values():
            if remote.answer == "waiting":
                remote.answer = failure
            else:
                remote.deliver(failure)
        self._open.clear()

    def reset(self) -> None:
        """Nothing to forget on this side; the child's caches go with it at the next reload."""

    def maintain(self, interrupt: Callable[[], bool] = lambda: False) -> str:
        return ""  # the child maintains its engine between requests (hosted_child)

    def close(self) -> None:
        self.driver.close()
        self._stop()
        self.target.close()

    def __enter__(self) -> "HostedEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

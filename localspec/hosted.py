"""An engine in a child process, for a target on RPC workers.

ggml's RPC client ends the whole process when a worker dies mid-answer ("Remote RPC server crashed or
returned malformed response"). So with `--rpc` the engine is loaded in a child process and this side
keeps what front doors call between answers: the tokenizer and chat template (a vocabulary-only load),
the engine's figures, the events streamed over a pipe. When the child dies, the answer so far has been
delivered, the error names the worker that stopped answering (each is asked for its version), and the
next request loads a new child (failing with the same clear error while the worker is still down).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from localspec import errors, paths
from localspec.engine.api import Engine
from localspec.engine.contract import OneRequestAtATime
from localspec.engine.events import Event, Summary
from localspec.engine.model import Vocabulary
from localspec.engine.sampling import SamplingSettings
from localspec.errors import EngineUnavailableError, LocalspecError

_ERRORS = {cls.__name__: cls for cls in (LocalspecError, errors.ContextOverflowError, EngineUnavailableError,
                                         errors.ModelFileError, errors.IncompatiblePairError, errors.UnknownIdError)}


def _child(conn, opener: Callable[[], Engine], log: str) -> None:
    """The engine's process: `opener()` loads it, then it answers requests until told to close or the
    pipe breaks. Its stderr goes to `log` (the parent may be drawing a terminal UI; ggml's last words
    land there)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ["GGML_NO_BACKTRACE"] = "1"  # ggml would attach gdb to print a backtrace when it aborts
    import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

    try:
        engine = opener()
    except Exception as exc:  # every failure goes back as a message; this process only serves the parent
        conn.send(("failed", str(exc) if isinstance(exc, LocalspecError) else f"{type(exc).__name__}: {exc}",
                   type(exc).__name__))
        return
    conn.send(("ready", {"n_ctx": engine.n_ctx, "drafters": engine.drafters,
                         "baseline_tokens_per_s": engine.baseline_tokens_per_s, "warnings": engine.warnings,
                         "slot_tokens": engine.slot_tokens()}))
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message[0] == "close":
                return
            if message[0] == "generate":
                _generate(conn, engine, message[1], message[2])
                if not conn.poll(0.5):  # idle: what the engine put off for a quiet moment
                    engine.maintain(interrupt=conn.poll)
    finally:
        engine.close()


def _generate(conn, engine, prompt, options: dict[str, Any]) -> None:
    cancel = threading.Event()
    try:
        for event in engine.generate(prompt, cancel=cancel, **options):
            conn.send(("event", event))
            while conn.poll():
                if conn.recv()[0] == "cancel":
                    cancel.set()
        conn.send(("done", engine.slot_tokens()))
    except Exception as exc:
        conn.send(("failed", str(exc) if isinstance(exc, LocalspecError) else f"The engine failed: {type(exc).__name__}: {exc}",
                   type(exc).__name__ if isinstance(exc, LocalspecError) else "RuntimeError"))


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


class HostedEngine(OneRequestAtATime):
    """A `ServedEngine` whose engine runs in a child process (see the module's docstring)."""

    message = "An engine in a child process runs one request at a time."

    def __init__(self, opener: Callable[[], Engine], target_path: Path, workers: list[str]):
        """`opener`: a picklable callable (a `functools.partial` of a module-level function) that loads
        the engine in the child; `target_path`: the target's file, for its vocabulary on this side;
        `workers`: the RPC workers the child's engine uses, asked when it dies."""
        from localspec.engine.backend import VocabFile
        from localspec.engine.session import ChatTemplate

        self.workers, self._opener = workers, opener
        self.target = VocabFile(target_path)  # .path, .meta(), .vocab: what the server names the model by
        self._template = ChatTemplate.for_model(self.target)
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self._start()

    # ------------------------------------------------------------------ the child

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process that holds llama.cpp threads
        self._conn, child = context.Pipe()
        self._log = paths.ensure(paths.cache_dir() / "logs") / "engine.log"
        self._proc = context.Process(target=_child, args=(child, self._opener, str(self._log)),
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
            raise _ERRORS.get(payload[1], LocalspecError)(payload[0])
        self._info: dict[str, Any] = payload[0]
        self._slot_tokens = list(self._info["slot_tokens"])

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
        # The child generates one request at a time and says which slot only at its end: while it
        # generates, every slot reads busy here.
        return [self._lock.locked()] * len(self._slot_tokens)

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
        options = {"max_tokens": max_tokens, "sampling": sampling, "drafter": drafter, "draft_len": draft_len,
                   "stop": tuple(stop), "draft_max": draft_max, "draft_min": draft_min}
        return self._stream(prompt if isinstance(prompt, str) else list(prompt), options, cancel or threading.Event())

    def _stream(self, prompt, options: dict[str, Any], cancel: threading.Event) -> Iterator[Event]:
        if not self._lock.acquire(blocking=False):
            raise LocalspecError("This engine is already generating; one generation at a time.")
        try:
            if not self._alive():
                self._stop()
                self._start()
            conn = self._conn
            conn.send(("generate", prompt, options))
            told, finished = False, False
            try:
                while True:
                    if cancel.is_set() and not told:
                        conn.send(("cancel",))
                        told = True
                    if not conn.poll(0.05):
                        if not self._proc.is_alive() and not conn.poll():
                            raise EOFError
                        continue
                    kind, *payload = conn.recv()
                    if kind == "event":
                        yield payload[0]
                        if isinstance(payload[0], Summary):
                            self._info["baseline_tokens_per_s"] = payload[0].baseline_tokens_per_s
                    elif kind == "done":
                        finished = True
                        self._slot_tokens = payload[0]
                        return
                    elif kind == "failed":
                        finished = True
                        raise _ERRORS.get(payload[1], RuntimeError)(payload[0])
            except (EOFError, OSError):
                finished = True
                raise self._lost("in the middle of an answer") from None
            finally:
                if not finished and self._alive():  # the consumer stopped early: cancel, and keep the pipe in step
                    conn.send(("cancel",))
                    while True:
                        try:
                            if not conn.poll(30) or conn.recv()[0] in ("done", "failed"):
                                break
                        except (EOFError, OSError):
                            break
        finally:
            self._lock.release()

    def reset(self) -> None:
        """Nothing to forget on this side; the child's caches go with it at the next reload."""

    def maintain(self, interrupt: Callable[[], bool] = lambda: False) -> str:
        return ""  # the child maintains its engine between requests (_child)

    def close(self) -> None:
        self._stop()
        self.target.close()

    def __enter__(self) -> "HostedEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

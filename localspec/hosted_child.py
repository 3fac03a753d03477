"""The engine's child process (localspec/hosted.py): it loads the engine and serves the parent's
requests over a pipe, as the engine in process serves its front doors."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from localspec.engine.api import Engine
from localspec.engine.events import Summary
from localspec.errors import LocalspecError


def run(conn, opener: Callable[[], Engine], log: str) -> None:
    """The engine's process: `opener()` loads it, then it serves requests until told to close or the
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
        conn.send(("failed", None, *_said(exc)))
        return
    conn.send(("ready", {"n_ctx": engine.n_ctx, "drafters": engine.drafters,
                         "baseline_tokens_per_s": engine.baseline_tokens_per_s, "warnings": engine.warnings,
                         "slot_tokens": engine.slot_tokens()}))
    try:
        _serve(conn, engine)
    finally:
        engine.close()


def _said(exc: BaseException) -> tuple[str, str]:
    """An exception as the parent raises it again: its message and its class's name."""
    if isinstance(exc, LocalspecError):
        return str(exc), type(exc).__name__
    return f"The engine failed: {type(exc).__name__}: {exc}", "RuntimeError"


def _serve(conn, engine: Engine) -> None:
    """The child's policy: requests join the engine's steps as they arrive (as they do in process), each
    one's events sent as they come; between requests the engine does what it put off for a quiet
    moment. Messages in: ("submit", id, prompt, params, sequences, urgent), ("cancel", id, sequence or
    None for all), ("close",). Out: ("accepted" | "refused", id, ...), ("event", id, (sequence, event)),
    ("failed", id, message, class), ("slots", tokens, busy) after each change of who holds a slot."""
    cancels: dict[int, tuple[threading.Event, list[threading.Event]]] = {}
    left: dict[int, int] = {}  # summaries each request still owes

    def slots() -> None:
        conn.send(("slots", engine.slot_tokens(), engine.slots_busy()))

    def deliver_to(rid: int) -> Callable[[Any], None]:
        def deliver(item) -> None:
            if rid not in left:  # (its other sequences, once one failed)
                return
            if isinstance(item, Exception):
                conn.send(("failed", rid, *_said(item)))
                cancels[rid][0].set()
                left[rid] = 0
            else:
                conn.send(("event", rid, item))
                left[rid] -= isinstance(item[1], Summary)
            if not left[rid]:
                del left[rid]
                slots()
        return deliver

    def receive(message) -> bool:
        """One message handled; False for "close"."""
        if message[0] == "cancel":
            _, rid, sequence = message
            if rid in cancels:
                everyone, each = cancels[rid]
                (everyone if sequence is None else each[sequence]).set()
        elif message[0] == "submit":
            _, rid, prompt, params, sequences, urgent = message
            everyone, each = threading.Event(), [threading.Event() for _ in range(params.n)]
            cancels[rid], left[rid] = (everyone, each), len(sequences)
            try:
                engine.submit(prompt, params, deliver_to(rid), cancel=everyone, cancels=each,
                              sequences=sequences, urgent=urgent)
            except Exception as exc:
                del left[rid], cancels[rid]
                conn.send(("refused", rid, *_said(exc)))
                return True
            conn.send(("accepted", rid))
            slots()
        for rid in [rid for rid in cancels if rid not in left]:
            del cancels[rid]
        return message[0] != "close"

    maintained, working = True, False  # working: the engine holds lanes (cancelled ones too) to step
    try:
        while True:
            if not working and not maintained and not conn.poll(0.5):
                engine.maintain(interrupt=conn.poll)  # idle: what the engine put off for a quiet moment
                maintained = True
            while conn.poll(0 if working else None):
                if not receive(conn.recv()):
                    return
                working = working or bool(left)
            if working:
                maintained = False
                try:
                    working = engine.step()
                except Exception:
                    working = False  # every request in the step was handed the failure (Engine.step)
    except EOFError:
        return

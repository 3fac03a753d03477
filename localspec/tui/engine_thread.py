"""The chat app's engine on a thread of its own, the app's own thread at a lower priority, and the
interpreter's lock handed to the engine's thread soon after it asks.

llama.cpp decodes with a thread per core, and its threads wait for each other at every operation: a
core taken by the app's drawing stalls all of them, far beyond the share it takes. So on Linux the
thread that draws (the event loop) gives up its priority to the engine. A thread inherits the priority
of the thread that starts it, so this thread is started first: loading, reading answers and the work
between answers are asked from it, so the engine's driver thread (engine/driver.py), and llama.cpp's
threads in turn, start from it.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

# How long the engine's thread may wait for Python's interpreter lock while the app's thread runs Python
# (sys.setswitchinterval; Python's default is 5 ms). After every call into llama.cpp the engine's thread
# needs the lock back before its next decode, and llama.cpp's threads sit idle until it has it; while the
# app draws a frame, that wait is the whole interval.
ENGINE_SWITCH_S = 0.0005

# The kernel's lowest priority: the app draws on what llama.cpp's threads leave (between decodes, and the
# Python work of each round); on an idle machine it runs as fast as ever.
UI_NICE = 19


class EngineThread:
    """One long-lived thread for every call into the engine, started at its creator's priority."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-engine")
        self._pool.submit(int).result()  # the thread starts now, not at the first call

    def run(self, fn: Callable[..., T], /, *args, **kwargs) -> T:
        """`fn(*args, **kwargs)` on the engine's thread; the caller waits (a worker thread, not the loop)."""
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def lower_priority(nice: int = UI_NICE) -> bool:
    """Give the calling thread (only it, and threads it starts later) a lower priority. Linux sets it
    per thread; elsewhere it would lower the whole process, engine included, so nothing is done."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError:
        return False
    return True


def prefer_the_engine(interval_s: float = ENGINE_SWITCH_S) -> float:
    """The interpreter hands its lock to a waiting thread after `interval_s` (the engine's thread waits no
    longer than that behind the app's); returns the interval it had, for the app to put back."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(interval_s, before))
    return before

"""The engine's one thread: every call into its core runs here, and its loop is policy, then step.

A front door hands the driver work (`run`: a request added, an embedding, a measurement between
requests) and waits for it; the driver runs it between two steps. Which lanes step and when, what is
admitted, what runs between steps, is policy: readers that pull (`Pull`: the Python API, the chat
app; every lane steps while one waits for its next event) and, in a server, its scheduler (`Policy`:
admission, completions' share, calls between steps). So one thread owns the llama.cpp contexts
whoever submits, and a request from another thread joins the steps rather than being refused.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from concurrent.futures import Future
from typing import Callable, Iterator, Protocol, TypeVar

from localspec.engine.events import Summary

T = TypeVar("T")

# An idle driver's thread ends after this long and starts again with the next work, so an engine
# nobody uses holds no thread (and can be freed).
LINGER_S = 2.0


class Policy(Protocol):
    def wanted(self) -> bool:
        """(Holding the driver's lock.) Whether a turn has work: requests to admit or step, calls."""
        ...

    def turn(self) -> None:
        """One turn of the loop: admit, step, what runs between steps."""
        ...


class Driver:
    def __init__(self, name: str = "localspec-engine") -> None:
        self.changed = threading.Condition()  # guards the policy's queues; notified when work arrives
        self._calls: deque[Callable[[], None]] = deque()
        self._closing = False
        self.readers: Pull | None = None  # the pulling readers' policy (the engine sets it)
        self.policy: Policy | None = None  # a server's scheduler
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def here(self) -> bool:
        """Whether the caller is the driver's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def _start(self) -> None:
        """(Holding the lock.) The thread, if it is not running: it takes the priority of the thread
        that starts it, so work is handed over from a thread at the engine's priority."""
        if self._thread is None and not self._closing:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def drive(self, policy: Policy) -> None:
        """`policy` decides every turn from now on."""
        with self.changed:
            self.policy = policy
            self.wake()

    def run(self, fn: Callable[[], T]) -> T:
        """`fn()` on the driver's thread between two steps; the caller waits for its result (or its
        exception). On the driver's own thread it runs at once, as it does while the interpreter exits
        (no thread starts then, and none steps)."""
        if self.here or sys.is_finalizing():
            return fn()
        done: Future = Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        with self.changed:
            if self._closing:
                raise RuntimeError("The engine is closed.")
            self._calls.append(call)
            self.wake()
        return done.result()

    @property
    def pending(self) -> bool:
        """Whether a call or a reader waits: work between requests gives way to them."""
        return bool(self._calls) or (self.readers is not None and self.readers.wanted())

    def wake(self) -> None:
        """Work has arrived: the thread looks at it (and starts, where it had ended)."""
        with self.changed:
            self._start()
            self.changed.notify_all()

    def close(self, timeout: float = 30.0) -> bool:
        """Finish what the policy has, then stop; False if that took longer than `timeout`."""
        with self.changed:
            self._closing = True
            self.changed.notify_all()
        thread = self._thread
        if thread is None or self.here:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _wanted(self) -> bool:
        return self.pending or (self.policy is not None and self.policy.wanted())

    def _loop(self) -> None:
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self._wanted() or self._closing, timeout=LINGER_S)
                if not self._wanted():
                    self._thread = None
                    return
                calls, self._calls = self._calls, deque()
            for call in calls:
                call()
            for policy in (self.readers, self.policy):
                with self.changed:
                    turn = policy is not None and policy.wanted()
                if turn:
                    assert policy is not None
                    policy.turn()


class Pull:
    """The policy of readers that pull (the Python API, the chat app): while any reader waits for its
    next event, every lane steps; none waiting, nothing steps. A reader sees each step's events before
    the next step, as if it stepped the engine itself."""

    def __init__(self, driver: Driver, step: Callable[[], object], busy: Callable[[], bool]) -> None:
        self._driver = driver
        self._step = step
        self._busy = busy
        self._wants = 0  # readers waiting for an event since the last step began

    def wanted(self) -> bool:
        return self._wants > 0 and self._busy()

    def turn(self) -> None:
        with self._driver.changed:
            self._wants = 0
        try:
            self._step()
        except Exception:
            pass  # every lane was handed the failure (Core.drop); their readers raise it
        finally:
            self._driver.wake()

    def reader(self) -> "Reader":
        return Reader(self)


class Reader:
    """What one reader's lanes are handed, taken in order; waiting for it asks for a step."""

    def __init__(self, pull: Pull) -> None:
        self._pull = pull
        self._items: deque = deque()

    def __call__(self, item) -> None:  # (on the driver's thread, within a step)
        with self._pull._driver.changed:
            self._items.append(item)
            self._pull._driver.changed.notify_all()

    def __iter__(self) -> Iterator:
        return self

    def answers(self, sequences: int) -> Iterator:
        """(sequence, event) items until each of `sequences` has had its Summary; a failure handed over
        instead is raised."""
        left = sequences
        for item in self:
            if isinstance(item, Exception):
                raise item
            yield item
            left -= isinstance(item[1], Summary)
            if not left:
                return

    def __next__(self):
        """The next item, stepping the engine until one comes; StopIteration once nothing is left to
        step and nothing is held."""
        pull, changed = self._pull, self._pull._driver.changed
        if pull._driver.here:  # (read within the driver's own work: it steps)
            while not self._items and pull._busy():
                pull.turn()
        with changed:
            while not self._items:
                if not pull._busy():
                    raise StopIteration
                pull._wants += 1
                pull._driver.wake()
                changed.wait_for(lambda: bool(self._items) or pull._wants == 0 or not pull._busy())
            return self._items.popleft()

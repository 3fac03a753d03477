"""Who holds an engine: one thread's requests, or the measuring it does between requests.

The first request a thread submits takes the engine; the requests that thread adds while it steps
them share it; it is free again once none is left. Another thread's request meanwhile is refused (one
generation at a time for the Python API; the server has one thread). Measuring between requests
(`Engine.maintain`) holds it too, and lets go within one calibration batch when a request arrives.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Sequence

from localspec.engine.adaptive import CostModel
from localspec.engine.calibration import Calibrator
from localspec.engine.measuring import Interrupted
from localspec.engine.request import Request
from localspec.errors import LocalspecError


class Ownership:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None  # the thread whose requests hold it
        self._maintaining = False
        self.make_way = threading.Event()  # a request asks the measuring to stop

    def hold(self, busy: bool) -> None:
        """For this thread's next request; `busy`: requests of the holder are in the engine already."""
        if busy:
            if self._owner != threading.get_ident():
                raise LocalspecError("This engine is already generating; one generation at a time.")
            return
        if not self._lock.acquire(blocking=False):
            if not self._maintaining:
                raise LocalspecError("This engine is already generating; one generation at a time.")
            self.make_way.set()  # the measuring lets go within one calibration batch
            try:
                if not self._lock.acquire(timeout=30):
                    raise LocalspecError("The engine is busy measuring its costs; try again.")
            finally:
                self.make_way.clear()
        self._owner = threading.get_ident()

    def let_go(self, busy: bool) -> None:
        """Free once no request of the holder is left (`busy` False)."""
        if not busy and self._owner == threading.get_ident():
            self._owner = None
            self._lock.release()

    @contextlib.contextmanager
    def holding(self, busy: Callable[[], bool], requests: Sequence[Request] = ()) -> Iterator[None]:
        """This thread's requests hold it meanwhile, and it is free again after if none is left (`busy`:
        whether any is); `requests` are closed when another thread holds it."""
        try:
            self.hold(busy())
        except BaseException:
            for request in requests:
                request.close()
            raise
        try:
            yield
        finally:
            self.let_go(busy())

    @contextlib.contextmanager
    def quiet(self) -> Iterator[bool]:
        """The engine for measuring between requests, if nobody holds it (yields whether it got it)."""
        self._maintaining = True
        if not self._lock.acquire(blocking=False):
            self._maintaining = False
            yield False
            return
        try:
            yield True
        finally:
            self._maintaining = False
            self._lock.release()


def remeasure_when_quiet(calibrator: Calibrator | None, cost: CostModel, ownership: Ownership,
                         reset_measured: Callable[[], None], interrupt: Callable[[], bool]) -> str:
    """Between requests: measure the target's verify costs again when its calibration is due (untrusted
    at load, or contradicted by live rounds) and nobody holds the engine; `interrupt`, or a request that
    arrives, stops it between two batches. `reset_measured` empties the sequence measuring used.
    Returns what was done, "" for nothing."""
    if calibrator is None or not (why := calibrator.due):
        return ""
    measured = calibrator.measurements
    with ownership.quiet() as quiet:
        if not quiet:
            return ""
        try:
            fresh = calibrator.remeasure(cost.scale, interrupt=lambda: ownership.make_way.is_set() or interrupt())
        except Interrupted:
            fresh = None
        finally:
            if calibrator.measurements != measured:
                reset_measured()
    if fresh is None:
        return ""
    steady, changed = fresh.tables()
    cost.recalibrate(steady, calibrator.reference_scale, changed)
    return f"measured the target's verify costs again: {why}"

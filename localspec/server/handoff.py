"""A request's events from the engine's thread to the event loop that serves its client.

The engine's thread leaves each event in the request's box and never wakes the loop: a wake-up lets the
loop take the GIL between two decodes, and the next decode then waits for the loop's work on the event.
Instead each loop has one pump
that moves every box into its request's queue while requests are in flight, and stops when none is.
The pump sleeps until a little past the moment the engine's current step is due to end (`expect`: the
scheduler's thread says how long the step before took), then every HANDOFF_S until it ends: every wake-up
costs the loop's thread CPU that llama.cpp's threads would have had, and a step is many HANDOFF_S long.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Protocol

HANDOFF_S = 0.005
# Past a step's expected end, the pump's first look waits this much more: a step takes about what the one
# before took, give or take the Python around its decode, and a look that comes too soon costs a wake-up.
PAST_DUE_S = 0.002
# The longest the pump sleeps towards a step's expected end: a step that ends sooner than the one before
# (a speculative round that drafted less, the first token after a prompt) delays its events by at most this.
LONGEST_WAIT_S = 0.05


class Boxed(Protocol):
    box: collections.deque            # appended to by the engine's thread (thread-safe)
    events: asyncio.Queue | None      # read by the request's coroutine
    loop: asyncio.AbstractEventLoop | None


class Handoff:
    def __init__(self) -> None:
        self._watched: dict[asyncio.AbstractEventLoop, set[Any]] = {}  # in flight, per loop
        self._pumping: set[asyncio.AbstractEventLoop] = set()
        self._pumps: set[asyncio.Task] = set()
        self._due = 0.0  # (time.monotonic) when the engine's current step should end

    def expect(self, seconds: float) -> None:
        """(On the engine's thread, as a step starts.) It should take about this long: its events are
        collected from then on."""
        self._due = time.monotonic() + seconds

    @property
    def pumping(self) -> bool:
        return bool(self._pumping)

    def watch(self, request: Boxed) -> None:
        """(On the request's loop.) Its box is collected from now on."""
        loop = request.loop
        assert loop is not None
        requests = self._watched.setdefault(loop, set())
        requests.add(request)
        if loop not in self._pumping:
            self._pumping.add(loop)
            self._pumps.add(task := loop.create_task(self._pump(loop, requests)))
            task.add_done_callback(self._pumps.discard)

    def forget(self, request: Boxed) -> None:
        """(On the request's loop.) Its client has all it gets."""
        if request.loop is not None:
            self._watched.get(request.loop, set()).discard(request)

    async def _pump(self, loop: asyncio.AbstractEventLoop, requests: set[Any]) -> None:
        try:
            while requests:
                for request in list(requests):
                    box, events = request.box, request.events
                    while box:
                        events.put_nowait(box.popleft())
                await asyncio.sleep(min(max(self._due + PAST_DUE_S - time.monotonic(), HANDOFF_S), LONGEST_WAIT_S))
        finally:
            self._pumping.discard(loop)

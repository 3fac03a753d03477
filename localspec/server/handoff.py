"""A request's events from the engine's thread to the event loop that serves its client.

The engine's thread leaves each event in the request's box and never wakes the loop: a wake-up lets the
loop take the GIL between two decodes, and the next decode then waits for the loop's work on the event
(docs/history/2026-12-04-scheduler-over-core.md measures it per token). Instead each loop has one pump
that moves every box into its request's queue every HANDOFF_S while requests are in flight, and stops
when none is.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Protocol

HANDOFF_S = 0.005


class Boxed(Protocol):
    box: collections.deque            # appended to by the engine's thread (thread-safe)
    events: asyncio.Queue | None      # read by the request's coroutine
    loop: asyncio.AbstractEventLoop | None


class Handoff:
    def __init__(self) -> None:
        self._watched: dict[asyncio.AbstractEventLoop, set[Any]] = {}  # in flight, per loop
        self._pumping: set[asyncio.AbstractEventLoop] = set()
        self._pumps: set[asyncio.Task] = set()

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
                await asyncio.sleep(HANDOFF_S)
        finally:
            self._pumping.discard(loop)

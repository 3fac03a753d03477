"""The server's scheduler: the policy that drives the engine's thread (engine/driver.py) over the core
(`Engine.submit`, `step`), and the adapter between that thread and the event loop.

Each turn of the engine's thread admits what the policy lets in, takes one step of the requests in
the engine, and one step of a `call`. A request's events cross to the event loop
(server/handoff.py); a client that goes away sets the request's cancel event, and its request
ends at the next step. Requests that share a prompt prefix (an editor completing in one file, a
chat's next turn) reuse the KV cache the engine keeps in its slots.

The policy:
- a latency-bound request (`Job.urgent`: a completion at an editor's cursor, worth nothing late) does
  not wait for a chat's answer to end: it is admitted into a free slot, one at a time, and joins the
  steps of the answers being generated (its prompt in chunks that keep a step short); what it adds to
  those steps is held to URGENT_SHARE of the time (a token bucket of URGENT_BURST_S), beyond which the
  steps leave it out, so a chat keeps the rest however fast an editor asks; alone, it is stepped as
  any request; one its editor abandoned while it waited never runs;
- any other request is admitted while a slot is free (beyond one kept for completions while an editor
  has asked for one in the last EDITOR_IDLE_S): its prompt is evaluated in chunks within the
  following steps, then all are decoded in one `llama_decode` per step, so a second chat starts at
  once instead of after the first;
- a request for several sequences of one prompt (`GenerationParams.n`) is admitted when nothing else
  runs, as many of its sequences as the slots hold at a time, and nothing runs beside them.
Work that is not a generation (an embedding, `call`) runs one step per turn of the loop, so a batch
of texts to embed never stalls a chat for more than a step. Once nothing has arrived for
MAINTAIN_AFTER_IDLE_S the thread lets the engine do what it put off for a quiet moment (`maintain`:
measuring its costs again), which the next request interrupts.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Generator, TypeVar

from localspec.engine.events import Prefill, Summary
from localspec.engine.params import GenerationParams
from localspec.errors import EngineUnavailableError, LocalspecError
from localspec.server.handoff import Handoff
from localspec.server.metrics import Metrics, prometheus_text


@dataclass(eq=False)  # (one object per request: compared and hashed by identity)
class Job:
    """One request as the server queues it: its prompt and settings (fixed at the front door), and
    what the dialect and the scheduler track of it. Its events are (sequence, event)."""
    tokens: list[int]
    params: GenerationParams
    endpoint: str = ""
    urgent: bool = False       # latency-bound (a completion at an editor's cursor): joins running steps within a share
    cancel: threading.Event = field(default_factory=threading.Event)  # ends every sequence (the client left)
    cancels: list[threading.Event] = field(default_factory=list)     # each sequence's own
    limited: list[bool] = field(default_factory=list)  # the dialect ended it for an editor limit (n_indent, …)
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    box: collections.deque = field(default_factory=collections.deque)  # its events (server/handoff.py)

    def __post_init__(self) -> None:
        # (one sequence: its cancel is the request's, which an engine decoding one at a time watches)
        self.cancels = self.cancels or ([self.cancel] if self.params.n == 1 else
                                        [threading.Event() for _ in range(self.params.n)])
        self.limited = self.limited or [False] * self.params.n

    def limit(self, sequence: int) -> None:
        """The dialect ends this sequence: an editor's limit (n_indent, t_max_predict_ms) was reached."""
        self.limited[sequence] = True
        self.cancels[sequence].set()


class _Failed:
    def __init__(self, error: Exception):
        self.error = error


_END = object()
T = TypeVar("T")


def _settle(done: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if done.done():  # (its client left)
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)

# While an answer is generated, a completion joined to its steps may add at most this share of the time
# to them, after a first burst of this many seconds; between a chat's answers completions go first, so
# the chat keeps a little less than the rest. The trade (completion latency against the chat's rate) is
# measured by benchmarks/serve_suite.py --scenarios editor+chat (docs/performance.md, "Serving").
URGENT_SHARE = 0.2
URGENT_BURST_S = 1.0
# The engine measures its costs again between requests (Engine.maintain) only after this many seconds
# with none: a request arriving meanwhile waits for the batch being measured, and it must outlast the
# longest pause between a typing user's completion requests.
MAINTAIN_AFTER_IDLE_S = 5.0
# A slot is kept free for completions only while an editor is around: one asked for a completion within
# this many seconds. Without an editor every slot can hold a chat (4 chats at once with 4 slots).
EDITOR_IDLE_S = 600.0
# Requests that may wait for the engine; beyond it a request is refused at once with 503 (as Ollama's
# OLLAMA_MAX_QUEUE, 512) rather than held for minutes. Each waiting request holds its parsed body.
MAX_QUEUED = 256


def _as_served(exc: Exception) -> Exception:
    """What a client is told of a failure: a LocalspecError as it is, anything else as the engine's."""
    return exc if isinstance(exc, LocalspecError) else RuntimeError(f"The engine failed: {type(exc).__name__}: {exc}")


@dataclass(eq=False)
class _Admitted:
    """A job in the engine: its lanes, how many of its sequences were submitted and ended."""
    job: Job
    send: Callable[[Any], None]
    lanes: list = field(default_factory=list)
    next: int = 0  # its sequences submitted so far
    done: int = 0  # its sequences ended
    prefills: dict[int, Prefill] = field(default_factory=dict)

    def deliver(self, item: Any, scheduler: "Scheduler") -> None:
        """(sequence, event) of the job, or the exception that ended it."""
        if isinstance(item, Exception):
            scheduler._end(self, _as_served(item))
            return
        job, (i, event) = self.job, item
        if isinstance(event, Prefill):
            self.prefills[i] = event
            scheduler.recent.append((job.endpoint, job.params.max_tokens, event.prompt_tokens, event.cached))
        elif isinstance(event, Summary):
            scheduler.metrics.count(event, self.prefills.get(i), job.limited[i])
        self.send(item)
        if isinstance(event, Summary):
            self.done += 1
            if self.done == job.params.n:
                scheduler._end(self)


class Scheduler:
    def __init__(self, engine, interject: bool = True, clock=time.monotonic, batch: bool = True):
        self.engine = engine
        self._clock = clock
        self.metrics = Metrics()
        # The latest requests, newest last: (endpoint, token budget, prompt tokens, of them reused from the cache).
        self.recent: collections.deque[tuple[str, int, int, int]] = collections.deque(maxlen=64)
        self._jobs: collections.deque[Job] = collections.deque()    # waiting, in arrival order
        self._urgent: collections.deque[Job] = collections.deque()  # waiting latency-bound jobs
        self._chores: collections.deque[Callable[[], bool]] = collections.deque()  # `call`s: True once finished
        self._driver = engine.driver  # the engine's one thread; this scheduler is its policy
        self._changed = self._driver.changed  # guards the queues; notified when work arrives or on close
        self._closing = False
        self.interject = interject and engine.concurrent
        self.batch = batch and engine.concurrent
        self._active: list[_Admitted] = []  # jobs in the engine now, oldest first
        self.interjected = 0  # urgent jobs run beside another generation so far
        self.joined = 0       # jobs admitted while others generated so far
        self._allowance = URGENT_BURST_S  # seconds urgent jobs may take now from the answers being generated
        self._allowance_at = clock()
        self._editor_at: float | None = None  # when the latest urgent job arrived
        self.maintenance = ""  # what the engine last did between requests
        self._handoff = Handoff()  # (event-loop side) events from this thread to the clients' loops
        self._others_step_s = 0.0  # how long a step of the other answers takes without a completion (average)
        self._step_s = 0.0  # how long the latest step took: the next one's events are expected as long after
        engine.queued = self._queued  # shared steps price drafts by whether requests wait for a slot
        self._driver.drive(self)

    @property
    def waiting(self) -> int:
        """Requests running or waiting."""
        return len(self._jobs) + len(self._urgent) + self.running

    @property
    def running(self) -> int:
        return len(self._active)

    async def generate(self, job: Job) -> AsyncIterator[Any]:
        """(sequence, event) of one request's sequences. Raises LocalspecError
        (bad request) before the first event.

        Closing the iterator early (a client that disconnected) cancels the generation.
        """
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        self.metrics.requests[job.endpoint] = self.metrics.requests.get(job.endpoint, 0) + 1
        with self._changed:
            self._check_room()
            if job.urgent:
                self._editor_at = self._clock()
            (self._urgent if job.urgent and self.interject else self._jobs).append(job)
            self._driver.wake()
        self._handoff.watch(job)
        finished = False
        try:
            while True:
                item = await job.events.get()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, _Failed):
                    finished = True
                    raise item.error
                yield item
        finally:
            self._handoff.forget(job)
            if not finished:
                job.cancel.set()

    async def call(self, steps: Generator[T | None, None, None], endpoint: str = "") -> T:
        """Run `steps` on the engine's thread, one `next` at a time (between two rounds of the generations
        running, or back to back when none runs), to its first value that is not None, which is returned.
        One call's steps run before the next call's start (they may share a sequence: an embedding's). A
        client that leaves abandons it at its next step; an exception in a step is raised here."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def chore() -> bool:
            if done.done():
                steps.close()
                return True
            try:
                value = next(steps)
            except StopIteration:  # (a future cannot hold StopIteration)
                loop.call_soon_threadsafe(_settle, done, None, RuntimeError("The work ended without a result."))
                return True
            except BaseException as exc:
                loop.call_soon_threadsafe(_settle, done, None, exc)
                return True
            if value is None:
                return False
            loop.call_soon_threadsafe(_settle, done, value, None)
            return True

        if endpoint:
            self.metrics.requests[endpoint] = self.metrics.requests.get(endpoint, 0) + 1
        with self._changed:
            self._check_room()
            self._chores.append(chore)
            self._driver.wake()
        return await done

    def _check_room(self) -> None:
        """(Holding `_changed`.) A 503 for a request the server will not queue."""
        if self._closing:
            raise EngineUnavailableError("The server is shutting down.")
        if len(self._jobs) + len(self._urgent) + len(self._chores) >= MAX_QUEUED:
            raise EngineUnavailableError(f"The server is busy: {MAX_QUEUED} requests are waiting already; "
                                         "try again shortly.")

    def _chore(self) -> None:
        """One step of the oldest call, if any (it keeps its place until it finishes)."""
        with self._changed:
            if not self._chores:
                return
            chore = self._chores[0]
        if chore():
            with self._changed:
                self._chores.popleft()

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking work, let the running generation end, then free the models."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if self._driver.close(timeout):
            self.engine.close()

    def wanted(self) -> bool:
        """(Holding `_changed`.) Whether a turn has work."""
        return bool(self._jobs or self._urgent or self._chores or self._active)

    def turn(self) -> None:
        """A turn of the engine's thread: admit what the policy lets in, step, one step of a `call`; once
        nothing has arrived for a while, the engine's maintenance."""
        self._admit()
        if self._active:
            self._step()
            if not self._active and self._idle_for(MAINTAIN_AFTER_IDLE_S):
                self._maintain()
        self._chore()

    # ------------------------------------------------------------------ admission (the policy)

    def _admit(self) -> None:
        """Waiting jobs into the engine, as the policy says:
        - a job whose client left while it waited only ends;
        - an urgent job (an editor's completion) first, one at a time, into a free slot; it joins the
          others' steps within its share of the time (`_step`);
        - several sequences of one prompt when nothing else runs, and nothing beside them;
        - any other job while slots are free, beyond one kept for completions while an editor is around
          (`EDITOR_IDLE_S`): its prompt is evaluated in chunks within the following steps."""
        if any(a.job.params.n > 1 or a.job.urgent for a in self._active):
            return
        with self._changed:
            for queue in (self._urgent, self._jobs):
                for job in [j for j in queue if j.cancel.is_set()]:
                    del queue[next(i for i, j in enumerate(queue) if j is job)]
                    self._sender(job)(_END)
        if self._urgent and self._urgent_may_run():
            with self._changed:
                job = self._urgent.popleft()
            self.interjected += bool(self._active)
            self._submit(job)
            return
        while self._jobs and (not self._active or (self.batch and self.engine.free_slots() > self._kept())):
            with self._changed:
                job = self._jobs[0]
                # (an urgent one here: completions wait their turn)
                if (job.params.n > 1 or job.urgent) and self._active:
                    return
                self._jobs.popleft()
            self.joined += bool(self._active)
            self._submit(job)
            if job.params.n > 1:
                return

    def _urgent_may_run(self) -> bool:
        return not self._active or (self.interject and self.engine.free_slots() > 0)

    def _refill(self) -> None:
        now = self._clock()
        self._allowance = min(URGENT_BURST_S, self._allowance + URGENT_SHARE * (now - self._allowance_at))
        self._allowance_at = now

    def _kept(self) -> int:
        """Slots kept free for an editor's completions while chats run."""
        return 1 if self.interject and self._editor_around() else 0

    def _queued(self) -> bool:
        """Requests wait for a slot: every slot the generation may take is busy and a request waits
        to join (read on the engine's thread, between its steps)."""
        return bool(self._jobs) and self.engine.free_slots() <= self._kept()

    def _editor_around(self) -> bool:
        return self._editor_at is not None and self._clock() - self._editor_at < EDITOR_IDLE_S

    def _submit(self, job: Job) -> None:
        """The job into the engine; its events go to its client as each step hands them over."""
        admitted = _Admitted(job, self._sender(job))
        urgent = job.urgent and bool(self._active)  # (alone, a completion drafts as any request)
        self._active.append(admitted)
        self._submit_wave(admitted, urgent)

    def _submit_wave(self, admitted: "_Admitted", urgent: bool = False) -> None:
        """The job's next sequences, one per free slot (all of them when the slots suffice)."""
        job = admitted.job
        first = admitted.next
        sequences = range(first, min(first + max(self.engine.free_slots(), 1), job.params.n))
        admitted.next = sequences.stop
        try:
            admitted.lanes = self.engine.submit(job.tokens, job.params, lambda item: admitted.deliver(item, self),
                                               cancel=job.cancel, cancels=job.cancels, sequences=sequences,
                                               urgent=urgent)
        except Exception as exc:
            self._end(admitted, _as_served(exc))

    # ------------------------------------------------------------------ steps

    def _step(self) -> None:
        """One step of every job together; an urgent job beside others is left out once it has taken its
        share (`_allowance`: what it adds to their steps, against their recent steps without it). A failure
        no request survives ends every job in the engine."""
        urgent = any(a.job.urgent for a in self._active)
        others = [lane for a in self._active if not a.job.urgent for lane in a.lanes]
        joined = urgent and bool(others)
        if joined:
            self._refill()
        only = others if joined and self._allowance <= 0 else None
        started = self._clock()
        self._handoff.expect(self._step_s)
        began = time.monotonic()
        try:
            more = self.engine.step(only)
        except Exception as exc:  # keep serving after an engine failure; each client gets a 500
            more = False
            for admitted in list(self._active):
                self._end(admitted, _as_served(exc))
        self._step_s = time.monotonic() - began
        took = self._clock() - started
        if others and (not urgent or only is not None):
            self._others_step_s = 0.8 * self._others_step_s + 0.2 * took if self._others_step_s else took
        elif joined:  # what the completion added to the others' step
            self._allowance -= max(took - self._others_step_s, 0.0)
        waves = [a for a in self._active if a.done == a.next < a.job.params.n]
        for admitted in waves:
            self._submit_wave(admitted)  # into the slots its last completions left
        if not (more or waves):  # (never: the engine ends each request with its summary or error)
            for admitted in list(self._active):
                self._end(admitted, RuntimeError("The engine let go of the request before its end."))

    def _end(self, admitted: "_Admitted", error: Exception | None = None) -> None:
        """The job's client has all it gets (an error, where one ended it)."""
        if not any(a is admitted for a in self._active):
            return
        self._active.remove(admitted)
        if error is not None:
            self.metrics.errors += 1
            admitted.job.cancel.set()  # (its other sequences end too)
            admitted.send(_Failed(error))
        admitted.send(_END)

    def _idle_for(self, seconds: float) -> bool:
        """True when no request arrived for this long: a measurement between requests makes the next
        one wait for its current batch, so it starts only once requests have paused."""
        with self._changed:
            return not self._changed.wait_for(lambda: self._jobs or self._urgent or self._chores or self._closing
                                              or self._driver.pending,
                                              timeout=seconds)

    def _maintain(self) -> None:
        started = self._clock()
        try:
            done = self.engine.maintain(interrupt=lambda: bool(self._jobs or self._urgent or self._chores))
        except Exception as exc:  # maintenance must never take the server down
            done = f"maintenance failed: {type(exc).__name__}: {exc}"
        if done:
            self.maintenance = done
            print(f"Between requests ({self._clock() - started:.1f} s): {done}", file=sys.stderr, flush=True)

    @staticmethod
    def _sender(job: Job) -> Callable[[Any], None]:
        return job.box.append  # (thread-safe; server/handoff.py takes it to the loop)

    def prometheus(self, model: str) -> str:
        return prometheus_text(self.metrics, model, queue_depth=self.waiting, running=self.running,
                               interjected=self.interjected, joined=self.joined,
                               slot_tokens=self.engine.slot_tokens())

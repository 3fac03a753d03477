"""One thread owns the engine; requests take their turn in arrival order, an editor's completion
runs between two rounds of whatever is generating, and with slots to spare a request that arrives
while another generates joins it.

A request's events cross from that thread to the event loop through an asyncio queue. A client that
goes away sets the request's cancel event, which the engine checks between rounds, so the engine is
free again within one round. Consecutive requests that share a prompt prefix (an editor completing
in one file, a chat's next turn) reuse the engine's KV cache for that prefix. A latency-bound request
(`Job.urgent`: a completion at an editor's cursor, worth nothing late) does not wait for a chat's
answer to end: the chat pauses between two rounds while it runs on another slot
(`Engine.generate(interject=True)`), then carries on. Completions may take at most URGENT_SHARE of the
engine's time while another answer is generated (a token bucket of URGENT_BURST_S), so a chat keeps
the rest however fast an editor asks; a completion its editor abandoned while it waited never runs.
A request that arrives while another generates joins it when a slot is free (beyond one kept for
completions while an editor has asked for one in the last EDITOR_IDLE_S) (`Engine.join`): its prompt
is evaluated in chunks within the following steps, then both are decoded in one `llama_decode` per
step, so a second chat starts at once instead of after the first; once the first ends, the others go
on (`Engine.step_guests`) and what arrives meanwhile joins them.
Work that is not a generation (an embedding, `call`) runs on the same thread one step at a time: between
two rounds of whatever generates, or at once when nothing does, so a batch of texts to embed never
stalls a chat for more than a step.
Once nothing has arrived for MAINTAIN_AFTER_IDLE_S the thread lets the engine do what it put off for a
quiet moment (`maintain`: measuring its costs again), which the next request interrupts.
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
from localspec.errors import EngineUnavailableError, LocalspecError


@dataclass
class Job:
    tokens: list[int]
    max_tokens: int
    sampling: object
    stop: tuple[str, ...] = ()
    drafter: str | None = None
    draft_len: int | None | str = "default"
    endpoint: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    limited: bool = False      # the dialect ended it for an editor limit (n_indent, t_max_predict_ms)
    urgent: bool = False       # latency-bound (a completion at an editor's cursor): runs between another's rounds
    # Several completions of one prompt (llama.cpp's n_cmpl): each one's job (sampling, cancel, limited),
    # decoded together by the engine (generate_many); this job's own cancel ends them all, and its
    # events are (which completion, event).
    group: list["Job"] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None


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

# While an answer is generated, completions run between its rounds in at most this share of the time,
# after a first burst of this many seconds. Between a chat's answers they run first, so the chat keeps
# less than the rest: with 0.3 it kept 58-61% of its solo speed on two 2-core EPYCs (AVX2: completions
# p50 0.9-1.1 s; AVX-512: 0.6 s, p90 1.0-1.9 s), with 0.25 57-71% (median 66%; p50 0.65-0.68 s, p90
# 1.7-2.5 s), with 0.4 51-55%. Measured: scripts/serve_suite.py --scenarios editor+chat
# (docs/performance.md, "Completions while a chat streams", "The serving benchmark").
URGENT_SHARE = 0.25
URGENT_BURST_S = 1.0
# The engine measures its costs again between requests (Engine.maintain) only after this many seconds
# with none: a request arriving meanwhile waits for the batch being measured (up to ~1.5 s on a 2-core
# CPU), and a typing session's requests come 0.8 s apart at the median, at most 3.2 s
# (assets/fim-session.jsonl).
MAINTAIN_AFTER_IDLE_S = 5.0
# A slot is kept free for completions only while an editor is around: one asked for a completion within
# this many seconds. Without an editor every slot can hold a chat (4 chats at once with 4 slots).
EDITOR_IDLE_S = 600.0
# Requests that may wait for the engine; beyond it a request is refused at once with 503 (as Ollama's
# OLLAMA_MAX_QUEUE, 512) rather than held for minutes. Each waiting request holds its parsed body.
MAX_QUEUED = 256


@dataclass
class Metrics:
    requests: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_chunks: int = 0  # evaluations of prompts spread over others' steps (beyond one per prompt)
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0
    generation_seconds: float = 0.0
    last_tokens_per_s: float = 0.0
    last_speedup: float = 0.0

    def count(self, summary: Summary, prefill: Prefill | None, limited: bool = False) -> None:
        self.generated_tokens += summary.generated_tokens
        self.drafted_tokens += summary.drafted
        self.accepted_tokens += summary.accepted
        self.rounds += summary.rounds
        self.generation_seconds += summary.wall_s
        self.last_tokens_per_s = summary.tokens_per_s
        self.last_speedup = summary.speedup
        if summary.stop_reason == "cancelled" and not limited:  # a completion ended by its own limits is not
            self.cancelled += 1                                  # a cancelled one (llama.cpp: stop_type "limit")
        if prefill:
            self.prompt_tokens += prefill.prompt_tokens
            self.prompt_tokens_cached += prefill.cached
            self.prompt_chunks += prefill.chunks - 1


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
        self._changed = threading.Condition()  # guards both queues; notified when a job arrives or on close
        self._closing = False
        self.interject = interject and engine.interjects
        self.batch = batch and engine.joins
        self._running = 0  # jobs generating now (one; more while others run between its rounds or joined it)
        self._guests: list[Job] = []  # jobs that joined the running generation
        self.interjected = 0  # urgent jobs run between another's rounds so far
        self.joined = 0       # jobs that joined another's generation so far
        self._allowance = URGENT_BURST_S  # seconds urgent jobs may take now from the answer being generated
        self._allowance_at = clock()
        self._editor_at: float | None = None  # when the latest urgent job arrived
        self.maintenance = ""  # what the engine last did between requests
        engine.queued = self._queued  # shared steps price drafts by whether requests wait for a slot
        self._thread = threading.Thread(target=self._work, name="localspec-engine", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Requests running or waiting."""
        return len(self._jobs) + len(self._urgent) + self._running

    @property
    def running(self) -> int:
        return self._running

    async def generate(self, job: Job) -> AsyncIterator[Any]:
        """Events of one request, or (which completion, event) for a `Job.group`. Raises LocalspecError
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
            self._changed.notify()
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
            self._changed.notify()
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
            self._changed.notify()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.engine.close()

    def _next(self) -> Job | None:
        """The next waiting job (latency-bound ones first), taken off its queue."""
        with self._changed:
            if self._urgent:
                return self._urgent.popleft()
            return self._jobs.popleft() if self._jobs else None

    def _work(self) -> None:
        while True:
            with self._changed:
                while not (self._jobs or self._urgent or self._chores or self._closing):
                    self._changed.wait()
                if self._closing and not (self._jobs or self._urgent or self._chores):
                    return
            job = self._next()
            if job is None:
                self._chore()
                continue
            self._run(job, between=None if job.urgent else self._between)
            if self._idle_for(MAINTAIN_AFTER_IDLE_S):
                self._maintain()

    def _between(self) -> None:
        """Between two rounds of the running generation: waiting requests join it while slots are free
        (beyond one kept for completions while an editor is around), then a waiting completion may run."""
        self._join_waiting(host_running=True)
        if self._urgent:
            self._run_urgent()
        self._chore()

    def _run_urgent(self) -> None:
        """Between two rounds of a generation: run the oldest urgent job still wanted, on another slot,
        if the generation has had its share of the time since the last one."""
        while self._urgent and self._urgent[0].cancel.is_set():
            self._run(self._urgent.popleft())  # (its client left: it only ends)
        now = self._clock()
        self._allowance = min(URGENT_BURST_S, self._allowance + URGENT_SHARE * (now - self._allowance_at))
        self._allowance_at = now
        if not self._urgent or self._allowance <= 0 or not self._free_slot():
            return
        self.interjected += 1
        self._run(self._urgent.popleft(), interject=True)
        self._allowance -= self._clock() - now

    def _free_slot(self) -> bool:
        return not self.batch or self.engine.free_slots() > 0

    def _join_waiting(self, host_running: bool) -> None:
        """The waiting requests join the generation, oldest first, while slots are free (with
        `host_running` and an editor around, beyond one kept for its completions, and completions
        themselves run between its rounds or wait for it, as --no-interject says). They join at once:
        their prompts are evaluated in chunks within the following steps, the oldest first (so each
        starts as soon as the ones before it allow, and none waits a round to be admitted). Several
        completions of one prompt (a group) wait for their turn."""
        keep = 1 if host_running and self.interject and self._editor_around() else 0
        while self.batch and self.engine.free_slots() > keep:
            with self._changed:
                waiting = [*self._jobs] if host_running else [*self._urgent, *self._jobs]
                job = next((j for j in waiting if not j.group and not (host_running and j.urgent)), None)
                if job is None:
                    return
                for queued in (self._urgent, self._jobs):
                    if any(j is job for j in queued):
                        del queued[next(i for i, j in enumerate(queued) if j is job)]
            self._join(job)

    def _queued(self) -> bool:
        """Requests wait for a slot: every slot the generation may take is busy and a request waits
        to join (read on the engine's thread, between its steps)."""
        keep = 1 if self.interject and self._editor_around() else 0
        return bool(self._jobs) and self.engine.free_slots() <= keep

    def _editor_around(self) -> bool:
        return self._editor_at is not None and self._clock() - self._editor_at < EDITOR_IDLE_S

    def _join(self, job: Job) -> None:
        send = self._sender(job)
        if job.cancel.is_set():  # the client left while waiting
            send(_END)
            return
        prefill: list[Prefill] = []

        def deliver(event) -> None:
            if isinstance(event, Exception):  # its own evaluation failed (engine/parallel.py); others go on
                self.metrics.errors += 1
                self._guests.remove(job)
                self._running -= 1
                send(_Failed(event if isinstance(event, LocalspecError) else
                             RuntimeError(f"The engine failed: {type(event).__name__}: {event}")))
                send(_END)
                return
            if isinstance(event, Prefill):
                prefill.append(event)
                self.recent.append((job.endpoint, job.max_tokens, event.prompt_tokens, event.cached))
            send(event)
            if isinstance(event, Summary):
                self.metrics.count(event, prefill[0] if prefill else None, job.limited)
                self._guests.remove(job)
                self._running -= 1
                send(_END)

        self._running += 1
        self._guests.append(job)
        try:
            self.engine.join(job.tokens, deliver, max_tokens=job.max_tokens, sampling=job.sampling, stop=job.stop,
                             cancel=job.cancel, drafter=job.drafter)
            self.joined += 1
        except Exception as exc:
            self._guests.remove(job)
            self._running -= 1
            self.metrics.errors += 1
            send(_Failed(exc if isinstance(exc, LocalspecError) else
                         RuntimeError(f"The engine failed: {type(exc).__name__}: {exc}")))
            send(_END)

    def _idle_for(self, seconds: float) -> bool:
        """True when no request arrived for this long: a measurement between requests makes the next
        one wait for its current batch, so it starts only once requests have paused."""
        with self._changed:
            return not self._changed.wait_for(lambda: self._jobs or self._urgent or self._chores or self._closing,
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
    def _sender(job: Job):
        loop, events = job.loop, job.events
        assert loop is not None and events is not None  # set by generate() before the job is queued
        put = events.put_nowait

        def send(item) -> None:
            loop.call_soon_threadsafe(put, item)

        return send

    def _run(self, job: Job, between=None, interject: bool = False) -> None:
        """Run one job to its end; `between` is called between its rounds (the engine waits meanwhile),
        and after it, while requests that joined it go on."""
        send = self._sender(job)
        if job.cancel.is_set():  # the client left while waiting in the queue
            send(_END)
            return
        self._running += 1
        ended = False
        try:
            options = {"interject": True} if interject else {}
            if job.group:
                self._run_group(job, send, options)
                return
            prefill = None
            events = self.engine.generate(job.tokens, max_tokens=job.max_tokens, sampling=job.sampling,
                                          drafter=job.drafter, draft_len=job.draft_len, stop=job.stop,
                                          cancel=job.cancel, **options)
            for event in events:
                if isinstance(event, Prefill):
                    prefill = event
                    self.recent.append((job.endpoint, job.max_tokens, event.prompt_tokens, event.cached))
                elif isinstance(event, Summary):
                    self.metrics.count(event, prefill, job.limited)
                send(event)
                if isinstance(event, Summary):  # its client has all it asked for, whoever goes on
                    ended = True
                    self._running -= 1
                    send(_END)
                elif between is not None and (self._urgent or self._jobs or self._chores):
                    between()
            while self.engine.step_guests():  # requests that joined it go on; what waits may join them
                self._join_waiting(host_running=False)
                self._chore()
        except Exception as exc:  # keep serving after an engine failure; the client gets a 500
            self.metrics.errors += 1
            error = exc if isinstance(exc, LocalspecError) else RuntimeError(
                f"The engine failed: {type(exc).__name__}: {exc}")
            if not ended:
                send(_Failed(error))
            if between is not None:
                self._guests_after_failure(error)
        finally:
            if not ended:
                self._running -= 1
                send(_END)

    def _guests_after_failure(self, error: Exception) -> None:
        """The generation others joined failed. Where only its own evaluation did, they go on; where the
        engine let go of them, each gets the error."""
        try:
            while self.engine.step_guests():
                self._join_waiting(host_running=False)
                self._chore()
        except Exception as exc:  # (the engine let go of them)
            error = exc if isinstance(exc, LocalspecError) else RuntimeError(
                f"The engine failed: {type(exc).__name__}: {exc}")
        for guest in list(self._guests):
            self._guests.remove(guest)
            self._running -= 1
            self._sender(guest)(_Failed(error))
            self._sender(guest)(_END)

    def _run_group(self, job: Job, send, options: dict) -> None:
        """Several completions of one prompt, decoded together; nothing runs between their steps."""
        group = job.group
        prefills: dict[int, Prefill] = {}
        events = self.engine.generate_many(job.tokens, [j.sampling for j in group], max_tokens=job.max_tokens,
                                           stop=job.stop, drafter=job.drafter, cancel=job.cancel,
                                           cancels=[j.cancel for j in group], **options)
        for i, event in events:
            if isinstance(event, Prefill):
                prefills[i] = event
                self.recent.append((job.endpoint, job.max_tokens, event.prompt_tokens, event.cached))
            elif isinstance(event, Summary):
                self.metrics.count(event, prefills.get(i), group[i].limited)
            send((i, event))

    def prometheus(self, model: str) -> str:
        m = self.metrics
        label = f'model="{model}"'
        lines = [
            "# HELP localspec_requests_total Requests by endpoint.",
            "# TYPE localspec_requests_total counter",
            *[f'localspec_requests_total{{{label},endpoint="{e}"}} {n}' for e, n in sorted(m.requests.items())],
        ]

        def metric(name: str, kind: str, help_: str, value) -> None:
            lines.extend([f"# HELP localspec_{name} {help_}", f"# TYPE localspec_{name} {kind}",
                          f"localspec_{name}{{{label}}} {value}"])

        metric("errors_total", "counter", "Generations that failed.", m.errors)
        metric("cancelled_total", "counter", "Generations cancelled (the client went away).", m.cancelled)
        metric("prompt_tokens_total", "counter", "Prompt tokens received.", m.prompt_tokens)
        metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from the KV cache.", m.prompt_tokens_cached)
        metric("prompt_chunks_total", "counter", "Extra evaluations of prompts evaluated in chunks within other "
               "requests' steps (a prompt in 3 chunks counts 2).", m.prompt_chunks)
        metric("generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens)
        metric("drafted_tokens_total", "counter", "Draft tokens proposed.", m.drafted_tokens)
        metric("accepted_tokens_total", "counter", "Draft tokens the target accepted.", m.accepted_tokens)
        metric("rounds_total", "counter", "Draft/verify rounds.", m.rounds)
        metric("generation_seconds_total", "counter", "Time spent generating.", round(m.generation_seconds, 6))
        metric("tokens_per_second", "gauge", "Throughput of the last generation.", round(m.last_tokens_per_s, 3))
        metric("speedup", "gauge", "Speedup over plain decoding of the last generation.", round(m.last_speedup, 3))
        metric("queue_depth", "gauge", "Requests running or waiting.", self.waiting)
        metric("requests_running", "gauge", "Requests generating now (an editor's completion runs between a chat's "
               "rounds).", self.running)
        metric("interjected_total", "counter", "Completions run between the rounds of another generation.",
               self.interjected)
        metric("joined_total", "counter", "Requests that joined another's generation (decoded in the same steps).",
               self.joined)
        lines += ["# HELP localspec_slot_tokens Tokens held in each KV slot (what a request with that prefix reuses).",
                  "# TYPE localspec_slot_tokens gauge",
                  *[f'localspec_slot_tokens{{{label},slot="{i}"}} {n}'
                    for i, n in enumerate(self.engine.slot_tokens())]]
        return "\n".join(lines) + "\n"

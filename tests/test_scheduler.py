"""The server's scheduler on the real engine over the toy model: an editor's completion runs between
the rounds of a long answer instead of after it, and both answers are their solo answers."""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.events import Prefill, Summary, answer_tokens
from localspec.engine.params import GenerationParams
from localspec.server.scheduler import Job, Scheduler
from test_engine_toy import COST, _plain
from toy import ToyModel

CHAT = [0, 5, 9, 11, 13, 5, 9]
COMPLETION = [0, 20, 21, 22, 23, 20, 21]


class SlowToy(ToyModel):
    """Every decode takes a little while, as a real one does (so requests overlap), and 0.1 s on `clock`
    (the scheduler's clock: what each sequence's decodes cost, without timing anything)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.clock = 0.0
        self.log: list[tuple[int, float]] = []  # (sequence, clock) of every decode

    def decode(self, tokens, start, logits_for, seq=0):
        time.sleep(0.003)
        self.clock += 0.1
        self.log.append((seq, self.clock))
        return super().decode(tokens, start, logits_for, seq)


def _engine() -> Engine:
    return Engine(SlowToy(seed=3, n_seq=2), ToyModel(seed=3, noise_seed=103, noise=1.5),
                  EngineOptions(learn_costs=False), cost=CostModel(dict(COST)), draft_cost_s=0.01)


def _scheduler(interject: bool = True) -> Scheduler:
    engine = _engine()
    return Scheduler(engine, interject=interject, clock=lambda: engine.target.clock)


async def _run(scheduler: Scheduler, job: Job, finished: list[str], name: str) -> list:
    events = [event async for _seq, event in scheduler.generate(job)]
    assert isinstance(events[-1], Summary)
    finished.append(name)
    return events


async def _chat_then_completion(scheduler: Scheduler) -> tuple[list, list, list[str]]:
    finished: list[str] = []
    chat = asyncio.create_task(_run(scheduler, Job(CHAT, GenerationParams(200), endpoint="chat"), finished, "chat"))
    while not scheduler.running:  # the chat is generating
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.02)
    completion = await _run(scheduler, Job(COMPLETION, GenerationParams(12), endpoint="infill", urgent=True),
                            finished, "completion")
    assert scheduler.waiting <= 1  # the chat, if it still runs (the completion's wake-up is not a request)
    return await chat, completion, finished


@pytest.mark.parametrize("interject", [True, False])
def test_a_completion_runs_between_the_rounds_of_a_long_answer(interject):
    assert len(_plain(CHAT, 200)) >= 60  # a long answer: the completion arrives while it is generated
    scheduler = _scheduler(interject)
    try:
        chat, completion, finished = asyncio.run(_chat_then_completion(scheduler))
    finally:
        scheduler.close()
    assert answer_tokens(chat) == _plain(CHAT, 200)
    assert answer_tokens(completion) == _plain(COMPLETION, 12)
    if interject:
        assert finished == ["completion", "chat"] and scheduler.interjected == 1
        assert "localspec_interjected_total{model=\"toy\"} 1" in scheduler.prometheus("toy")
    else:  # --no-interject: it waits for the whole answer
        assert finished == ["chat", "completion"] and scheduler.interjected == 0


COMPLETIONS = [[0, 20, 21, 22, 23, 20, 21], [0, 4, 4, 4, 4], [0, 30, 2, 3, 17, 30, 2], [0, 8, 9, 10, 8, 9],
               [0, 12, 14, 16, 12, 14], [0, 40, 41, 42, 40, 41]]


async def _chat_with_many_completions(scheduler: Scheduler) -> tuple[list, list[list], list[str]]:
    finished: list[str] = []
    chat = asyncio.create_task(_run(scheduler, Job(CHAT, GenerationParams(400, drafter="none"), endpoint="chat"),
                                    finished, "chat"))  # (plain: a round per token, a long answer)
    while not scheduler.running:
        await asyncio.sleep(0.001)
    completions = await asyncio.gather(*[
        _run(scheduler, Job(prompt, GenerationParams(12, drafter="none"), endpoint="infill", urgent=True),
             finished, f"completion {i}") for i, prompt in enumerate(COMPLETIONS)])
    return await chat, completions, finished


def test_completions_take_at_most_their_share_of_a_generating_answer():
    """Six completions at once while a chat generates: one at a time, each joins the chat's steps, but
    together they add at most URGENT_SHARE of the time to them (after URGENT_BURST_S), so the chat keeps
    the rest; every answer is its solo answer."""
    from localspec.server.scheduler import URGENT_BURST_S, URGENT_SHARE

    scheduler = _scheduler()
    try:
        chat, completions, finished = asyncio.run(_chat_with_many_completions(scheduler))
    finally:
        scheduler.close()
    assert answer_tokens(chat) == _plain(CHAT, 400)
    assert [answer_tokens(c) for c in completions] == [_plain(p, 12) for p in COMPLETIONS]
    assert finished[-1] == "chat" and scheduler.interjected == len(COMPLETIONS)
    log = scheduler.engine.target.log
    chat_seq = log[0][0]
    first = next(i for i, (seq, _t) in enumerate(log) if seq != chat_seq)
    last = max(i for i, (seq, _t) in enumerate(log) if seq != chat_seq)
    span = log[first:last + 1]  # from the first completion's decode to the last one's
    completion_s = 0.1 * sum(1 for seq, _t in span if seq != chat_seq)
    longest = 0.1 * (1 + 12)  # the last one may start with a little allowance left and overrun it by a whole job
    assert completion_s <= URGENT_SHARE * 0.1 * len(span) + URGENT_BURST_S + longest
    assert sum(1 for seq, _t in span if seq == chat_seq) > 0  # the chat went on between them


def _four_slot_scheduler(batch: bool = True, slots: int = 4) -> Scheduler:
    engine = Engine(SlowToy(seed=3, n_seq=slots), ToyModel(seed=3, noise_seed=103, noise=1.5),
                    EngineOptions(learn_costs=False), cost=CostModel(dict(COST)), draft_cost_s=0.01)
    return Scheduler(engine, clock=lambda: engine.target.clock, batch=batch)


OTHER_CHAT = [0, 8, 9, 10, 8, 9]


async def _two_chats(scheduler: Scheduler) -> tuple[list, list, list[str], dict[str, float]]:
    finished: list[str] = []
    first_token: dict[str, float] = {}

    async def chat(name: str, prompt: list[int], tokens: int) -> list:
        events = []
        async for _seq, event in scheduler.generate(Job(prompt, GenerationParams(tokens), endpoint="chat")):
            events.append(event)
            if name not in first_token and answer_tokens(events):
                first_token[name] = scheduler.engine.target.clock
        finished.append(name)
        return events

    first = asyncio.create_task(chat("first", CHAT, 200))
    while not scheduler.running:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.02)
    second = await chat("second", OTHER_CHAT, 20)
    return await first, second, finished, first_token


@pytest.mark.parametrize("batch", [True, False])
def test_a_chat_that_arrives_while_another_generates_joins_it(batch):
    """With slots to spare, a second chat joins the first's generation (both decoded in the same steps)
    and finishes first; with --no-join it waits for the whole first answer. Both answers are their
    solo answers either way."""
    scheduler = _four_slot_scheduler(batch)
    try:
        first, second, finished, first_token = asyncio.run(_two_chats(scheduler))
    finally:
        scheduler.close()
    assert answer_tokens(first) == _plain(CHAT, 200)
    assert answer_tokens(second) == _plain(OTHER_CHAT, 20)
    log = scheduler.engine.target.log
    if batch:
        assert finished == ["second", "first"] and scheduler.joined == 1
        assert first_token["second"] < first_token["first"] + 0.1 * 40  # it started while the first generated
        assert "localspec_joined_total{model=\"toy\"} 1" in scheduler.prometheus("toy")
        assert {seq for seq, _t in log} >= {0, 1}
    else:
        assert finished == ["first", "second"] and scheduler.joined == 0
    assert scheduler.engine.free_slots() == 4 and scheduler.waiting == 0


@pytest.mark.parametrize("editor", [False, True])
def test_a_slot_is_kept_for_completions_only_while_an_editor_is_around(editor):
    """Two slots: with no editor seen, a second chat joins the first (every slot can hold a chat); once an
    editor has asked for a completion, the second slot is kept for its completions and the chat waits."""
    scheduler = _four_slot_scheduler(slots=2)
    try:
        if editor:
            completion = Job(COMPLETION, GenerationParams(4), endpoint="infill", urgent=True)
            asyncio.run(_run(scheduler, completion, [], "completion"))
        first, second, finished, _first_token = asyncio.run(_two_chats(scheduler))
    finally:
        scheduler.close()
    assert answer_tokens(first) == _plain(CHAT, 200) and answer_tokens(second) == _plain(OTHER_CHAT, 20)
    if editor:
        assert finished == ["first", "second"] and scheduler.joined == 0
    else:
        assert finished == ["second", "first"] and scheduler.joined == 1


def test_chats_waiting_together_all_join_at_the_next_round():
    """Three chats that arrive while one generates join it at once (one slot each; their prompts are
    then evaluated in the following steps), not one per round: a step soon holds all four sequences."""
    scheduler = _four_slot_scheduler()

    async def four() -> list[list]:
        first = asyncio.create_task(_run(scheduler, Job(CHAT, GenerationParams(120), endpoint="chat"), [], "0"))
        while not scheduler.running:
            await asyncio.sleep(0.001)
        others = [asyncio.create_task(_run(scheduler, Job(p, GenerationParams(20), endpoint="chat"), [], str(i)))
                  for i, p in enumerate((OTHER_CHAT, COMPLETION, CHAT[:5]), 1)]
        return [await first] + [await task for task in others]

    try:
        answers = asyncio.run(four())
    finally:
        scheduler.close()
    assert scheduler.joined == 3
    assert answer_tokens(answers[1]) == _plain(OTHER_CHAT, 20) and answer_tokens(answers[2]) == _plain(COMPLETION, 20)
    steps = scheduler.engine.target.steps
    assert any(len(step) == 4 for step in steps)
    first_joined = next(i for i, step in enumerate(steps) if len(step) > 1)
    assert len(steps[first_joined]) == 4  # all three in the first shared step


def test_the_engine_measures_its_costs_again_only_once_requests_have_paused(monkeypatch):
    """A measurement between requests makes the next request wait for its batch: requests that come
    one after another (an editor typing) run without one between them; a pause lets it happen."""
    from fakes import ScriptedEngine
    from localspec.server import scheduler as scheduling

    monkeypatch.setattr(scheduling, "MAINTAIN_AFTER_IDLE_S", 0.3)
    engine = ScriptedEngine(steps=[("", "", "x")] * 2)
    scheduler = Scheduler(engine)

    async def one() -> None:
        events = [event async for _seq, event in scheduler.generate(Job([1, 2, 3], GenerationParams(2)))]
        assert isinstance(events[-1], Summary)

    async def requests() -> None:
        for _ in range(4):  # back to back, 0.1 s apart
            await one()
            await asyncio.sleep(0.1)
        assert getattr(engine, "maintained", 0) == 0
        await asyncio.sleep(0.6)
        assert engine.maintained == 1

    try:
        asyncio.run(requests())
    finally:
        scheduler.close()


def test_work_called_on_the_engine_thread_runs_a_step_between_two_rounds_of_a_generation():
    """`Scheduler.call` (an embedding's chunks): each step between two rounds of the chat generating,
    which goes on as it would alone; an exception in a step reaches the caller; the engine keeps
    serving."""
    scheduler = _scheduler()
    target = scheduler.engine.target
    steps_at: list[int] = []  # decodes done when each step ran

    def steps(n: int):
        for _ in range(n - 1):
            steps_at.append(len(target.log))
            yield None
        steps_at.append(len(target.log))
        yield "done"

    def failing():
        yield None
        raise ValueError("bad text")

    async def scenario():
        finished: list[str] = []
        chat = asyncio.create_task(_run(scheduler, Job(CHAT, GenerationParams(200), endpoint="chat"), finished,
                                        "chat"))
        while not scheduler.running:
            await asyncio.sleep(0.001)
        result = await scheduler.call(steps(6), endpoint="embeddings")
        with pytest.raises(ValueError, match="bad text"):
            await scheduler.call(failing())
        with pytest.raises(RuntimeError, match="without a result"):
            await scheduler.call(iter(()))
        return await chat, result, finished

    try:
        chat, result, finished = asyncio.run(scenario())
        alone = asyncio.run(scheduler.call(steps(2)))  # nothing generating: at once
    finally:
        scheduler.close()
    assert result == "done" and alone == "done" and finished == ["chat"]
    assert answer_tokens(chat) == _plain(CHAT, 200)
    during = steps_at[:6]
    assert all(b > a for a, b in zip(during, during[1:]))  # the chat decoded between every two steps
    assert scheduler.metrics.requests["embeddings"] == 1


def test_a_request_beyond_the_queue_limit_is_refused_at_once(monkeypatch):
    from localspec.errors import EngineUnavailableError
    from localspec.server import scheduler as scheduling

    monkeypatch.setattr(scheduling, "MAX_QUEUED", 2)
    engine = _engine()
    scheduler = Scheduler(engine, interject=False, batch=False, clock=lambda: engine.target.clock)

    async def first(job):
        return [event async for _seq, event in scheduler.generate(job)]

    async def scenario():
        running = asyncio.create_task(first(Job(CHAT, GenerationParams(200), endpoint="chat")))
        while not scheduler.running:
            await asyncio.sleep(0.001)
        waiting = [asyncio.create_task(first(Job(COMPLETION, GenerationParams(4), endpoint="chat")))
                   for _ in range(2)]
        while len(scheduler._jobs) < 2:
            await asyncio.sleep(0.001)
        with pytest.raises(EngineUnavailableError, match="2 requests are waiting"):
            await first(Job(COMPLETION, GenerationParams(4), endpoint="chat"))
        return await running, [await w for w in waiting]

    try:
        chat, waited = asyncio.run(scenario())
    finally:
        scheduler.close()
    assert answer_tokens(chat) == _plain(CHAT, 200)
    assert all(answer_tokens(w) == _plain(COMPLETION, 4) for w in waited)


class FailingToy(SlowToy):
    """llama.cpp refusing one sequence's tokens: any decode of a sequence whose first token is POISONED,
    or of sequence `fail[0]` past position `fail[1]`, fails (as llama_decode fails the whole batch)."""

    POISONED = 2

    def __init__(self, *args, fail: tuple[int, int] | None = None, **kw):
        super().__init__(*args, **kw)
        self.fail = fail

    def _check(self, seq, tokens, start):
        from localspec.errors import LocalspecError

        first = self.seqs[seq][0] if start else tokens[0]
        if first == self.POISONED or (self.fail and seq == self.fail[0] and start + len(tokens) > self.fail[1]):
            raise LocalspecError("llama_decode failed with code -1")

    def decode(self, tokens, start, logits_for, seq=0):
        self._check(seq, tokens, start)
        return super().decode(tokens, start, logits_for, seq)

    def decode_many(self, parts):
        for seq, tokens, start, _outputs in parts:
            self._check(seq, tokens, start)
        return super().decode_many(parts)


@pytest.mark.parametrize("failing", ["guest", "host"])
def test_one_requests_failed_evaluation_never_ends_the_answer_decoded_beside_it(failing):
    """A request that joined a generation shares its decodes: when llama.cpp refuses one sequence's
    tokens, that request gets the error and the other's answer goes on, as it would alone (and the
    engine serves the next request)."""
    from localspec.errors import LocalspecError

    target = FailingToy(seed=3, n_seq=4, fail=(0, len(CHAT) + 40) if failing == "host" else None)
    engine = Engine(target, None, EngineOptions(drafter="none", learn_costs=False), cost=CostModel(dict(COST)))
    scheduler = Scheduler(engine, clock=lambda: engine.target.clock)
    guest_prompt = [FailingToy.POISONED, *OTHER_CHAT[1:]] if failing == "guest" else OTHER_CHAT

    async def collect(prompt, tokens):
        try:
            return [event async for _seq, event in scheduler.generate(Job(prompt, GenerationParams(tokens),
                                                                    endpoint="chat"))]
        except LocalspecError as exc:
            return exc

    async def scenario():
        host = asyncio.create_task(collect(CHAT, 200))
        while not scheduler.running:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.02)
        guest = await collect(guest_prompt, 60)
        return await host, guest, await collect(COMPLETION, 8)

    try:
        host, guest, after = asyncio.run(scenario())
    finally:
        scheduler.close()
    assert scheduler.joined == 1
    if failing == "guest":
        assert isinstance(guest, LocalspecError) and answer_tokens(host) == _plain(CHAT, 200)
    else:
        assert isinstance(host, LocalspecError) and answer_tokens(guest) == _plain(OTHER_CHAT, 60)
    assert answer_tokens(after) == _plain(COMPLETION, 8) and scheduler.metrics.errors == 1
    assert scheduler.engine.free_slots() == 4 and scheduler.waiting == 0


def test_events_cross_to_the_loop_without_the_engine_thread_waking_it():
    """The engine's thread leaves a request's events in its box (a wake-up per event let the event loop
    take the GIL between two decodes, and the next decode waited for the loop's work); the loop's pump
    collects them while requests are in flight, in order, and stops once none is."""
    import threading

    scheduler = _scheduler()
    woken: list = []

    async def scenario() -> list:
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe

        def counted(*args, **kwargs):
            if threading.current_thread().name == "localspec-engine":
                woken.append(args)
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        return [event async for _seq, event in scheduler.generate(Job(CHAT, GenerationParams(40)))]

    try:
        events = asyncio.run(scenario())
    finally:
        scheduler.close()
    assert isinstance(events[0], Prefill) and isinstance(events[-1], Summary)
    assert answer_tokens(events) == _plain(CHAT, 40)
    assert not woken and not scheduler._handoff.pumping


class _Request:
    """What a Job is to the hand-off (made on the loop that serves it)."""

    def __init__(self) -> None:
        self.box: collections.deque = collections.deque()
        self.events: asyncio.Queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()


def test_the_pump_sleeps_until_the_step_is_due(monkeypatch):
    """Through a step the pump does not poll every HANDOFF_S: it sleeps until the step's expected end
    (`Handoff.expect`, at most LONGEST_WAIT_S), then polls; an event left meanwhile reaches its queue."""
    from localspec.server import handoff as module

    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(delay, *args, **kwargs):
        sleeps.append(delay)
        return await real_sleep(delay, *args, **kwargs)

    async def scenario() -> list:
        handoff = module.Handoff()
        request = _Request()
        monkeypatch.setattr(module.asyncio, "sleep", recorded)
        handoff.expect(module.LONGEST_WAIT_S)
        handoff.watch(request)
        await real_sleep(module.LONGEST_WAIT_S + 0.005)
        request.box.append("event")  # (as the engine's thread does, at the step's end)
        got = await asyncio.wait_for(request.events.get(), 1.0)
        handoff.expect(10.0)  # a long step: never asleep longer than LONGEST_WAIT_S
        await real_sleep(0.06)
        handoff.forget(request)
        return got

    assert asyncio.run(scenario()) == "event"
    assert sleeps[0] >= module.LONGEST_WAIT_S - 0.01  # towards the step's end, not HANDOFF_S
    assert max(sleeps) <= module.LONGEST_WAIT_S and sleeps[-1] > module.HANDOFF_S


def test_the_pump_first_looks_a_little_past_the_steps_end(monkeypatch):
    """A step takes about what the one before took: the pump's first look comes PAST_DUE_S after the
    expected end, so that a step ending on time is collected by one wake-up, not a look too soon and a
    poll after it."""
    from localspec.server import handoff as module

    class Clock:  # (time stands still: the sleep asked for is the rule's alone)
        @staticmethod
        def monotonic() -> float:
            return 100.0

    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(delay, *args, **kwargs):
        sleeps.append(delay)
        return await real_sleep(0, *args, **kwargs)

    async def scenario() -> None:
        monkeypatch.setattr(module, "time", Clock)
        monkeypatch.setattr(module.asyncio, "sleep", recorded)
        handoff, request = module.Handoff(), _Request()
        handoff.expect(0.02)
        handoff.watch(request)
        while not sleeps:
            await real_sleep(0)
        handoff.forget(request)

    asyncio.run(scenario())
    assert sleeps[0] > 0.02 and sleeps[0] == pytest.approx(0.02 + module.PAST_DUE_S)  # past the due time
    assert module.HANDOFF_S < 0.02 + module.PAST_DUE_S < module.LONGEST_WAIT_S

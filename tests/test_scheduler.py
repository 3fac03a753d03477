"""The server's scheduler on the real engine over the toy model: an editor's completion runs between
the rounds of a long answer instead of after it, and both answers are their solo answers."""

from __future__ import annotations

import asyncio
import time

import pytest

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.events import Summary, answer_tokens
from localspec.engine.sampling import SamplingSettings
from localspec.server.scheduler import Job, Scheduler
from test_engine_toy import COST, _plain
from toy import ToyModel

CHAT = [0, 5, 9, 11, 13, 5, 9]
COMPLETION = [0, 20, 21, 22, 23, 20, 21]


class SlowToy(ToyModel):
    """Every decode takes a little while, as a real one does (so requests overlap)."""

    def decode(self, tokens, start, logits_for, seq=0):
        time.sleep(0.003)
        return super().decode(tokens, start, logits_for, seq)


def _engine() -> Engine:
    return Engine(SlowToy(seed=3, n_seq=2), ToyModel(seed=3, noise_seed=103, noise=1.5),
                  EngineOptions(learn_costs=False), cost=CostModel(dict(COST)), draft_cost_s=0.01)


async def _run(scheduler: Scheduler, job: Job, finished: list[str], name: str) -> list:
    events = [event async for event in scheduler.generate(job)]
    assert isinstance(events[-1], Summary)
    finished.append(name)
    return events


async def _chat_then_completion(scheduler: Scheduler) -> tuple[list, list, list[str]]:
    finished: list[str] = []
    chat = asyncio.create_task(_run(scheduler, Job(CHAT, 200, SamplingSettings(), endpoint="chat"), finished, "chat"))
    while not scheduler.running:  # the chat is generating
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.02)
    completion = await _run(scheduler, Job(COMPLETION, 12, SamplingSettings(), endpoint="infill", urgent=True),
                            finished, "completion")
    return await chat, completion, finished


@pytest.mark.parametrize("interject", [True, False])
def test_a_completion_runs_between_the_rounds_of_a_long_answer(interject):
    assert len(_plain(CHAT, 200)) >= 60  # a long answer: the completion arrives while it is generated
    scheduler = Scheduler(_engine(), interject=interject)
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

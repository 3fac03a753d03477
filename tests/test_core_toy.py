"""The engine core driven directly (engine/core.py): lanes added, stepped together or alone, aborted and
retired between steps, on the toy model. Every answer is its solo answer however the steps mix (the
toy asserts every decode starts where its sequence ends, so no position is evaluated twice)."""

import threading

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.events import Prefill, Round, Summary, answer_tokens
from localspec.engine.params import GenerationParams
from localspec.engine.request import check
from localspec.engine.sampling import SamplingSettings
from toy import ToyModel, submit_one

COST = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}
CHAT = [0, 20, 21, 22, 23, 20, 21]
OTHER = [0, 30, 2, 3, 17, 30, 2]
LONG = [0] + [(7 * i) % 40 + 2 for i in range(199)]  # several chunks
GREEDY = SamplingSettings(temperature=0.0)
SAMPLED = SamplingSettings(temperature=0.9, seed=41)


def _engine(slots=4):
    target = ToyModel(seed=3, n_seq=slots)
    draft = ToyModel(seed=3, noise_seed=103, noise=1.5)
    return Engine(target, draft, EngineOptions(drafter="auto", learn_costs=False), cost=CostModel(dict(COST)),
                  draft_cost_s=0.01)


def _solo(prompt, sampling, max_tokens):
    engine = _engine(slots=1)
    return answer_tokens(list(engine.generate(prompt, max_tokens=max_tokens, sampling=sampling, drafter="none")))


def _request(engine, prompt, max_tokens, sampling=GREEDY, cancel=None):
    return check(engine.target, engine.drafters, prompt, GenerationParams.one(sampling, max_tokens=max_tokens), 0,
                 EngineOptions(drafter="auto"), cancel or threading.Event())


def test_lanes_join_leave_and_abort_between_steps_and_each_answer_is_its_solo_answer():
    engine = _engine()
    core = engine.core
    first, second, third = [], [], []
    opened = _request(engine, CHAT, 40)
    lane = core.add(opened, engine.planner_for("auto", None, 40, prompt=CHAT), first.append, iterated=True)
    assert not first and len(core) == 1
    core.step()  # its prompt, within the step
    assert isinstance(first[0], Prefill) and first[0].evaluated == len(CHAT)
    for _ in range(3):
        core.step()  # alone: speculative rounds (it may draft)
    core.add(_request(engine, LONG, 30), engine.planner_for("auto", None, 30, prompt=LONG), second.append)
    sampled = _request(engine, OTHER, 25, SAMPLED)
    core.add(sampled, engine.planner_for("none", None, 25, prompt=OTHER), third.append)  # (the same draws)
    steps = 0
    while core:
        core.step()
        steps += 1
        if steps == 6:
            core.abort(core.lanes[-1])  # the sampled one, mid-answer
    opened.close()  # (an opened lane's consumer frees its slot)
    assert answer_tokens(first) == _solo(CHAT, GREEDY, 40)
    assert answer_tokens(second) == _solo(LONG, GREEDY, 30)
    assert [e for e in second if isinstance(e, Prefill)][0].chunks > 1  # its prompt came in within the steps
    cut = answer_tokens(third)
    assert third[-1].stop_reason == "cancelled" and 0 < len(cut) < 25 and cut == _solo(OTHER, SAMPLED, 25)[:len(cut)]
    assert isinstance(first[-1], Summary) and lane not in core.lanes and engine.free_slots() == 4


def test_a_step_of_some_lanes_leaves_the_others_waiting_and_unchanged():
    """The caller's policy picks a step's lanes (an interjection: its own): the others do not move, and
    the time counts as waited, not as their answers'."""
    engine = _engine()
    core = engine.core
    waiting, urgent = [], []
    held = core.add(_request(engine, CHAT, 30), engine.planner_for("auto", None, 30, prompt=CHAT), waiting.append)
    core.step()
    core.step()
    before = (len(held.context), len(waiting))
    quick = core.add(_request(engine, OTHER, 6), engine.planner_for("auto", None, 6, prompt=OTHER), urgent.append)
    while any(lane is quick for lane in core.lanes):
        core.step(only=[quick])
    assert (len(held.context), len(waiting)) == before and held.request.waited_s > 0
    assert isinstance(urgent[-1], Summary) and answer_tokens(urgent) == _solo(OTHER, GREEDY, 6)
    while core:
        core.step()
    assert answer_tokens(waiting) == _solo(CHAT, GREEDY, 30)
    assert any(isinstance(e, Round) and e.accepted for e in waiting + urgent)  # drafts were kept on the way


def test_an_answers_time_excludes_its_prompt_evaluated_within_the_steps():
    """Summary.wall_s (and so tokens/s) is generation only: a long prompt evaluated in the first steps
    counts in prompt_s, not in the answer's time."""
    import time

    class PerToken(ToyModel):
        def decode(self, tokens, start, logits_for, seq=0):
            time.sleep(0.0005 * len(tokens))
            return super().decode(tokens, start, logits_for, seq)

    engine = Engine(PerToken(seed=3, n_ctx=2048), None, EngineOptions(drafter="none", learn_costs=False),
                    cost=CostModel(dict(COST)))
    prompt = [0] + [5 + i % 40 for i in range(999)]
    summary = list(engine.generate(prompt, max_tokens=4))[-1]
    assert isinstance(summary, Summary) and summary.generated_tokens == 4
    assert summary.prompt_s >= 0.4 and summary.wall_s < summary.prompt_s / 4


def test_a_generation_refused_or_closed_early_leaves_the_requests_beside_it_running():
    """A request this thread submitted goes on whatever happens to a generation beside it: one refused
    (no slot free) touches nothing, one whose consumer stops early lets go of its own lane only."""
    import pytest

    from localspec.errors import LocalspecError

    engine = _engine(slots=2)
    guest: list = []
    main = engine.generate(CHAT, max_tokens=30)
    next(main)  # its Prefill
    submit_one(engine, OTHER, guest.append, max_tokens=12)
    with pytest.raises(LocalspecError, match="No KV slot"):
        next(engine.generate(LONG, max_tokens=3))
    for _ in range(3):
        next(main)
    main.close()  # its consumer went away
    while engine.step():
        pass
    assert answer_tokens(guest) == _solo(OTHER, GREEDY, 12) and isinstance(guest[-1], Summary)
    assert engine.free_slots() == 2
    assert answer_tokens(list(engine.generate(CHAT, max_tokens=5))) == _solo(CHAT, GREEDY, 5)  # free again

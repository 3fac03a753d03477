"""Several completions of one prompt decoded together (Engine.generate_many), on the toy model: each
completion is exactly its solo plain completion, the prompt is evaluated once, every step holds each
unfinished completion's pending token, and no position is evaluated twice (the toy asserts every
decode starts where its sequence ends)."""

import threading

import pytest

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.events import Prefill, Round, Summary
from localspec.engine.events import answer_tokens
from localspec.engine.params import GenerationParams
from localspec.engine.sampling import SamplingSettings
from localspec.engine.parallel import LEAST_CHUNK, STEP_S, prompt_chunk
from localspec.errors import LocalspecError
from toy import ToyHead, ToyModel, step_until_done, submit_one

COST = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}
PROMPT = [0, 5, 9, 11, 13, 5, 9]


def _engine(slots=3, drafter="ngram"):
    target = ToyModel(seed=3, n_seq=slots)
    engine = Engine(target, None, EngineOptions(drafter=drafter, learn_costs=False), cost=CostModel(dict(COST)))
    return engine, target


def _solo(prompt, sampling, max_tokens):
    engine, _ = _engine(slots=1)
    return answer_tokens(list(engine.generate(prompt, max_tokens=max_tokens, sampling=sampling, drafter="none")))


def _by_completion(events, count):
    out = [[] for _ in range(count)]
    for i, event in events:
        out[i].append(event)
    return out


SAMPLED = [SamplingSettings(temperature=0.9, seed=40 + i) for i in range(3)]
GREEDY = [SamplingSettings(temperature=0.0)] * 3


@pytest.mark.parametrize("samplings", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_completions_decoded_together_are_their_solo_completions(samplings):
    engine, target = _engine()
    events = list(engine.generate_many(PROMPT, samplings, max_tokens=24))
    answers = _by_completion(events, 3)
    for sampling, answer in zip(samplings, answers):
        assert isinstance(answer[0], Prefill) and isinstance(answer[-1], Summary)
        assert answer_tokens(answer) == _solo(PROMPT, sampling, 24)
        assert answer[-1].generated_tokens == len(answer_tokens(answer)) and answer[-1].drafted == 0
    # The prompt was evaluated once (all but its pending token), then copied: the other sequences
    # never evaluated it.
    assert [n for _start, n in target.calls if n > 1] == [len(PROMPT) - 1]
    assert answers[0][0].evaluated == len(PROMPT) and answers[1][0].evaluated == 0
    # The first step evaluated the prompt; every later one held each unfinished completion's pending
    # token, one row per sequence.
    assert target.steps[0] == [(0, 0, len(PROMPT) - 1)]
    assert target.steps and all(len({seq for seq, _s, _n in step}) == len(step) for step in target.steps)
    assert all(n == 1 for step in target.steps[1:] for _seq, _s, n in step)
    assert len(target.steps[1]) == 3
    lengths = sorted(s[-1].generated_tokens for s in answers)
    assert len(target.steps) == 1 + lengths[-1] + (answers[0][-1].stop_reason == "eog")


def test_a_completion_that_stops_leaves_the_next_step_and_the_others_go_on():
    engine, target = _engine()
    cancels = [threading.Event() for _ in range(3)]
    per = [[], [], []]
    for i, event in engine.generate_many(PROMPT, SAMPLED, max_tokens=20, cancels=cancels):
        per[i].append(event)
        if i == 1 and sum(isinstance(e, Round) for e in per[1]) == 3:
            cancels[1].set()  # its editor's limit was hit, say
    assert per[1][-1].stop_reason == "cancelled" and per[1][-1].generated_tokens == 3
    for j in (0, 2):
        assert answer_tokens(per[j]) == _solo(PROMPT, SAMPLED[j], 20)
    assert [len(step) for step in target.steps[:5]] == [1, 3, 3, 3, 2]  # (the prompt's step first)


def test_more_completions_than_slots_run_in_groups_and_cancel_ends_them_all():
    engine, target = _engine(slots=2)
    samplings = [SamplingSettings(temperature=0.9, seed=7 + i) for i in range(5)]
    answers = _by_completion(list(engine.generate_many(PROMPT, samplings, max_tokens=10, drafter="none")), 5)
    for sampling, answer in zip(samplings, answers):
        assert answer_tokens(answer) == _solo(PROMPT, sampling, 10)
    assert max(len(step) for step in target.steps) == 2
    everyone = threading.Event()
    ended = []
    for i, event in engine.generate_many(PROMPT, samplings[:2], max_tokens=30, cancel=everyone):
        if isinstance(event, Round) and event.index == 1:
            everyone.set()  # the client went away
        if isinstance(event, Summary):
            ended.append(event.stop_reason)
    assert ended == ["cancelled", "cancelled"]


def test_a_group_interjected_between_rounds_leaves_the_waiting_generation_exact():
    engine, target = _engine(slots=3)
    chat = [0, 20, 21, 22, 23, 20, 21]
    main = engine.generate(chat, max_tokens=40)
    events = []
    for event in main:
        events.append(event)
        if isinstance(event, Round) and event.index == 2:
            held = list(target.seqs[0])
            busy = []
            group: list = []
            lanes = engine.submit(PROMPT, GenerationParams(8, SAMPLED[:2]), group.append)
            while any(lane is held for lane in lanes for held in engine.core.lanes):
                engine.step(only=lanes)
                busy.append(engine.slots_busy())
            group = _by_completion(group, 2)
            assert [answer_tokens(a) for a in group] == [_solo(PROMPT, s, 8) for s in SAMPLED[:2]]
            assert target.seqs[0] == held  # the waiting answer's slot was not touched
            assert busy[0] == [True, True, True] and engine.slots_busy() == [True, False, False]
    assert engine.slots_busy() == [False, False, False]
    alone, _ = _engine(slots=1)
    assert answer_tokens(events) == answer_tokens(list(alone.generate(chat, max_tokens=40)))
    with pytest.raises(LocalspecError, match="at least one"):
        engine.generate_many(PROMPT, [])


# ----------------------------------------------------------------------------- requests joining a generation


# A CPU's shape, where a sequence's pending token adds most of a token's cost to a step (a GPU's does
# not: COST), so one sequence's draft in a shared step can pay (adaptive.steps_saved_s).
CPU_COST = {1: 1.0, 2: 1.9, 4: 3.0, 8: 4.0, 16: 5.0}


def _host_engine(slots=3, cost=COST):
    target = ToyModel(seed=3, n_seq=slots)
    draft = ToyModel(seed=3, noise_seed=103, noise=1.5)
    engine = Engine(target, draft, EngineOptions(drafter="auto", learn_costs=False), cost=CostModel(dict(cost)),
                    draft_cost_s=0.01)
    return engine, target


def _joined_at_first_round(engine, host_prompt, host_tokens, guest_prompt, guest_tokens):
    """The events of a generation and of a request that joins it at its first round, both to the end."""
    host, guest = [], []
    for event in engine.generate(host_prompt, max_tokens=host_tokens):
        host.append(event)
        if isinstance(event, Round) and event.index == 0:
            submit_one(engine, guest_prompt, guest.append, max_tokens=guest_tokens)
    while engine.step():
        pass
    return host, guest


CHAT = [0, 20, 21, 22, 23, 20, 21]
OTHER = [0, 30, 2, 3, 17, 30, 2]


def test_requests_that_join_a_generation_share_its_steps_and_every_answer_is_its_solo_answer():
    engine, target = _host_engine()
    guests = {"greedy": [], "sampled": []}
    host = []
    for event in engine.generate(CHAT, max_tokens=40):
        host.append(event)
        rounds = sum(isinstance(e, Round) for e in host)
        if isinstance(event, Round) and rounds == 2:
            submit_one(engine, PROMPT, guests["greedy"].append, max_tokens=30)
        if isinstance(event, Round) and rounds == 5:
            submit_one(engine, OTHER, guests["sampled"].append, max_tokens=12, sampling=SAMPLED[0])
    while engine.step():
        pass
    alone, _ = _host_engine(slots=1)
    assert answer_tokens(host) == answer_tokens(list(alone.generate(CHAT, max_tokens=40)))
    assert answer_tokens(guests["greedy"]) == _solo(PROMPT, SamplingSettings(temperature=0.0), 30)
    assert answer_tokens(guests["sampled"]) == _solo(OTHER, SAMPLED[0], 12)
    assert all(isinstance(g[0], Prefill) and isinstance(g[-1], Summary) for g in guests.values())
    # Steps held two, then three sequences; at these costs (added positions nearly free) the host's
    # copies are drafted in the shared steps too.
    assert {len(step) for step in target.steps} >= {2, 3}
    shared = [e for e in host if isinstance(e, Round)][2:5]
    assert all(e.shared >= 1 for e in shared)
    assert any(e.drafted for e in host if isinstance(e, Round) and e.shared)
    assert engine.free_slots() == 3
    assert answer_tokens(list(engine.generate(OTHER, max_tokens=4))) == _solo(OTHER, GREEDY[0], 4)  # free again


def test_guests_go_on_after_the_generation_they_joined_ends_and_a_cancelled_guest_frees_its_slot():
    engine, target = _host_engine()
    first, second, third = [], [], []
    stop_second = threading.Event()
    for event in engine.generate(CHAT, max_tokens=3):
        if isinstance(event, Round) and event.index == 0:
            submit_one(engine, PROMPT, first.append, max_tokens=20, sampling=SAMPLED[1], drafter="none")  # (same draws)
            submit_one(engine, OTHER, second.append, max_tokens=20, cancel=stop_second)
    assert engine.free_slots() == 1
    elsewhere: list = []  # another thread's request joins the guests' steps, in the free slot
    other = threading.Thread(target=lambda: elsewhere.extend(engine.generate(OTHER, max_tokens=2)))
    other.start()
    other.join()
    assert answer_tokens(elsewhere) == _solo(OTHER, GREEDY[0], 2) and engine.free_slots() == 1
    steps = 0
    while engine.step():
        steps += 1
        if steps == 2:
            submit_one(engine, CHAT, third.append, max_tokens=6)  # joins between two of the guests' own steps
        if steps == 4:
            stop_second.set()
    assert second[-1].stop_reason == "cancelled" and second[-1].generated_tokens < 20
    assert answer_tokens(first) == _solo(PROMPT, SAMPLED[1], 20)
    assert answer_tokens(third) == _solo(CHAT, GREEDY[0], 6)
    assert engine.free_slots() == 3
    assert answer_tokens(list(engine.generate(CHAT, max_tokens=5))) == _solo(CHAT, GREEDY[0], 5)


@pytest.mark.parametrize("drafter", ["ngram", "model", "auto"])
def test_the_last_guest_left_drafts_on_its_own_sequence_and_its_answer_is_unchanged(drafter):
    """Once the generation it joined has ended and no other guest is left, a guest's rounds are
    speculative again (drafts, verification, rollback on its own slot); greedy, its answer is still its
    solo answer, and it is recorded as evidence for the drafters like any request's."""
    engine, target = _host_engine()
    guest: list = []
    for event in engine.generate(CHAT, max_tokens=3):
        if isinstance(event, Round) and event.index == 0:
            submit_one(engine, PROMPT, guest.append, max_tokens=40, drafter=drafter)
    shared = len(target.steps)
    while engine.step():
        pass
    summary = guest[-1]
    assert isinstance(summary, Summary) and summary.drafted > 0 and summary.accepted > 0
    alone = target.steps[shared:]  # no more shared steps once it was alone: its own verify batches
    assert all(len(step) == 1 for step in alone) and any(n > 1 for step in alone for _seq, _s, n in step)
    assert answer_tokens(guest) == _solo(PROMPT, GREEDY[0], 40)
    assert engine.free_slots() == 3
    history = engine.drafter("history")
    assert history is not None and history.index.n_documents == 2  # the host's answer, and the guest's


def test_requests_submitted_beside_a_generation_take_free_slots_and_one_stepped_alone_leaves_the_others_exact():
    engine, target = _host_engine(slots=3)
    main = engine.generate(CHAT, max_tokens=30)
    next(main)  # the Prefill: the generation waits between two rounds
    guest, later, completion = [], [], []
    submit_one(engine, PROMPT, guest.append, max_tokens=25)
    held = list(target.seqs[1])  # the guest's slot (the generation holds slot 0)
    step_until_done(engine, [submit_one(engine, OTHER, completion.append, max_tokens=6, urgent=True)])
    assert answer_tokens(completion) == _solo(OTHER, GREEDY[0], 6)
    assert target.seqs[1] == held  # the urgent one took the third slot, not the guest's
    submit_one(engine, OTHER, later.append, max_tokens=8)
    assert engine.free_slots() == 0
    with pytest.raises(LocalspecError, match="No KV slot"):
        submit_one(engine, CHAT, lambda _e: None)
    rest = list(main)
    while engine.step():
        pass
    assert answer_tokens(guest) == _solo(PROMPT, GREEDY[0], 25)
    assert answer_tokens(later) == _solo(OTHER, GREEDY[0], 8)
    assert answer_tokens(rest) == _solo(CHAT, GREEDY[0], 30)


def test_completions_stepped_beside_a_guest_take_only_free_slots():
    engine, target = _host_engine(slots=4)
    main = engine.generate(CHAT, max_tokens=20)
    next(main)
    guest = []
    submit_one(engine, OTHER, guest.append, max_tokens=15)
    guest_slot = next(i for i, busy in enumerate(engine.slots_busy()) if busy and i != 0)
    held = list(target.seqs[guest_slot])
    with pytest.raises(LocalspecError, match="No KV slot"):
        engine.submit(PROMPT, GenerationParams(6, SAMPLED), lambda e: None)  # three, two slots free
    group: list = []
    params = GenerationParams(6, SAMPLED, drafter="none")
    for first in (0, 2):  # two at a time, as the scheduler submits them
        step_until_done(engine, engine.submit(PROMPT, params, group.append, sequences=range(first, min(first + 2, 3))))
    assert target.seqs[guest_slot] == held  # never the guest's
    assert [answer_tokens(a) for a in _by_completion(group, 3)] == [_solo(PROMPT, s, 6) for s in SAMPLED]
    rest = list(main)
    while engine.step():
        pass
    assert answer_tokens(rest) == _solo(CHAT, GREEDY[0], 20) and answer_tokens(guest) == _solo(OTHER, GREEDY[0], 15)


LONG = [0] + [(7 * i) % 40 + 2 for i in range(199)]  # 200 tokens: several chunks


def test_a_long_joining_prompt_is_evaluated_in_chunks_while_the_generation_goes_on():
    """A joining prompt longer than a step's chunk is evaluated over several steps, each also holding
    the running generation's pending token (its stream goes on instead of freezing); every prompt
    position is evaluated once, its Prefill comes when the whole prompt is in, and both answers are
    their solo answers."""
    engine, target = _host_engine()
    guest, host = [], []
    for event in engine.generate(CHAT, max_tokens=30):
        host.append(event)
        if isinstance(event, Round) and event.index == 1:
            submit_one(engine, LONG, guest.append, max_tokens=10)
            joined_at = len(target.steps)
    while engine.step():
        pass
    shared = target.steps[joined_at:]
    seqs = {seq for step in shared for seq, _start, _n in step}
    assert len(seqs) == 2
    guest_seq = next(seq for step in shared for seq, _start, n in step if n == 64)
    chunks = [(step, n) for step in shared for seq, start, n in step if seq == guest_seq and start < len(LONG) - 1]
    # the prompt but its last token, in chunks of LEAST_CHUNK (the toy's costs allow no more in a step),
    # each beside the host's pending token (and its draft); no position twice (the toy asserts every
    # decode's start)
    assert [n for _step, n in chunks] == [64, 64, 64, 7]
    assert all(len(step) == 2 for step, _n in chunks)
    assert isinstance(guest[0], Prefill) and guest[0].evaluated == 200 and guest[0].cached == 0
    assert not any(isinstance(e, Round) for e in guest[:1])
    assert answer_tokens(guest) == _solo(LONG, GREEDY[0], 10)
    alone, _ = _host_engine(slots=1)
    assert answer_tokens(host) == answer_tokens(list(alone.generate(CHAT, max_tokens=30)))
    assert engine.free_slots() == 3


def test_a_guest_cancelled_while_its_prompt_is_evaluated_ends_and_frees_its_slot():
    engine, target = _host_engine()
    guest, stop = [], threading.Event()
    for event in engine.generate(CHAT, max_tokens=20):
        if isinstance(event, Round) and event.index == 1:
            submit_one(engine, LONG, guest.append, max_tokens=10, cancel=stop)
        if isinstance(event, Round) and event.index == 3:
            stop.set()  # after two of its chunks
    while engine.step():
        pass
    assert [type(e) for e in guest] == [Prefill, Summary]
    assert guest[0].evaluated == 128 and guest[-1].stop_reason == "cancelled" and guest[-1].generated_tokens == 0
    assert engine.free_slots() == 3


def test_a_step_takes_as_much_of_a_prompt_as_its_costs_allow():
    linear = lambda n: 0.02 * n  # noqa: E731
    assert prompt_chunk(0, linear, 512) == 512                      # nobody waits: all that fits
    assert prompt_chunk(3, linear, 512) == LEAST_CHUNK              # a CPU: never less than the least chunk
    assert prompt_chunk(3, lambda n: 0.0001 * n, 512) == 509        # within the step's time: as much as fits
    per = STEP_S / 100                                              # 100 positions in a step's time
    assert prompt_chunk(3, lambda n: per * n, 512) == 97
    assert prompt_chunk(500, lambda n: 0.0, 512) == 12              # never beyond the batch


def test_a_prompt_sharing_a_prefix_with_another_slot_copies_it_instead_of_evaluating_it():
    """A request whose prompt starts like the one a busy slot holds (a chat template's system prompt, an
    agent's instructions) gets that prefix copied into its own slot: only the rest is evaluated, and
    its answer is its solo answer."""
    engine, target = _host_engine()
    shared = LONG[:40]
    first, second = shared + [3, 4, 5], shared + [6, 7]
    guest = []
    for event in engine.generate(first, max_tokens=12):
        if isinstance(event, Round) and event.index == 0:
            submit_one(engine, second, guest.append, max_tokens=10)
    while engine.step():
        pass
    assert isinstance(guest[0], Prefill) and guest[0].cached == 40 and guest[0].evaluated == 2
    guest_seq = target.steps[-1][0][0]  # (the host ended first: the last steps are the guest's)
    assert not [n for step in target.steps for seq, start, n in step
                if seq == guest_seq and start < len(second) - 1 and n > 1]  # no prompt chunk
    assert answer_tokens(guest) == _solo(second, GREEDY[0], 10)


def test_joining_prompts_are_evaluated_oldest_first_within_each_steps_budget():
    """Two long prompts joining at once: each step spends its budget on the older prompt first, the
    rest on the newer one, so the older one starts first; both answers are their solo answers."""
    engine, target = _host_engine()
    other = [0] + [(11 * i) % 40 + 2 for i in range(99)]  # 100 tokens
    first, second = [], []
    for event in engine.generate(CHAT, max_tokens=30):
        if isinstance(event, Round) and event.index == 1:
            submit_one(engine, LONG, first.append, max_tokens=6)
            submit_one(engine, other, second.append, max_tokens=6)
            joined_at = len(target.steps)
    while engine.step():
        pass
    host_seq = next(seq for seq, start, _n in target.steps[joined_at] if start >= len(CHAT) - 1)
    guests = [(seq, start, n) for step in target.steps[joined_at:] for seq, start, n in step if seq != host_seq]
    older = guests[0][0]
    newer = next(seq for seq, _start, _n in guests if seq != older)
    prompt_len = {older: len(LONG), newer: len(other)}
    # (the prompts' chunks, not the drafts of the answers that follow them)
    chunks = [[(seq, n) for seq, start, n in step if seq != host_seq and start < prompt_len[seq] - 1 and n > 1]
              for step in target.steps[joined_at:]]
    chunks = [c for c in chunks if c]
    newer = None
    for step in chunks:
        assert sum(n for _seq, n in step) <= LEAST_CHUNK  # the step's budget (the toy's costs: the least)
        newer = next((seq for seq, _n in step if seq != older), newer)
    assert [n for step in chunks for seq, n in step if seq == older] == [64, 64, 64, 7]
    assert [n for step in chunks for seq, n in step if seq == newer] == [57, 42]  # the 4th step's rest, then on
    assert answer_tokens(first) == _solo(LONG, GREEDY[0], 6) and answer_tokens(second) == _solo(other, GREEDY[0], 6)
    assert engine.free_slots() == 3


# ----------------------------------------------------------------------------- drafts in shared steps


class _Scripted:
    """A lookup drafter whose proposals are scripted per prompt: the true continuation (every draft kept
    whole), or the true continuation with its `wrong`-th token replaced (a rejection there)."""

    name = "ngram"
    warning = None

    def __init__(self, truths: dict[int, list[int]], lengths: dict[int, int], wrong: dict[int, int]):
        self.truths, self.lengths, self.wrong = truths, lengths, wrong

    def begin(self, prompt, plan):
        from localspec.engine.drafters.base import Draft, Offer, Turn

        drafter, key = self, prompt[1]

        class Scripted(Turn):
            def offer(self, context, room, plan):
                truth, at = drafter.truths[key], len(context) - len(prompt)
                tokens = truth[at:at + min(drafter.lengths[key], room)]
                if key in drafter.wrong and drafter.wrong[key] < len(tokens):
                    tokens[drafter.wrong[key]] ^= 1  # not the toy's greedy token there
                sure = [1.0] * len(tokens)  # (as its drafter would claim: the step verifies all of it)
                return Offer(len(tokens), float("inf"), Draft(list(tokens), source="ngram"), sure) if tokens else None

        return Scripted()

    def reset(self):
        pass

    def close(self):
        pass


def test_drafts_of_different_lengths_in_one_step_are_each_settled_as_alone():
    """A generation and a request that joined it draft in the same decode: one draft of 1 kept whole,
    one of 15 rejected at its seventh token, in one step (the step verifies each proposal up to one
    length, 15 at first: the long one's tokens pay for the pass it adds); each answer is its solo answer,
    each round's verify rows are its own (the toy asserts no position is evaluated twice), and a
    cancelled guest leaves at the next step with its slot free."""
    host_prompt, guest_prompt, third = [0, 20, 21, 22], [0, 30, 2, 3], [0, 12, 13, 14]
    truths = {p[1]: _solo(p, GREEDY[0], 60) for p in (host_prompt, guest_prompt, third)}
    engine, target = _host_engine(cost=CPU_COST)
    engine.drafting.drafters = [_Scripted(truths, {20: 1, 30: 15, 12: 2}, {30: 6})]
    host, guest, cancelled, stop = [], [], [], threading.Event()
    for event in engine.generate(host_prompt, max_tokens=24):
        host.append(event)
        if isinstance(event, Round) and event.index == 0:
            submit_one(engine, guest_prompt, guest.append, max_tokens=20)
            submit_one(engine, third, cancelled.append, max_tokens=20, cancel=stop)
        if isinstance(event, Round) and event.index == 3:
            stop.set()
    while engine.step():
        pass
    assert answer_tokens(host) == truths[20][:24]
    assert answer_tokens(guest) == truths[30][:20]
    assert cancelled[-1].stop_reason == "cancelled" and answer_tokens(cancelled) == truths[12][:len(answer_tokens(cancelled))]
    shared_host = [e for e in host if isinstance(e, Round) and e.shared]
    shared_guest = [e for e in guest if isinstance(e, Round) and e.shared]
    assert any(e.drafted == 1 for e in shared_host) and all(len(e.accepted) == e.drafted for e in shared_host)
    # (shorter drafts later: the rejections lower what shared steps trust a promise; the next test)
    assert shared_guest and all(len(e.accepted) == min(6, e.drafted) for e in shared_guest)
    assert any(len(e.rejected) == 9 for e in shared_guest)
    both = [step for step in target.steps if {2, 16} <= {n for _seq, _start, n in step}]
    assert both  # the host's 1 + 1 and the guest's 1 + 15 positions in one decode
    assert engine.free_slots() == 3


def test_a_shared_step_verifies_one_length_of_every_proposal_where_that_pays():
    """A part longer than the others adds a pass of its own (llama.cpp's micro-batches take as many
    tokens from each sequence), where drafts of one length share one; and a draft is worth the later
    steps it saves: one sequence ahead leaves steps that cost what the others cost without it, all of
    them ahead save whole steps. On a CPU's cost shape a likely copy beside three pending tokens does
    not pay, a nearly sure one of 15 does (14 steps sooner, each step of four 0.92 of a token dearer
    than one of three, for one pass of 15); beside one other sequence it does not (0.68 a step); four
    likely copies do not, four nearly sure ones do; one much shorter than the rest is left out."""
    from localspec.engine.adaptive import best_length, shared_lengths, step_cost, steps_saved_s

    cpu = CostModel({1: 1.0, 2: 1.68, 3: 2.26, 4: 3.18, 8: 8.05, 12: 8.77, 16: 8.77})  # a 2-core AVX2 CPU (#24)
    assert step_cost(cpu, [1, 1, 16]) == pytest.approx(cpu.verify(3) + cpu.verify(15))
    assert step_cost(cpu, [4, 4, 4, 4]) == pytest.approx(cpu.verify(16))
    assert steps_saved_s(cpu, [2.0, 0, 0, 0]) == pytest.approx(2 * (cpu.verify(4) - cpu.verify(3)))
    assert steps_saved_s(cpu, [2.0] * 4) == pytest.approx(2 * cpu.verify(4))
    assert steps_saved_s(cpu, [1.0, 3.0]) == pytest.approx(cpu.verify(2) + 2 * (cpu.verify(2) - cpu.verify(1)))
    assert steps_saved_s(cpu, [5.0]) == pytest.approx(5 * cpu.verify(1))  # alone: as best_length prices it
    likely, sure = [0.8] * 15, [0.99] * 15
    assert best_length(likely, cpu, 0.0)[0] > 0                  # alone, a likely copy pays
    assert shared_lengths(cpu, [likely, [], [], []]) == [0, 0, 0, 0]  # beside three pending tokens, not
    assert shared_lengths(cpu, [sure, [], [], []]) == [15, 0, 0, 0]
    assert shared_lengths(cpu, [sure, []]) == [0, 0]
    assert shared_lengths(cpu, [likely] * 4, margin=0.15) == [0, 0, 0, 0]
    assert shared_lengths(cpu, [sure] * 4) == [11, 11, 11, 11]  # 4 x 12 positions: 8.77 x 3 for ~10 steps of 3.18
    assert shared_lengths(cpu, [sure, sure, sure, sure[:2]], margin=0.15) == [15, 15, 15, 0]  # the short one left out
    assert shared_lengths(cpu, [sure] * 4, room=8) == [0, 0, 0, 0]  # not within the batch


def test_a_shared_step_prices_what_drafting_its_lengths_costs():
    """A drafter that batches its sequences pays one decode per draft position for every chain that
    reaches it (a decode of n rows at the verify costs' scale); one that drafts for one sequence after
    the other pays every token. On a GPU-like shape two sequences' model drafts pay where drafting is
    cheap, and the step drafts nothing where it costs as much as the verify it would save."""
    from localspec.engine.adaptive import shared_lengths
    from localspec.engine.drafters.base import Drafter

    class Dear(Drafter):
        def token_s(self) -> float:
            return 0.5

    batched, one_by_one = Dear(), Dear()
    batched.batched = True
    scale = {1: 1.0, 2: 1.5}.__getitem__
    assert batched.drafting_s([3, 2], scale) == pytest.approx(0.5 * (1.5 + 1.5 + 1.0))
    assert one_by_one.drafting_s([3, 2], scale) == pytest.approx(0.5 * 5)
    gpu = CostModel(dict(COST))
    sure = [0.9] * 7
    assert shared_lengths(gpu, [sure, sure], drafting_s=lambda ks: 0.01 * max(ks)) == [7, 7]
    assert shared_lengths(gpu, [sure, sure], drafting_s=lambda ks: 1.0 * max(ks)) == [0, 0]


def test_with_requests_queued_for_a_slot_any_sequence_ahead_saves_its_share_of_a_step():
    """Where requests wait for a slot every slot stays full, so a token any sequence gets ahead is 1/n
    of a full step of n: on a GPU's shape (a step of four about one token) a sure copy beside three
    pending tokens saves nearly nothing while nobody waits and drafts once someone does; all of them
    ahead alike save as many whole steps either way; on a CPU's shape the queue prices one sequence's
    copy a little lower (a full step's quarter, 0.80 of a token, against the 0.92 it adds)."""
    from localspec.engine.adaptive import shared_lengths, steps_saved_s

    gpu = CostModel({1: 1.0, 2: 1.02, 3: 1.03, 4: 1.05, 8: 1.1, 12: 1.2, 16: 1.3, 32: 1.6, 64: 2.4})
    cpu = CostModel({1: 1.0, 2: 1.68, 3: 2.26, 4: 3.18, 8: 8.05, 12: 8.77, 16: 8.77})  # a 2-core AVX2 CPU (#24)
    assert steps_saved_s(gpu, [4.0, 0, 0, 0]) == pytest.approx(4 * (gpu.verify(4) - gpu.verify(3)))
    assert steps_saved_s(gpu, [4.0, 0, 0, 0], queued=True) == pytest.approx(4 * gpu.verify(4) / 4)
    assert steps_saved_s(cpu, [2.0] * 4, queued=True) == pytest.approx(steps_saved_s(cpu, [2.0] * 4))
    sure = [0.99] * 15
    assert shared_lengths(gpu, [sure, [], [], []]) == [0, 0, 0, 0]
    assert shared_lengths(gpu, [sure, [], [], []], queued=True)[0] > 0
    assert steps_saved_s(cpu, [3.0, 0, 0, 0], queued=True) < steps_saved_s(cpu, [3.0, 0, 0, 0])


def test_the_servers_queue_tells_shared_steps_whether_requests_wait_for_a_slot():
    """The scheduler gives the engine its queue: a job waiting with no slot free to join is queued,
    for the drafting of both the generation and its interjections."""
    from localspec.server.scheduler import Scheduler

    engine, _target = _host_engine(slots=2)
    scheduler = Scheduler(engine, interject=False)
    try:
        assert not engine.drafting.queued() and not engine._side.queued()
        scheduler._jobs.append(object())  # a job waiting (the engine's thread only waits for a notify)
        assert not engine.drafting.queued()  # both slots free: it joins at the next step
        for kv in engine.slots.free():
            engine.slots.take(kv)
        assert engine.drafting.queued() and engine._side.queued()
        scheduler._jobs.clear()
        assert not engine.drafting.queued()
    finally:
        for kv in engine.slots:
            kv.busy = False
        scheduler.close()


def test_shared_steps_price_promised_tokens_at_what_shared_drafts_kept():
    """Chances that overstate (a copy that claims sure tokens and breaks at its first) lose the trust
    of the shared steps: the guest's proposal is verified in its first shared steps, then no more,
    while the answers stay exact. Promises alone: trust starts at the chances' word, falls with
    tokens promised and not kept, comes back over steps that verify no draft, never rises above 1; on a CPU's cost shape four nearly sure copies
    worth half their promise do not pay for the step."""
    from localspec.engine.adaptive import Promises, shared_lengths

    promises = Promises()
    assert promises.trust == 1.0
    promises.observe(10.0, 12)
    assert promises.trust == 1.0
    for _ in range(5):
        promises.observe(15.0, 3)
    assert 0.3 < promises.trust < 0.4  # 3 kept of 15 promised, after 12 of 10 (and the prior)
    low = promises.trust
    for _ in range(100):  # shared steps that offered drafts and verified none
        promises.passed()
    assert low < 0.5 < promises.trust < 1.0
    cpu = CostModel({1: 1.0, 2: 1.68, 3: 2.26, 4: 3.18, 8: 8.05, 12: 8.77, 16: 8.77})  # a 2-core AVX2 CPU (#24)
    assert shared_lengths(cpu, [[0.99] * 15] * 4) == [11, 11, 11, 11]
    assert shared_lengths(cpu, [[0.99] * 15] * 4, trust=0.5) == [0, 0, 0, 0]

    host_prompt, guest_prompt = [0, 20, 21, 22], [0, 30, 2, 3]
    truths = {p[1]: _solo(p, GREEDY[0], 60) for p in (host_prompt, guest_prompt)}
    engine, _target = _host_engine(cost=CPU_COST)
    engine.drafting.drafters = [_Scripted(truths, {20: 0, 30: 15}, {30: 0})]
    host, guest = _joined_at_first_round(engine, host_prompt, 40, guest_prompt, 36)
    assert answer_tokens(host) == truths[20][:40] and answer_tokens(guest) == truths[30][:36]
    shared = [e for e in guest if isinstance(e, Round) and e.shared]
    drafted = [e for e in shared if e.drafted]
    assert len(shared) > 20 and 1 <= len(drafted) <= 4
    assert all(not e.accepted for e in drafted)
    assert engine.drafting.promises.trust < 0.4


def test_a_long_replay_beside_a_joining_prompt_stays_within_the_logits_one_decode_returns():
    """A regenerated answer proposes its whole recorded rest (63 tokens, nearly sure) while a long
    prompt joins in chunks: the step's logits rows (a row per pending or drafted token, one per chunk)
    stay within what one llama.cpp decode returns (64; the toy asserts it), and both answers are exact."""
    target = ToyModel(seed=3, n_seq=3)
    cost = CostModel({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4, 32: 1.5, 64: 1.6})
    engine = Engine(target, None, EngineOptions(drafter="auto", learn_costs=False), cost=cost)
    prompt = [0, 20, 21, 22]
    truth = _solo(prompt, GREEDY[0], 240)
    engine.drafting.drafters = [_Scripted({20: truth, LONG[1]: []}, {20: 63, LONG[1]: 0}, {})]
    host, guest = _joined_at_first_round(engine, prompt, 240, LONG, 6)
    assert answer_tokens(host) == truth and answer_tokens(guest) == _solo(LONG, GREEDY[0], 6)
    assert any(e.shared and e.drafted >= 32 for e in host if isinstance(e, Round))  # long drafts beside chunks


def test_forced_draft_lengths_in_a_shared_step_stay_within_one_decodes_logits():
    """Four requests at a forced length of 32 (the server takes `draft_len` up to 32) in one step ask
    more logits rows than a decode returns: the later ones are cut to what is left (the toy asserts
    the limit); every answer is its solo answer."""
    target = ToyModel(seed=3, n_seq=4)
    engine = Engine(target, None, EngineOptions(drafter="ngram", draft_len=32, learn_costs=False),
                    cost=CostModel(dict(COST)))
    prompts = [[0, 20, 21, 22], [0, 30, 2, 3], [0, 12, 13, 14], [0, 5, 9, 11]]
    truths = {p[1]: _solo(p, GREEDY[0], 80) for p in prompts}
    engine.drafting.drafters = [_Scripted(truths, {p[1]: 32 for p in prompts}, {})]  # (a fixed length: forced)
    answers = [[] for _ in prompts]
    for event in engine.generate(prompts[0], max_tokens=80):
        answers[0].append(event)
        if isinstance(event, Round) and event.index == 0:
            for events, prompt in zip(answers[1:], prompts[1:]):
                submit_one(engine, prompt, events.append, max_tokens=80)
    while engine.step():
        pass
    assert [answer_tokens(a) for a in answers] == [truths[p[1]] for p in prompts]
    assert any(sum(n for _seq, _start, n in step) > 64 - 4 for step in target.steps if len(step) == 4)


def _two_at_once_each_drafting(engine, target, drafter: str) -> set[int]:
    """Two requests submitted at once, each asking for `drafter`, stepped until both end: each answer
    keeps tokens `drafter` drafted and is its solo answer (greedy). Returns their sequences, after
    checking that a step verified drafts of both."""
    answers: list[list] = [[], []]
    lanes = [submit_one(engine, prompt, answer.append, max_tokens=40, drafter=drafter)
             for prompt, answer in zip((PROMPT, CHAT), answers)]
    while engine.step():
        pass
    for prompt, answer in zip((PROMPT, CHAT), answers):
        summary = answer[-1]
        assert isinstance(summary, Summary) and summary.generated_tokens == 40
        assert summary.drafted_by_drafter.get(drafter, 0) > 0 and summary.accepted_by_drafter.get(drafter, 0) > 0
        assert answer_tokens(answer) == _solo(prompt, GREEDY[0], 40)
    both = {lane.kv.seq for lane in lanes}
    assert any({seq for seq, _s, _n in step} == both and all(n > 1 for _seq, _s, n in step) for step in target.steps)
    return both


def test_requests_decoded_together_each_draft_with_the_draft_model_one_decode_per_drafted_token():
    """Two requests at once, each asking for the draft model: the shared steps verify both sequences'
    model drafts, made together (each draft-model decode after the catch-up holds both sequences, one
    token each), both answers keep drafted tokens, and each answer is its solo answer (greedy). The
    draft model's sequences are apart: each request drafts in its own."""
    target = ToyModel(seed=3, n_seq=2)
    draft = ToyModel(seed=3, noise_seed=103, noise=1.5, n_seq=2)
    engine = Engine(target, draft, EngineOptions(drafter="auto", learn_costs=False), cost=CostModel(dict(COST)),
                    draft_cost_s=0.01)
    _two_at_once_each_drafting(engine, target, "model")
    assert any(len(step) == 2 and all(n == 1 for _seq, _s, n in step) for step in draft.steps)
    assert all(len({seq for seq, _s, _n in step}) == len(step) for step in draft.steps)


def test_requests_decoded_together_each_draft_with_the_targets_head():
    """Two requests at once on a target with a multi-token-prediction head, each asking for it: the
    head follows both sequences through the shared decodes, so the shared steps verify both
    sequences' head drafts, made in head steps that hold both chains; both answers keep drafted tokens
    and each is its solo answer (greedy)."""
    target = ToyModel(seed=3, n_seq=2)
    target.mtp = ToyHead(target, ToyModel(seed=3, noise_seed=11, noise=1.5))
    engine = Engine(target, None, EngineOptions(drafter="mtp", learn_costs=False, history_drafts=False),
                    cost=CostModel(dict(COST)), draft_cost_s=0.01)
    both = _two_at_once_each_drafting(engine, target, "mtp")
    assert any(sorted(seqs) == sorted(both) for seqs in target.mtp.many)  # one head step for both chains


def test_the_draft_model_drafts_for_several_requests_what_it_drafts_for_each_alone():
    """`ModelDrafter.draft_many`: two requests' chains, one far behind its context (more than a batch:
    evaluated in chunks of its own) and one a token behind, are each the chain drafted for it alone,
    and every decode after the catch-up holds both."""
    from localspec.engine.drafters.base import Plan
    from localspec.engine.drafters.model import ModelDrafter
    from localspec.engine.sampling import Sampler

    def drafter(n_batch: int) -> tuple[ModelDrafter, ToyModel]:
        model = ToyModel(seed=3, noise_seed=103, noise=1.5, n_seq=2)
        model.n_batch = n_batch
        return ModelDrafter(model, p_min=0.0, per_token_s=0.01), model

    plan = Plan(cost=CostModel(dict(COST)))
    far = PROMPT + [5, 9, 11, 13] * 4
    near = CHAT + [20, 21]
    together, model = drafter(8)
    turns = [together.begin(p, plan) for p in (PROMPT, CHAT)]
    turns[1].kv.sync(near[:-1])  # (a token behind)
    drafts = together.draft_many([(turns[0], far, 4, Sampler(SamplingSettings())),
                                  (turns[1], near, 4, Sampler(SamplingSettings()))])
    for context, draft in zip((far, near), drafts):
        alone, _ = drafter(512)
        assert draft.tokens == alone.begin(context, plan).propose(context, 4, Sampler(SamplingSettings())).tokens
        assert len(draft.tokens) == 4
    assert sum(len(step) == 2 and all(n == 1 for _seq, _s, n in step) for step in model.steps) == 3

"""benchmarks/replay_planner.py on hand-made recordings: fixed lengths by copy age priced round by round, the
best of them in hindsight, and a session's earlier request replayed through the history drafter."""

import pytest

from conftest import load_benchmark

CONTROL, HEADER = 999, 500
COSTS = {1: 1.0, 2: 1.5, 3: 1.8, 4: 2.0, 6: 2.5, 8: 3.0, 12: 3.5, 16: 4.0, 24: 5.0, 32: 6.0}


@pytest.fixture(scope="module")
def replay_planner():
    return load_benchmark("replay_planner")


def recording(answer: list[int]) -> dict:
    """A prompt of 40 distinct tokens, its turn's end and the answer's header; the answer as given."""
    prompt = [*range(10, 50), CONTROL, HEADER]
    return {"eos": 998, "control": [CONTROL], "verify_s": {str(n): s for n, s in COSTS.items()},
            "answers": [{"id": "copy", "suite": "edit", "prompt": prompt, "answer": answer, "ended": False}]}


def test_fixed_lengths_by_age_price_a_whole_copy_round_by_round(replay_planner):
    data = recording(list(range(10, 50)))  # the prompt's text copied whole
    price = replay_planner.CostModel(dict(COSTS))
    lengths = {(True, 0): 1, (True, 5): 3, (True, 10): 15, (False, 10): 0}
    # Rounds: the first token plain (nothing before it to copy: 1.0); the copy at age 1 and at age 3 one
    # token each (1.5 + 1.5); at ages 5 and 9 three (2.0 + 2.0); at age 13 fifteen (4.0); at age 29 the
    # rest, 11 tokens and the turn's end, drafted at the longest measured length within it, 11 (3.5).
    assert replay_planner._fixed_lengths(data, data["answers"][0], lengths, price) == pytest.approx(40 / 15.5)
    nothing = {key: 0 for key in lengths}
    assert replay_planner._fixed_lengths(data, data["answers"][0], nothing, price) == pytest.approx(1.0)


def test_the_age_bound_is_the_best_of_the_fixed_lengths_it_tries(replay_planner):
    edited = [*range(10, 30), 77, *range(31, 50)]  # one token of the copy replaced by the answer's own
    data = recording(edited)
    price = replay_planner.CostModel(dict(COSTS))
    lengths, speedups = replay_planner.age_bound(data)["edit"]
    assert speedups == [pytest.approx(replay_planner._fixed_lengths(data, data["answers"][0], lengths, price))]
    for tried in ({(True, 0): 1, (True, 5): 3, (True, 10): 15, (False, 10): 0},
                  {(True, 0): 0, (True, 5): 0, (True, 10): 1, (False, 10): 0}):
        assert speedups[0] >= replay_planner._fixed_lengths(data, data["answers"][0], tried, price) - 1e-9
    # The edit costs the copy one round: still better than the whole copy drafted three tokens at a time.
    assert speedups[0] > 40 / (1.0 + 10 * 2.0)


def test_a_world_with_another_one_position_price_replays_both_planners(replay_planner):
    """`--one-position`: the rounds are priced in the corrected world; a planner pricing by the recorded
    table drafts as before, one given the corrected table sees what drafting costs there."""
    data = recording(list(range(10, 50)))  # the prompt's text copied whole
    recorded = replay_planner.replay(data)["edit"][0]
    assert recorded > 2.0
    # where one position costs a tenth of the table's, every draft loses: planned on the table the copy
    # is still drafted (and costs), planned on the truth nothing is, plain decoding's 1.0
    assert replay_planner.replay(data, one_position=0.1)["edit"][0] < 0.5
    assert replay_planner.replay(data, one_position=0.1, plan_on_truth=True)["edit"] == [pytest.approx(1.0)]
    assert replay_planner.replay(data, one_position=1.0, plan_on_truth=True)["edit"] == [pytest.approx(recorded)]


def test_a_session_recording_replays_drafts_from_its_earlier_request(replay_planner):
    """A new conversation retelling an earlier answer: only the history drafter can copy it, and the replay
    holds the session's earlier request as the bench's pass does."""
    answer = list(range(10, 50))
    earlier = [*range(100, 120), CONTROL, HEADER, *answer]
    data = recording(answer)
    data["answers"][0].update(prompt=[*range(100, 118), 77, CONTROL, HEADER], suite="quote")
    assert replay_planner.replay(data)["quote"] == [pytest.approx(1.0)]  # nothing in the request to copy
    data["answers"][0]["earlier"] = [earlier]
    assert replay_planner.replay(data)["quote"][0] > 1.5


def test_a_tree_of_lookups_keeps_another_matchs_continuation_where_the_copy_breaks(replay_planner):
    """The prompt holds two texts that open alike (20 21 22 then 30 31 32 ..., or 40 41 42 ...); the answer
    goes the way of the earlier one, after the lookup proposed the later: only the tree holds it."""
    import replay_trees

    prompt = [5, 20, 21, 22, *range(30, 40), 6, 20, 21, 22, *range(40, 50), CONTROL, HEADER]
    context = [*prompt, 20, 21, 22]
    assert replay_trees.other_matches(context, exclude=40) == [[30, 31, 32, 33, 34, 35]]
    tree = replay_trees.grow([40, 41, 42], context, nodes=8)
    assert tree.branches() == [[40, 41, 42], [30, 31, 32, 33, 34]]
    truth = [20, 21, 22, *range(30, 40)]
    assert replay_trees.kept_on(tree, truth, 3) == 5
    data = recording(truth)
    data["answers"][0]["prompt"] = prompt
    bounds = replay_trees.bounds(data)
    assert bounds["lookup tree"]["edit"][0] > bounds["copy"]["edit"][0]


def test_a_two_wide_model_tree_keeps_the_runner_up_where_its_chain_breaks(replay_planner):
    """The draft model's guesses: its first choice right but at irregular places, where its runner-up is:
    free verify positions (a GPU's shape) make the tree's extra leaf pay, dear ones (COSTS) do not."""
    import replay_trees

    truth = list(range(100, 160))
    breaks = {3, 9, 12, 20, 23, 31, 34, 41, 47, 50, 56}
    data = recording(truth)
    data["answers"][0]["draft_guesses"] = [[7, t] if i in breaks else [t, 7] for i, t in enumerate(truth)]
    priced = replay_trees.model_drafts(data, draft_ratio=0.1)
    data["verify_s"] = {str(n): f for n, f in replay_trees.GPU_SHAPE.items()}
    gpu = replay_trees.model_drafts(data, draft_ratio=0.1)
    assert gpu["model tree"]["edit"][0] > gpu["model chain"]["edit"][0]
    assert priced["model tree"]["edit"][0] < priced["model chain"]["edit"][0]


def test_copies_that_break_every_few_tokens_stay_within_the_bound_of_plain(replay_planner):
    """On a steep CPU's verify costs, an answer that copies its prompt nine tokens at a time, each piece
    from somewhere else, loses long bets again and again unbounded; bounded (engine/loss_bound.py) it
    stays within LOSS_SHARE and START_TOKENS of plain decoding."""
    from localspec.engine.loss_bound import LOSS_SHARE, START_TOKENS

    source, answer, at = list(range(10, 50)), [], 0
    while len(answer) < 60:
        answer += source[at:at + 9] + [700 + len(answer)]
        at = (at + 12) % 30
    data = recording(answer)
    data["verify_s"] = {"1": 1.0, "2": 1.9, "3": 2.4, "4": 3.0, "6": 4.6, "8": 7.2, "12": 7.6, "16": 8.1}
    assert replay_planner.replay(data, bounded=False)["edit"][0] < 0.8
    assert replay_planner.replay(data)["edit"][0] >= 1 / (1 + LOSS_SHARE + START_TOKENS / len(answer))


def test_a_bound_with_no_room_replays_plain_decoding_and_a_looser_one_drafts(replay_planner):
    """`replay(bound=(share, start))` replays the planner under another loss bound than the shipped one:
    with nothing to lose nothing is drafted (exactly plain), with room the same copy is drafted."""
    answer = list(range(10, 50))  # the prompt copied whole
    data = recording(answer)
    assert replay_planner.replay(data, bound=(0.0, 0.0))["edit"] == [1.0]
    assert replay_planner.replay(data, bound=(0.02, 2.5))["edit"][0] > 1.5


def test_the_oracle_within_the_bound_drafts_only_what_the_room_allows(replay_planner):
    """`hindsight_within`: every round keeps all it drafts, and drafts only what the room allows were
    none of it kept (engine/loss_bound.py). Verifying 2 positions costs 1.5 plain tokens, 4 cost 2."""
    from replay_trees import hindsight, hindsight_within

    price = replay_planner.CostModel({1: 1.0, 2: 1.5, 4: 2.0})
    keepable = [3, 2, 1, 0]  # at the start three tokens of copy hold, then two, one, none
    assert hindsight(keepable, price) == 2.0  # the three at once: 4 positions for 2.0
    assert hindsight_within(keepable, price, 0.0, 1.0) == 2.0  # a room of 1 covers the 4 positions' loss
    # A room of 0.5 covers one token's loss (1.5 - 1): one token, then with the half token it gained, one more
    assert hindsight_within(keepable, price, 0.0, 0.5) == 3.0
    assert hindsight_within(keepable, price, 0.0, 0.0) == 4.0  # no room: plain decoding
    # The share of the tokens produced adds room as the answer goes: 25% after two plain tokens is 0.5
    assert hindsight_within([0, 0, 1, 0], price, 0.25, 0.0) == 3.5


def test_the_oracle_in_the_shipped_bound_lies_between_the_planner_and_the_free_oracle(replay_planner):
    """`oracle(bound=...)`: the most a copy planner obeying the bound reaches on a whole copy at steep
    costs, below the free oracle (the first long copy waits for room), above the planner."""
    from localspec.engine.loss_bound import LOSS_SHARE, START_TOKENS

    data = recording(list(range(10, 50)) * 2)  # the prompt's text, twice
    data["verify_s"] = {"1": 1.0, "2": 1.9, "3": 2.4, "4": 3.0, "6": 4.6, "8": 7.2, "12": 7.6, "16": 8.1}
    free = replay_planner.oracle(data)["edit"][0]
    within = replay_planner.oracle(data, bound=(LOSS_SHARE, START_TOKENS))["edit"][0]
    planner = replay_planner.replay(data)["edit"][0]
    assert free > within > 1.0
    assert within >= planner


def test_replay_with_another_bound_and_the_oracle_prints_the_oracle_within_it(replay_planner, tmp_path, monkeypatch,
                                                                             capsys):
    """`replay --oracle --bound SHARE:START` prints the oracle within that bound beside the planner under
    it: a larger start lets the first long copy go sooner, so the oracle within it reaches more."""
    import json
    import re

    data = recording(list(range(10, 50)) * 2)
    data["verify_s"] = {"1": 1.0, "2": 1.9, "3": 2.4, "4": 3.0, "6": 4.6, "8": 7.2, "12": 7.6, "16": 8.1}
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr("sys.argv", ["replay_planner.py", "replay", str(path), "--oracle", "--bound", "0.02:8"])
    replay_planner.main()
    printed = dict(re.findall(r"^(.+?)\s+edit\s+median ([0-9.]+)x", capsys.readouterr().out, re.M))
    assert set(printed) >= {"planner", "oracle", "oracle in bound", "2.0%+8", "oracle in 2.0%+8"}
    assert float(printed["oracle"]) >= float(printed["oracle in 2.0%+8"]) > float(printed["oracle in bound"])

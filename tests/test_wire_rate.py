"""benchmarks/wire_rate.py's bookkeeping: who answers first, and a prompt's ratio over its repeats."""

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def wire_rate():
    return load_benchmark("wire_rate")


def test_each_prompt_of_two_repeats_is_answered_first_by_each_server_once(wire_rate):
    names = ["localspec", "llama-server"]
    for turn in range(5):
        firsts = [wire_rate.asking_order(names, turn, repeat)[0] for repeat in range(2)]
        assert sorted(firsts) == sorted(names)
    assert [wire_rate.asking_order(names, turn, 0)[0] for turn in range(4)] == names * 2  # alternating in a suite


def test_a_prompts_ratio_is_the_geometric_mean_of_its_repeats(wire_rate):
    rows = [{"suite": "edit", "prompt": "a", "ratio": 0.8}, {"suite": "edit", "prompt": "a", "ratio": 1.25},
            {"suite": "edit", "prompt": "b", "ratio": 0.9}, {"suite": "code", "prompt": "a", "ratio": 1.1}]
    ratios = wire_rate.prompt_ratios(rows)
    assert ratios[("edit", "a")] == pytest.approx(1.0)
    assert ratios[("edit", "b")] == pytest.approx(0.9)
    assert ratios[("code", "a")] == pytest.approx(1.1)
    assert len(ratios) == 3


def test_what_localspec_drafted_is_summed_over_drafters_and_rows(wire_rate):
    rows = [{"drafts": {"copy": [10, 7], "model": [3, 1]}}, {"drafts": {}}, {"drafts": {"copy": [5, 5]}}, {}]
    assert wire_rate.drafted_in(rows) == (18, 13)

"""benchmarks/gpu_sim.py: ggml-cuda's graph rule as the clock, llama-server's fixed policies, and the
engine's planner keeping to a shape where a change costs."""

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def sim():
    return load_benchmark("gpu_sim")


def test_the_clock_charges_a_changed_shape_until_it_was_held_long_enough(sim):
    steady, changed = sim.cost_sets()["recorded"]
    clock = sim.GpuClock(sim.CostModel(steady, changed_s=changed))
    seen = [clock.decode(n) for n in (4, 1, 1, 1, 1, 1)]
    # as on the H200: the 1st-3rd one-position decodes after a 4-batch slow, the stream's cost after
    assert seen == [pytest.approx(changed[4])] + [pytest.approx(changed[1])] * 3 + [pytest.approx(steady[1])] * 2


def test_the_recorded_tables_keep_the_h200s_figures(sim):
    steady, changed = sim.cost_sets()["recorded"]
    assert steady[1] == pytest.approx(sim.STEADY_ONE_MS / 1e3)
    assert {n: round(s * 1e3, 1) for n, s in changed.items()} == sim.CHANGED_MS
    assert all(steady[n] < changed[n] for n in steady)


def test_a_fixed_draft_pays_its_drafts_and_one_verify_shape(sim):
    steady, changed = sim.cost_sets()["recorded"]
    answer = sim.Answer(keepable=[3] * 16)  # every draft kept whole: 4 rounds of 4 tokens
    verify = sim.CostModel(steady, changed_s=changed)
    expected = 4 * 3 * 0.001 + 3 * verify.changed(4) + verify.verify(4)  # graphs captured from the 4th verify
    assert sim.run_fixed(answer, steady, changed, 3, 0.001) == pytest.approx(expected)


def test_ngram_mod_drafts_only_a_long_match(sim):
    steady, changed = sim.cost_sets()["mild"]
    text = list(range(100, 300))
    repeated = sim.Answer(keepable=[], prompt=text + [1], truth=text + [2])  # the prompt again
    fresh = sim.Answer(keepable=[], prompt=text + [1], truth=list(range(300, 500)))
    assert sim.run_ngram_mod(repeated, steady, changed) < 0.5 * sim.run_ngram_mod(fresh, steady, changed)


def test_the_planner_holds_a_shape_and_beats_a_fixed_draft_where_drafts_fail(sim):
    steady, changed = sim.cost_sets()["recorded"]
    head_s = sim.HEAD_STEP_MS / 1e3
    low = sim.mtp_answers(1, 256, 0.3, flat=0.3)[0]
    high = sim.mtp_answers(1, 256, 0.3, flat=0.8)[0]
    for answer in (low, high):
        plain = sim.run_fixed(answer, steady, changed, 0, 0.0)
        ours = plain / sim.run_localspec(answer, steady, changed, [sim.SimHead(head_s)], "mtp", head_s)
        theirs = plain / sim.run_fixed(answer, steady, changed, 3, head_s)
        assert ours >= theirs - 0.02
    assert plain / sim.run_localspec(low, steady, changed, [sim.SimHead(head_s)], "mtp", head_s) > 0.9


def test_a_head_draft_carries_what_drafting_it_took(sim):
    head = sim.SimHead(0.002)
    draft = head.begin([1, 2], None).draft([1, 2], 3, None)
    assert draft.seconds == pytest.approx(3 * 0.002)  # as a live draft's measured time: the planner counts it


def test_where_a_change_of_shape_costs_the_loss_bound_leaves_drafts_to_the_shape_pricing(sim):
    """A bound that cut a head's drafts short on a GPU would leave its shape and pay the warm-up back to
    one position on every cut (engine/loss_bound.py): there the shape pricing alone decides."""
    steady, changed = sim.cost_sets()["recorded"]
    head_s = sim.HEAD_STEP_MS / 1e3
    answer = sim.mtp_answers(1, 128, 0.3, flat=0.5, seed=3)[0]  # half its tokens kept: early losses, later gains
    bounded, unbounded = (sim.run_localspec(answer, steady, changed, [sim.SimHead(head_s)], "mtp", head_s,
                                            loss_bound=b) for b in (True, False))
    assert bounded == pytest.approx(unbounded)
    assert sim.run_fixed(answer, steady, changed, 0, 0.0) / bounded > 0.95

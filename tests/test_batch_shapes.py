"""Verify batches priced by shape: where a change of batch shape costs (a GPU's captured graphs), drafts
keep to the shape held, padded up to it where that is cheaper; where it costs nothing, nothing moves."""

import pytest

from localspec.engine.adaptive import best_length
from localspec.engine.costs import SETTLE_ROUNDS, WARM_VERIFIES, CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.calibration import Calibration, steady_sizes, take
from localspec.engine.events import Round, answer_tokens
from toy import RecurrentToy, ToyModel

STEADY = {1: 1.0, 2: 1.3, 4: 1.45, 8: 2.0, 16: 2.6}
CHANGED = {n: s + 0.9 for n, s in STEADY.items()}  # every shape change costs most of a token again


def _gpu_like() -> CostModel:
    return CostModel(dict(STEADY), changed_s=dict(CHANGED))


def _held(cost: CostModel, n: int) -> CostModel:
    for _ in range(WARM_VERIFIES):
        cost.decoded(n)
    return cost


def test_where_a_change_of_shape_costs_nothing_prices_are_the_calibration():
    cost = CostModel(dict(STEADY))
    _held(cost, 4)
    assert [cost.price(n) for n in (1, 2, 4, 8)] == [cost.verify(n) for n in (1, 2, 4, 8)]
    assert cost.shape_for(2) == 2
    assert cost.expected(2) == cost.verify(2)


def test_the_shape_held_is_steady_and_any_other_costs_a_change():
    cost = _held(_gpu_like(), 4)
    assert cost.price(4) == pytest.approx(STEADY[4])
    # another shape: steady, plus its warm-up spread over the rounds a shape is kept for
    assert cost.price(8) == pytest.approx(STEADY[8] + (CHANGED[8] - STEADY[8]) * WARM_VERIFIES / SETTLE_ROUNDS)
    # fewer positions than the shape held: padded up to it, since that is cheaper than changing
    assert cost.shape_for(2) == 4 and cost.price(2) == pytest.approx(STEADY[4])
    # but one position changes the shape: decoding plainly for a while is cheaper than a pad to 4 each time
    assert cost.shape_for(1) == 1


def test_a_verify_is_expected_slow_until_its_shape_was_held_long_enough():
    cost = _gpu_like()
    seen = []
    for _ in range(WARM_VERIFIES + 1):
        seen.append(cost.expected(4))
        cost.decoded(4)
    assert seen == [pytest.approx(CHANGED[4])] * WARM_VERIFIES + [pytest.approx(STEADY[4])]
    cost.decoded(2)
    assert cost.expected(4) == pytest.approx(CHANGED[4])


def test_learning_the_speed_factor_compares_a_verify_with_what_its_shape_costs():
    cost = _gpu_like()
    cost.observe(4, CHANGED[4])  # right after a change, exactly as calibrated: nothing to learn
    assert cost.scale == pytest.approx(1.0)


def test_a_draft_fills_the_shape_held_instead_of_changing_it():
    rates = [0.75] * 15
    free = CostModel(dict(STEADY))
    assert best_length(rates, free, 0.0)[0] == 3  # where shapes cost nothing: the best ratio
    held = _held(_gpu_like(), 8)
    assert best_length(rates, held, 0.0)[0] == 7  # the held shape's positions cost nothing more


def _engine(target, cost):
    draft = ToyModel(seed=3, noise_seed=103, noise=1.5)
    return Engine(target, draft, EngineOptions(drafter="model", learn_costs=False), cost=cost, draft_cost_s=0.01)


def _plain(prompt, n):
    engine = Engine(ToyModel(seed=3), None, EngineOptions(drafter="none", learn_costs=False),
                    cost=CostModel(dict(STEADY)))
    return answer_tokens(list(engine.generate(prompt, max_tokens=n)))


@pytest.mark.parametrize("target", [lambda: ToyModel(seed=3), lambda: RecurrentToy(seed=3, max_rollback=6)],
                         ids=["kv", "recurrent"])
def test_padded_verifies_answer_as_plain_decoding_and_keep_few_shapes(target):
    model = target()
    engine = _engine(model, _gpu_like())
    pads = 0
    for prompt in ([0, 5, 9, 11], [0, 20, 21, 22, 23, 20, 21, 22], [0, 30, 2, 3, 17]):
        model.calls.clear()
        events = list(engine.generate(prompt, max_tokens=48))
        assert answer_tokens(events) == _plain(prompt, 48)
        verified = [n for _start, n in model.calls[1:]]  # (the prompt first)
        changes = sum(a != b for a, b in zip(verified, verified[1:]))
        assert changes <= len(verified) // 4, verified
        if model.max_rollback is None:  # (a recurrent state decodes again what it could not take back)
            drafted = [1 + len(r.accepted) + len(r.rejected) for r in events if isinstance(r, Round)]
            assert len(drafted) == len(verified)
            pads += sum(n > d for n, d in zip(verified, drafted))
    assert pads > 0 or model.max_rollback is not None  # (some verify was padded up to the shape held)


def test_without_a_change_cost_each_verify_holds_its_draft_and_no_pad():
    model = ToyModel(seed=3)
    engine = _engine(model, CostModel(dict(STEADY)))
    events = list(engine.generate([0, 5, 9, 11], max_tokens=48))
    rounds = [e for e in events if isinstance(e, Round)]
    verified = [n for _start, n in model.calls[1:]]
    assert verified == [1 + len(r.accepted) + len(r.rejected) for r in rounds]


def test_the_calibration_measures_small_sizes_steady_on_a_cpu_and_keeps_both_tables():
    model = ToyModel(seed=3)
    calibration = take(model, sizes=(1, 2, 4, 8), repeats=1)
    assert calibration.steady is not None and sorted(calibration.steady) == [1, 2, 4]
    fours = [n for _start, n in model.calls].count(4)
    assert fours >= 2 + WARM_VERIFIES + 1  # each timed batch of the steady pass after untimed ones of its shape
    measured = Calibration(costs={1: 2.0, 2: 2.5, 4: 3.0}, steady={1: 1.0, 2: 1.5})
    again = Calibration.from_json(measured.to_json())
    assert again is not None and again.steady == measured.steady
    assert again.tables() == ({1: 1.0, 2: 1.5, 4: 3.0}, {1: 2.0, 2: 2.5, 4: 3.0})
    # a change costing less than SHAPE_NOISE of a position is not priced: the CPU's tables as before
    assert Calibration(costs={1: 2.0, 2: 2.5}, steady={1: 1.9, 2: 2.45}).tables() == ({1: 2.0, 2: 2.5}, None)
    assert Calibration(costs={1: 2.0}).tables() == ({1: 2.0}, None)


def test_where_a_position_costs_far_more_than_a_rebuilt_graph_no_steady_pass_is_taken():
    costs = {1: 0.06, 2: 0.09, 4: 0.1}  # the default target's scale on a CPU
    assert steady_sizes(ToyModel(seed=3), (1, 2, 4, 8), costs) == []
    assert steady_sizes(ToyModel(seed=3), (1, 2, 4, 8), {n: s / 100 for n, s in costs.items()}) == [1, 2, 4]
    assert Calibration(costs=costs, steady={}).tables() == (costs, None)

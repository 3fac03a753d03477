"""Costs you can trust: which calibrations are cached, when live rounds overrule one, and the one rule
for the speedup shown (engine/calibration.py, engine/speedup.py). Injected clocks and CPU readings;
tests/test_engine_real.py runs the same beside a real second llama.cpp process."""

import json

import pytest

from localspec import paths
from localspec.engine import calibration
from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.backend import ModelOptions
from localspec.engine.events import Summary
from localspec.engine.speedup import PlainRounds, SpeedupMeter
from toy import CpuScript, ToyModel

PER_POSITION = 0.01  # what the fake clock charges a decode per position


class TimedToy(ToyModel):
    """The toy model with a file (so its calibration is cached) and a fake clock its decodes advance:
    `slowdown` makes the calibration passes numbered in `slow_passes` (from 1) that many times slower: by
    default every pass after the first (a machine that got busy: most passes slowed)."""

    def __init__(self, path, clock, slowdown=1.0, slow_passes=(2, 3), **kw):
        super().__init__(**kw)
        self.path, self.build, self.options = path, "toy", ModelOptions(n_threads=1)
        self.clock, self.slowdown, self.calibration_decodes, self.one_token = clock, slowdown, 0, 0
        self.slow_passes = set(slow_passes)

    def decode(self, tokens, start, logits_for, seq=0):
        if start == 48:  # a calibration batch (after its 48-token context)
            self.calibration_decodes += 1
            self.one_token += len(tokens) == 1  # each pass starts with one position; the warm-up does too
            slow = self.slowdown if self.one_token - 1 in self.slow_passes else 1.0
            self.clock[0] += PER_POSITION * len(tokens) * slow
        return super().decode(tokens, start, logits_for, seq)


@pytest.fixture
def fake_clock(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("localspec.engine.calibration.perf_counter", lambda: clock[0])
    monkeypatch.setattr("localspec.engine.calibration.others_busy_now", lambda *a, **k: 0.0)
    return clock


def _cached() -> dict:
    file = paths.calibration_file()
    return json.loads(file.read_text()) if file.exists() else {}


def _gguf(tmp_path):
    path = tmp_path / "toy.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_a_calibration_whose_passes_disagree_is_used_but_not_cached(tmp_path, fake_clock, monkeypatch):
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript())
    model = TimedToy(_gguf(tmp_path), fake_clock, slowdown=3.0)
    calibrator = calibration.Calibrator(model)
    assert not calibrator.current.trusted and "disagreed" in calibrator.current.problem
    assert _cached() == {}
    assert calibrator.due.startswith("it was not trusted")


def test_one_slow_pass_in_three_leaves_a_quiet_first_start_trusted(tmp_path, fake_clock, monkeypatch):
    """A first start's slow pass (page faults, a stray timer: slowest over fastest read 1.30 on an idle
    EPYC) is outvoted by the two that agree, and the costs are theirs."""
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript())
    model = TimedToy(_gguf(tmp_path), fake_clock, slowdown=1.5, slow_passes=(1,))
    calibrator = calibration.Calibrator(model)
    assert calibrator.current.trusted and calibrator.current.spread == pytest.approx(1.0)
    assert calibrator.current.costs[1] == pytest.approx(PER_POSITION) and _cached() != {}


@pytest.mark.parametrize("share,others,why", [(0.45, 0.5, "CPU time"), (1.0, 0.6, "other programs")])
def test_a_calibration_taken_while_the_cpu_was_shared_is_not_cached(tmp_path, fake_clock, monkeypatch, share, others, why):
    """Steady contention slows every pass alike, so the passes agree: the CPU readings tell."""
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript(share=share, others=others, cores=2))
    calibrator = calibration.Calibrator(TimedToy(_gguf(tmp_path), fake_clock))
    assert calibrator.current.spread == pytest.approx(1.0)
    assert why in calibrator.current.problem and _cached() == {}


def test_a_quiet_calibration_is_cached_with_when_and_how_and_reused(tmp_path, fake_clock, monkeypatch):
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript())
    path = _gguf(tmp_path)
    first = calibration.Calibrator(TimedToy(path, fake_clock))
    assert first.current.trusted and not first.from_cache
    (entry,) = _cached().values()
    assert entry["passes"] == 3 and entry["cpu_share"] == pytest.approx(1.0) and entry["measured_at"] > 0
    assert entry["costs"]["1"] == pytest.approx(PER_POSITION)
    again = TimedToy(path, fake_clock)
    assert calibration.Calibrator(again).from_cache and again.calibration_decodes == 0
    (listed,) = calibration.cached_entries()
    assert listed.model == "toy.gguf" and listed.kind == "verify costs" and listed.calibration.trusted


def test_an_entry_of_the_older_format_is_measured_again(tmp_path, fake_clock, monkeypatch):
    """Entries cached before calibrations carried how they were measured may have been taken under load."""
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript())
    model = TimedToy(_gguf(tmp_path), fake_clock)
    key = calibration.cache_key(model)
    paths.ensure(paths.calibration_file().parent)
    paths.calibration_file().write_text(json.dumps({key: {"1": 0.9, "4": 3.2}}))
    assert calibration.cached_entries()[0].calibration is None
    calibrator = calibration.Calibrator(model)
    assert not calibrator.from_cache and calibrator.current.costs[1] == pytest.approx(PER_POSITION)


def test_an_entry_without_steady_costs_is_measured_again_and_then_reused(tmp_path, fake_clock, monkeypatch):
    """Entries cached before the steady costs (each size after its own shape) were measured lack a table
    the pricing of batch shapes needs: the next load measures again, the one after reuses that."""
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript())
    model = TimedToy(_gguf(tmp_path), fake_clock)
    key = calibration.cache_key(model)
    older = calibration.Calibration(costs={1: 0.9, 4: 3.2}, measured_at=1.0, passes=3)
    calibration.store_cached(key, older)
    assert calibration.Calibrator(model).from_cache is False
    again = calibration.Calibrator(model)
    assert again.from_cache and again.current.steady is not None


def _engine(model, drafter="none"):
    return Engine(model, None, EngineOptions(drafter=drafter, history_drafts=False))


def test_a_cached_calibration_that_live_rounds_contradict_is_measured_again_and_replaced(tmp_path, fake_clock,
                                                                                        monkeypatch):
    """A calibration cached from a busy hour (one token priced at 0.9 s) while real one-token rounds
    take far less: the engine measures again between requests and replaces the entry."""
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript())
    model = TimedToy(_gguf(tmp_path), fake_clock, eos_bias=-50.0)
    key = calibration.cache_key(model)
    busy = calibration.Calibration(costs={n: 0.9 * n for n in calibration.CALIBRATION_SIZES}, measured_at=1.0,
                                   passes=3, cpu_share=0.95, others_busy=0.0,
                                   steady={n: 0.9 * n for n in calibration.STEADY_CPU_SIZES})
    calibration.store_cached(key, busy)
    engine = _engine(model)
    assert engine.calibrator.from_cache and engine.cost.verify(1) == pytest.approx(0.9)
    assert engine.maintain() == ""  # nothing contradicts it yet
    list(engine.generate([0, 5, 9, 11], max_tokens=calibration.CONTRADICTION_SAMPLES - 2))
    assert engine.calibrator.due == ""  # one short answer is not enough to overrule it
    list(engine.generate([0, 5, 9, 11, 3], max_tokens=4))
    assert "live one-token rounds" in engine.calibrator.due
    done = engine.maintain()
    assert done.startswith("measured the target's verify costs again")
    assert engine.cost.verify(1) == pytest.approx(PER_POSITION) and engine.cost.scale == 1.0
    assert _cached()[key]["costs"]["1"] == pytest.approx(PER_POSITION)
    assert engine.calibrator.due == ""
    events = list(engine.generate([0, 5, 9, 11, 13], max_tokens=8))  # the slot measuring used is in step again
    assert isinstance(events[-1], Summary) and events[-1].generated_tokens == 8


def test_an_untrusted_calibration_is_replaced_between_requests_once_the_machine_is_quiet(tmp_path, fake_clock,
                                                                                          monkeypatch):
    busy = CpuScript(share=0.45, others=0.5, cores=2)
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", busy)
    model = TimedToy(_gguf(tmp_path), fake_clock, eos_bias=-50.0)
    engine = _engine(model)
    assert not engine.calibrator.current.trusted and _cached() == {}
    assert engine.maintain() == ""  # still busy: not trusted again, nothing cached, tried later
    assert _cached() == {} and engine.calibrator.due == ""  # waiting before the next try
    engine.calibrator._retry_at = 0.0
    busy.share, busy.others = 1.0, 0.0
    assert engine.maintain().startswith("measured the target's verify costs again")
    assert engine.calibrator.current.trusted and len(_cached()) == 1


def test_a_request_stops_maintenance_and_runs(tmp_path, fake_clock, monkeypatch):
    """Measuring between requests gives way to the next request within one calibration batch."""
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript(share=0.45, others=0.5, cores=2))
    engine = _engine(TimedToy(_gguf(tmp_path), fake_clock, eos_bias=-50.0))
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript())
    engine.calibrator._retry_at = 0.0
    asked = []

    def interrupt():
        asked.append(1)
        return len(asked) > 3

    assert engine.maintain(interrupt=interrupt) == ""
    assert not engine.calibrator.current.trusted and len(asked) == 4
    events = list(engine.generate([0, 5, 9, 11], max_tokens=4))
    assert events[-1].generated_tokens == 4


def test_learnt_speed_far_from_the_calibration_for_many_rounds_asks_for_a_measurement(tmp_path, fake_clock,
                                                                                      monkeypatch):
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript())
    calibrator = calibration.Calibrator(TimedToy(_gguf(tmp_path), fake_clock))
    for _ in range(calibration.SCALE_DRIFT_ROUNDS - 1):
        calibrator.observe_scale(2.0)
    assert calibrator.due == ""
    calibrator.observe_scale(2.0)
    assert "rounds away" in calibrator.due
    fresh = calibrator.remeasure(scale=2.0)
    assert fresh is not None and calibrator.reference_scale == 2.0  # the same shape: the factor is the context's
    calibrator.observe_scale(2.0)
    assert calibrator.due == ""


# ----------------------------------------------------------------------------- the speedup shown


def test_an_answer_that_drafted_nothing_is_1x_whatever_the_calibration_says(tmp_path):
    """`--drafter none` printed 1.77x, and 0.59x through RPC workers: the calibration's one-token cost
    was the baseline. A round that drafted nothing is a plain round."""
    for cost in (0.9, 1e-7):  # a calibration far too slow, and far too fast
        engine = Engine(ToyModel(eos_bias=-50.0), None, EngineOptions(drafter="none", history_drafts=False),
                        cost=CostModel({1: cost, 2: 2 * cost, 4: 4 * cost}))
        summary = list(engine.generate([0, 5, 9, 11], max_tokens=20))[-1]
        assert summary.speedup == 1.0 and summary.baseline_measured
        assert summary.baseline_tokens_per_s == pytest.approx(summary.tokens_per_s)
        assert "1.00x" in summary.one_line() and "plain est." not in summary.one_line()


def test_drafting_rounds_are_priced_by_measured_plain_rounds_at_a_comparable_context():
    now = [0.0]
    plain = PlainRounds(clock=lambda: now[0])
    meter = SpeedupMeter(plain, estimate_s=lambda: 1.0)  # the calibration's estimate: 1 s a token
    first = meter.add(100, 0.2, 5, drafted=True)
    assert not first.measured and first.factor == pytest.approx(5 * 1.0 / 0.2)  # an estimate, and said so
    for _ in range(3):
        meter.add(100, 0.05, 1, drafted=False)
    figure = meter.current()
    assert figure.measured
    assert figure.factor == pytest.approx((3 * 0.05 + 5 * 0.05) / (0.2 + 3 * 0.05))
    assert figure.baseline_tokens_per_s == pytest.approx(8 / (8 * 0.05))
    # Plain rounds at 3,000 tokens say nothing of a round at 100: not comparable.
    far = SpeedupMeter(PlainRounds(), estimate_s=lambda: 1.0)
    for _ in range(3):
        far.add(3000, 0.05, 1, drafted=False)
    assert not far.add(100, 0.2, 5, drafted=True).measured
    now[0] += 3600  # an hour later the machine may be another: old plain rounds are not the baseline
    assert plain.per_token_s(100) is None and plain.wanted(100)


def test_the_planner_takes_a_plain_round_instead_of_a_small_gain_while_plain_is_unmeasured():
    from localspec.engine.drafters.base import Draft, Drafter, Offer

    class Small(Drafter):
        name = "ngram"

        def offer(self, context, room, plan):
            return Offer(1, 1.1 / plan.cost.verify(1), Draft([7], source="ngram"))

    from localspec.engine.planner import Drafting

    plain = PlainRounds()
    planner = Drafting(CostModel({1: 1.0, 2: 1.5}), [Small()], plain_wanted=plain.wanted).planner([1, 2])
    assert planner.draft([1, 2, 3], 8, None).tokens == []  # plain decoding here is not measured yet
    for _ in range(3):
        plain.record(3, 1.0)
    assert planner.draft([1, 2, 3], 8, None).tokens == [7]


def test_a_busy_moment_postpones_measuring_and_keeps_the_prompt_cache(tmp_path, fake_clock, monkeypatch):
    monkeypatch.setattr("localspec.engine.calibration.cpu_sample", CpuScript(share=0.45, others=0.5, cores=2))
    engine = _engine(TimedToy(_gguf(tmp_path), fake_clock, eos_bias=-50.0))
    list(engine.generate([0, 5, 9, 11], max_tokens=4))
    held = list(engine.slots[0].tokens)
    monkeypatch.setattr("localspec.engine.calibration.others_busy_now", lambda *a, **k: 0.9)
    engine.calibrator._retry_at = 0.0
    assert engine.maintain() == "" and engine.calibrator.measurements == 1
    assert engine.slots[0].tokens == held and held  # nothing measured: the next turn reuses its prefix

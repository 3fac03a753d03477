"""benchmarks/interleaved_rate.py: two answers generated in turns meet the same machine, and a real run
of it on the small model."""

import json
import subprocess
import sys

import pytest

from conftest import BENCHMARKS, load_benchmark


@pytest.fixture(scope="module")
def interleaved():
    return load_benchmark("interleaved_rate")


class Machine:
    """A clock whose machine runs at full speed for `fast_until` seconds, then at half speed."""

    def __init__(self, fast_until: float):
        self.now = 0.0
        self.fast_until = fast_until

    def work(self, units: float) -> None:
        self.now += units * (1.0 if self.now < self.fast_until else 2.0)


class Side:
    def __init__(self, name, machine, per_token, tokens, log):
        self.name, self.machine, self.per_token, self.left, self.log = name, machine, per_token, tokens, log
        self.tokens, self.done, self.started = [], False, False

    def start(self):
        self.started = True
        self.machine.work(100.0)  # the prompt: not counted

    def step(self):
        assert self.started and not self.done
        self.machine.work(self.per_token)
        self.tokens.append(0)
        self.left -= 1
        self.done = self.left == 0
        self.log.append(self.name)


def test_turns_share_the_machines_drift_between_the_sides(interleaved):
    """One side twice as fast per token as the other, the machine halving its speed a third of the way
    through their answers: in turns the rates keep their 2:1, where back to back the slow side would
    meet more of the slow machine."""
    machine, log = Machine(fast_until=200.0 + 100.0), []  # (after the two prompts' 200)
    fast, slow = Side("fast", machine, 1.0, 100, log), Side("slow", machine, 2.0, 100, log)
    spent = interleaved.interleave([fast, slow], lead=5, clock=lambda: machine.now)
    assert (len(fast.tokens) / spent[0]) / (len(slow.tokens) / spent[1]) == pytest.approx(2.0, rel=0.05)
    assert sum(spent) == pytest.approx(machine.now - 200.0)  # every step counted once, the prompts not
    turns = [name for i, name in enumerate(log) if i == 0 or log[i - 1] != name]
    assert turns[:6] == ["fast", "slow"] * 3 and len(turns) >= 20  # short turns, alternating
    assert log[:5] == ["fast"] * 5 and log[5:15] == ["slow"] * 10  # each turn: 5 tokens past the other


def test_back_to_back_the_same_drift_reads_as_a_gap(interleaved):
    """The control for the test above: one side whole, then the other, on the same machine."""
    machine, log = Machine(fast_until=200.0 + 100.0), []
    fast, slow = Side("fast", machine, 1.0, 100, log), Side("slow", machine, 2.0, 100, log)
    spent = interleaved.interleave([fast, slow], lead=1000, clock=lambda: machine.now)
    assert (len(fast.tokens) / spent[0]) / (len(slow.tokens) / spent[1]) > 3.0


def test_a_drafter_against_own_plain_is_the_ratio_of_its_two_ratios_to_llama(interleaved):
    rows = [{"prompt": "a", "repeat": 0, "variant": "none", "ratio": 0.98},
            {"prompt": "a", "repeat": 0, "variant": "auto", "ratio": 1.47},
            {"prompt": "a", "repeat": 1, "variant": "auto", "ratio": 1.2}]
    interleaved.own_plain(rows)
    assert rows[0]["own_plain"] is None and rows[2]["own_plain"] is None  # no plain run of that repeat
    assert rows[1]["own_plain"] == pytest.approx(1.5)


def test_a_variant_names_its_loss_bounds_terms(interleaved):
    assert interleaved.bound_of("auto") == ("auto", {})
    assert interleaved.bound_of("auto@unbounded") == ("auto", None)
    assert interleaved.bound_of("ngram@0.03:2") == ("ngram", {"share": 0.03, "start_tokens": 2.0})
    with pytest.raises(SystemExit, match="DRAFTER@SHARE:START"):
        interleaved.bound_of("auto@0.03")


@pytest.mark.model
def test_a_real_interleaved_run(smollm2_home, tmp_path):
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "interleaved_rate.py"), "--model", "smollm2-135m", "--suite", "edit",
         "--prompts", "1", "--drafter", "ngram,ngram@unbounded,none", "--max-tokens", "24", "--repeat", "1",
         "--lead", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env={"LOCALSPEC_HOME": str(smollm2_home), "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["ngram", "ngram@unbounded", "none"]
    for row in rows:
        assert 0 < row["tokens"] <= 24 and 0 < row["llama_tokens"] <= 24
        assert row["ratio"] == pytest.approx(row["localspec"] / row["llama"])
        assert row["kept"] <= row["drafted"]
    assert rows[0]["own_plain"] == pytest.approx(rows[0]["ratio"] / rows[2]["ratio"])
    assert "ngram  / own plain" in proc.stdout and "none   / Llama" in proc.stdout

"""benchmarks/attention_rate.py: flash attention on and off measured in turns, a real run on the small
model."""

import json
import subprocess
import sys

import pytest

from conftest import BENCHMARKS, load_benchmark


@pytest.mark.model
def test_a_real_attention_run(smollm2_home, tmp_path):
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "attention_rate.py"), "--model", "smollm2-135m", "--contexts", "16,80",
         "--positions", "1,3", "--steps", "10", "--repeat", "2", "--lead", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env={"LOCALSPEC_HOME": str(smollm2_home), "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["context"], r["positions"], r["first"]) for r in rows] == [
        (16, 1, "on"), (16, 1, "off"), (16, 3, "on"), (16, 3, "off"),
        (80, 1, "on"), (80, 1, "off"), (80, 3, "on"), (80, 3, "off")]
    for row in rows:
        assert row["on"] > 0 and row["off"] > 0
        assert row["ratio"] == pytest.approx(row["on"] / row["off"])
    assert "context    80,  3 positions a step" in proc.stdout


def test_a_side_decodes_its_steps_at_the_end_of_a_growing_context():
    DecodeSide = load_benchmark("attention_rate").DecodeSide

    class Model:
        def __init__(self):
            self.calls = []

        def truncate(self, n_keep):
            self.calls.append(("truncate", n_keep))

        def decode(self, tokens, start, logits_for=()):
            self.calls.append(("decode", list(tokens), start, list(logits_for)))

    model = Model()
    side = DecodeSide("on", model, list(range(100, 130)), context=5, steps=2, positions=3)
    side.start()
    while not side.done:
        side.step()
    assert model.calls == [("truncate", 0), ("decode", [100, 101, 102, 103, 104], 0, []),
                           ("decode", [105, 106, 107], 5, [2]), ("truncate", 6),
                           ("decode", [106, 107, 108], 6, [2]), ("truncate", 7)]
    assert side.tokens == [105, 106]

"""benchmarks/loaded_drafts.py: drafting quiet and beside busy loops, the order of a prompt's four
answers, and a real run on the small model."""

import json
import subprocess
import sys

import pytest

from conftest import BENCHMARKS, load_benchmark


def test_every_prompt_runs_its_four_answers_in_an_order_that_alternates():
    order = load_benchmark("loaded_drafts").order
    orders = [order(n, r) for r in range(2) for n in range(4)]
    for answers in orders:
        assert sorted(answers) == sorted((c, d) for c in ("quiet", "loaded") for d in ("auto", "none"))
        assert answers[0][0] == answers[1][0]  # a condition's pair together, so the busy loops start once
    firsts = [answers[0] for answers in orders]
    assert {c for c, _ in firsts} == {"quiet", "loaded"} and {d for _, d in firsts} == {"auto", "none"}
    assert order(0, 0)[0][0] != order(0, 1)[0][0]  # a prompt's repeats start with the other condition


@pytest.mark.model
def test_a_real_loaded_run(smollm2_home, tmp_path):
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "loaded_drafts.py"), "--model", "smollm2-135m", "--suite", "edit",
         "--prompts", "1", "--max-tokens", "24", "--repeat", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env={"LOCALSPEC_HOME": str(smollm2_home), "PATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["condition"], r["drafter"]) for r in rows) == [
        ("loaded", "auto"), ("loaded", "none"), ("quiet", "auto"), ("quiet", "none")]
    for row in rows:
        assert row["tokens"] > 0 and row["rate"] > 0 and row["kept"] <= row["drafted"]
        assert row["drafted"] == 0 or row["drafter"] == "auto"
    assert "quiet   auto drafted" in proc.stdout and "loaded  auto drafted" in proc.stdout

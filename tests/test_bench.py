"""The bench's statistics and report on recorded runs, and one short real run."""

import json
import subprocess
import sys

import pytest

from localspec import bench as b
from localspec import benchplot
from localspec.engine.adaptive import expected_tokens, speedup_bound


def run(prompt, variant, tps, tokens, temperature=0.0, repeat=0, drafted=0, accepted=0, rounds=10, drafting=0,
        kept=(), tried=(), suite="edit"):
    return b.Run(suite=suite, prompt=prompt, variant=variant, temperature=temperature, repeat=repeat, tokens=tokens,
                 generated=len(tokens), seconds=len(tokens) / tps, tokens_per_s=tps, drafted=drafted, accepted=accepted,
                 rounds=rounds, drafting_rounds=drafting, kept_by_position=list(kept), tried_by_position=list(tried))


RECORDED = [
    run("edit-1", "plain", 10.0, [1, 2, 3, 4]),
    run("edit-1", "ngram", 15.0, [1, 2, 3, 4], drafted=8, accepted=6, drafting=3, kept=(3, 2, 1), tried=(3, 3, 2)),
    run("edit-2", "plain", 12.0, [5, 6, 7, 8]),
    run("edit-2", "ngram", 12.0, [5, 6, 9, 9], drafted=4, accepted=1, drafting=2, kept=(1, 0), tried=(2, 2)),
    run("code-1", "plain", 11.0, [1, 1], suite="code"),
    run("code-1", "ngram", 11.0, [1, 1], suite="code"),
    run("llama-peer", "llama-cpp-python", 9.0, [1, 2, 3, 4]),
]


def test_summary_rows_add_up():
    rows = b.summarize(RECORDED, verify=lambda n: 0.1 + 0.02 * (n - 1), draft_costs={"ngram": 0.0})
    edit = next(r for r in rows if r.suite == "edit" and r.variant == "ngram")
    assert edit.plain_tokens_per_s == pytest.approx(11.0) and edit.tokens_per_s == pytest.approx(13.5)
    assert edit.speedup == pytest.approx(13.5 / 11.0)
    assert (edit.speedup_min, edit.speedup_max) == (pytest.approx(1.0), pytest.approx(1.5))
    assert edit.acceptance == pytest.approx(7 / 12) and edit.mean_accepted == pytest.approx(7 / 5)
    assert edit.draft_length == pytest.approx(12 / 5)
    assert edit.acceptance_by_position == pytest.approx([4 / 5, 2 / 5, 1 / 2])
    assert edit.identical == pytest.approx((1.0 + 0.5) / 2)
    assert edit.bound == pytest.approx(speedup_bound(7 / 12, lambda n: 0.1 + 0.02 * (n - 1), 0.0))
    overall = next(r for r in rows if r.suite == "all" and r.variant == "ngram")
    assert overall.acceptance == pytest.approx(7 / 12)
    table = b.markdown(rows)
    assert table.count("\n") == len(rows) + 1 and "| edit | 0 | ngram |" in table
    svg = benchplot.svg(rows, "test")
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>") and "ngram" in svg


def test_speedups_are_against_the_faster_plain_decoding():
    runs = [
        run("code-1", "plain", 10.0, [1, 2], suite="code"),
        run("code-1", "llama-cpp-python", 12.0, [1, 2], suite="code"),
        run("code-1", "auto", 12.6, [1, 2], suite="code"),
        run("code-2", "plain", 10.0, [1, 2], suite="code"),
        run("code-2", "llama-cpp-python", 11.0, [1, 2], suite="code"),
        run("code-2", "auto", 11.0, [1, 2], suite="code"),
        run("edit-1", "plain", 10.0, [1, 2]),
        run("edit-1", "llama-cpp-python", 9.0, [1, 2]),
        run("edit-1", "auto", 20.0, [1, 2]),
    ]
    rows = {(r.suite, r.variant): r for r in b.summarize(runs)}
    code = rows["code", "auto"]
    assert code.baseline == "llama-cpp-python" and code.plain_tokens_per_s == pytest.approx(11.5)
    assert code.speedup == pytest.approx(11.8 / 11.5)
    assert (code.speedup_min, code.speedup_max) == (pytest.approx(1.0), pytest.approx(1.05))
    assert rows["code", "plain"].speedup == pytest.approx(10.0 / 11.5)  # our plain decoding, against Llama's
    edit = rows["edit", "auto"]
    assert edit.baseline == "plain" and edit.speedup == pytest.approx(2.0)
    assert "| code | 0 | auto | Llama 11.5 |" in b.markdown(list(rows.values()))


def test_prompts_slower_than_plain_beyond_the_runs_noise_are_named():
    """localspec's and Llama's plain decoding run at one speed, so their per-prompt gap is the run's noise:
    a drafted prompt below plain by more than that (and below 0.97x) is named; one within it is not."""
    runs = []
    for prompt, plain, llama, auto in (("chat-1", 10.0, 10.5, 9.0), ("chat-2", 10.0, 9.6, 9.6), ("chat-3", 10.0, 10.0, 10.4)):
        for repeat in (0, 1):
            runs += [run(prompt, "plain", plain, [1], suite="chat", repeat=repeat),
                     run(prompt, "llama-cpp-python", llama, [1], suite="chat", repeat=repeat),
                     run(prompt, "auto", auto, [1], suite="chat", repeat=repeat)]
    rows = {(r.suite, r.variant): r for r in b.summarize(runs)}
    auto = rows["chat", "auto"]
    assert auto.noise == pytest.approx(0.05)                     # chat-1: Llama 5% faster than plain
    assert auto.slower == {"chat-1": pytest.approx(0.9)}         # 0.90x: beyond 5%; chat-2's 0.96x is within it
    notes = b.slower_prompts(list(rows.values()))
    assert "chat auto T=0: slower than plain beyond the noise (plain and Llama differed by up to 5% on a prompt): " \
           "chat-1 0.90x" in notes
    without_llama = b.summarize([r for r in runs if r.variant != "llama-cpp-python"])
    auto = next(r for r in without_llama if r.suite == "chat" and r.variant == "auto")
    assert auto.noise is None and set(auto.slower) == {"chat-1", "chat-2"}  # no noise measured: the 0.97x bar alone
    assert "noise not measured" in b.slower_prompts(without_llama)


def test_speedup_bound_is_the_best_length_under_the_costs():
    flat = lambda n: 1.0  # noqa: E731  a GPU-like verify: any small batch costs one token
    assert speedup_bound(0.0, flat, 0.0) == pytest.approx(1.0)
    assert speedup_bound(0.5, flat, 0.0, max_len=16) == pytest.approx(2 - 0.5 ** 16)  # 1 + 1/2 + ... + 1/2**16
    assert expected_tokens([1.0] * 3) == 4.0
    steep = lambda n: float(n)  # noqa: E731  verifying n costs n tokens: drafting can never pay
    assert speedup_bound(0.9, steep, 0.0) == pytest.approx(1.0)


def test_suites_ship_at_least_eight_prompts_each():
    prompts = b.load_suites(b.SUITES)
    for suite in b.SUITES:
        assert len([p for p in prompts if p.suite == suite]) >= 8
    with pytest.raises(Exception, match="Unknown suite"):
        b.load_suites(["poetry"])


@pytest.mark.model
def test_a_short_real_bench_run(test_home_with_smollm2, tmp_path):
    out, plot = tmp_path / "runs.json", tmp_path / "plot.svg"
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "bench", "smollm2-135m", "--suite", "edit,chat", "--prompts", "1",
         "--max-tokens", "16", "--drafter", "ngram", "--temperature", "0", "--json", str(out), "--plot", str(plot)],
        capture_output=True, text=True, timeout=600,
        env={"LOCALSPEC_HOME": str(test_home_with_smollm2), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    runs = data["runs"]
    ours = [r for r in runs if r["variant"] in ("plain", "ngram")]
    assert len(ours) == 4 and {r["suite"] for r in ours} == {"edit", "chat"}
    assert {r["variant"] for r in runs} >= {"llama-cpp-python", "llama-cpp-python+lookup"}
    for r in runs:
        assert 0 < r["generated"] <= 16 and r["tokens_per_s"] == pytest.approx(r["generated"] / r["seconds"], rel=0.05)
        assert r["accepted"] <= r["drafted"]
    llama = [r for r in runs if r["variant"] == "llama-cpp-python"]
    assert {r["prompt"] for r in llama} == {r["prompt"] for r in ours}  # the plain peer runs on every prompt
    for r in ours + llama:  # one run of each side per prompt starts from an empty cache
        assert r["cold"] and r["first_token_s"] > 0
    row = next(r for r in data["rows"] if r["suite"] == "all" and r["variant"] == "ngram")
    plain = [r["tokens_per_s"] for r in ours if r["variant"] == "plain"]
    peer = [r["tokens_per_s"] for r in llama]
    assert row["plain_tokens_per_s"] == pytest.approx(max(sum(plain) / 2, sum(peer) / 2))
    assert row["baseline"] == ("plain" if sum(plain) >= sum(peer) else "llama-cpp-python")
    assert row["speedup"] == pytest.approx(row["tokens_per_s"] / row["plain_tokens_per_s"])
    assert row["identical"] is not None and 0 <= row["identical"] <= 1
    assert "| all | 0 | ngram |" in proc.stdout and "llama-cpp-python" in proc.stdout
    assert data["meta"]["peers_not_run"]["llama-speculative-simple"]  # a peer that cannot run says why
    assert "llama-speculative-simple: not run (" in proc.stdout
    assert plot.read_text().startswith("<svg")


@pytest.mark.model
def test_the_structured_suite_runs_every_side_under_the_same_grammar(test_home_with_smollm2, tmp_path):
    """localspec (plain and drafting) and `Llama` (its own grammar sampling) on the same GBNF: every
    answer, cut at the token budget or not, is a prefix the grammar accepts (checked on llama.cpp's
    grammar, token by token)."""
    from localspec.engine.backend import VocabFile

    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "bench", "smollm2-135m", "--suite", "structured", "--prompts", "8",
         "--max-tokens", "12", "--drafter", "auto", "--temperature", "0", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
        env={"LOCALSPEC_HOME": str(test_home_with_smollm2), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert {r["variant"] for r in runs} == {"plain", "auto", "llama-cpp-python"}  # no unconstrained peers
    prompts = {p.id: p for p in b.load_suites(["structured"])}
    with VocabFile(test_home_with_smollm2 / "data" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf") as file:
        for r in runs:
            grammar = file.vocab.grammar(prompts[r["prompt"]].grammar)
            for token in r["tokens"]:
                assert grammar.allows([token])[0], (r["variant"], r["prompt"], r["tokens"])
                grammar.accept(token)
            grammar.close()
    assert "| structured | 0 | auto |" in proc.stdout


def test_session_suites_ship_every_kind():
    sessions = b.load_sessions()
    assert {s.kind for s in sessions} == set(b.SESSION_KINDS)
    assert all(len(s.requests) >= 2 for s in sessions)
    assert b.load_suites(["code", b.SESSIONS]) == b.load_suites(["code"])  # sessions run apart


@pytest.mark.model
def test_a_real_session_bench_drafts_regenerations_from_history_and_nothing_else_does(test_home_with_smollm2, tmp_path):
    out = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "bench", "smollm2-135m", "--suite", "chat,sessions", "--prompts", "1",
         "--max-tokens", "24", "--drafter", "auto", "--temperature", "0", "--no-peers", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env={"LOCALSPEC_HOME": str(test_home_with_smollm2), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    runs = data["runs"]
    # A single-request suite never drafts from history: its variants must not copy each other's answers.
    chat = [r for r in runs if r["suite"] == "chat"]
    assert chat and all(r["drafted_by"].get("history", 0) == 0 for r in chat)
    # Each session's requests ran in order for both variants; the first has nothing to draft from.
    assert {r["suite"] for r in runs} >= {b.FIRST_REQUEST, *b.SESSION_KINDS}
    assert all(r["drafted_by"].get("history", 0) == 0 for r in runs if r["suite"] == b.FIRST_REQUEST)
    regenerated = {r["variant"]: r for r in runs if r["suite"] == "regenerate"}
    assert regenerated["auto"]["tokens"] == regenerated["plain"]["tokens"]
    assert regenerated["auto"]["drafted_by"]["history"] > 0 and regenerated["auto"]["accepted"] > 0
    row = next(r for r in data["rows"] if r["suite"] == "regenerate" and r["variant"] == "auto")
    assert row["history_share"] > 0
    assert "| regenerate | 0 | auto |" in proc.stdout and "from history" in proc.stdout


def test_variants_alternate_by_prompt_and_by_repeat(monkeypatch):
    """With two repeats each prompt runs A B B A (drift between runs hits both sides alike), and the next
    prompt starts with the other side."""
    from localspec.bench import runner

    order = []

    def fake_run(engine, prompt, variant, temperature, r, max_tokens, cold=False, messages=None):
        order.append((prompt.id, r, variant))
        return run(prompt.id, variant, 10.0, [1], repeat=r)

    class Engine:
        target = type("T", (), {"vocab": type("V", (), {"is_eog": staticmethod(lambda t: False)})()})()

        def chat_tokens(self, messages, tools=None):
            return [1, 2]

        def drafter(self, name):
            return None

    monkeypatch.setattr(runner, "run_engine", fake_run)
    prompts = [b.Prompt("code", i, "text") for i in range(2)]
    runner.bench(Engine(), prompts, drafters=["auto"], temperatures=[0.0], max_tokens=4, repeat=2, peers=False)
    assert [v for _p, _r, v in order] == ["plain", "auto", "auto", "plain", "auto", "plain", "plain", "auto"]
    assert [(p, r) for p, r, _v in order[:4]] == [("code-1", 0), ("code-1", 0), ("code-1", 1), ("code-1", 1)]


def test_a_suite_of_your_own_from_a_yaml_file(tmp_path):
    from localspec.bench.suites import load_suites
    from localspec.errors import LocalspecError

    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\nprompts:\n- Rename x to y.\n- Add a docstring.\n")
    prompts = load_suites(["edit", str(mine)])
    assert [p.id for p in prompts if p.suite == "mine"] == ["mine-1", "mine-2"]
    assert prompts[-1].text == "Add a docstring."
    with pytest.raises(LocalspecError, match="Cannot read the suite file"):
        load_suites([str(tmp_path / "missing.yaml")])
    (tmp_path / "bad.yaml").write_text("just: [a, list\n")
    with pytest.raises(LocalspecError, match="is not a suite file"):
        load_suites([str(tmp_path / "bad.yaml")])
    (tmp_path / "empty.yaml").write_text("name: empty\nprompts: []\n")
    with pytest.raises(LocalspecError, match="lists no prompts"):
        load_suites([str(tmp_path / "empty.yaml")])
    from pathlib import Path

    shipped = load_suites([str(Path(__file__).parents[1] / "benchmarks" / "prompts" / "heldout_edit2.yaml")])  # a held-out set
    assert len(shipped) == 8 and shipped[0].suite == "edit-heldout-2"


def test_sessions_of_your_own_from_a_yaml_file(tmp_path):
    """A file of sessions runs with the sessions (in order, each kind's rules), not as single prompts."""
    from pathlib import Path

    from localspec.bench.suites import load_sessions, load_suites
    from localspec.errors import LocalspecError

    held_out = str(Path(__file__).parents[1] / "benchmarks" / "prompts" / "heldout_followups.yaml")
    sessions = load_sessions([held_out])
    assert len(sessions) == 8 and {s.kind for s in sessions} == {"follow-up"}
    assert all(len(s.requests) == 2 for s in sessions)
    assert load_suites(["code", held_out]) == load_suites(["code"])
    both = load_sessions(["sessions", held_out])
    assert len(both) == len(load_sessions()) + 8 and len({s.id for s in both}) == len(both)  # reported apart
    assert sessions[0].suite == "heldout_followups:follow-up" and load_sessions()[0].suite == "follow-up"
    retellings = load_sessions([str(Path(held_out).with_name("heldout_retellings.yaml"))])
    assert [s.kind for s in retellings] == ["quote"] * 4 + ["tool-output"] * 4
    assert all(isinstance(s.requests[1], dict) for s in retellings)  # each second request a new conversation
    (tmp_path / "odd.yaml").write_text("sessions:\n- kind: rerun\n  requests: [a, b]\n")
    with pytest.raises(LocalspecError, match="Unknown session kind 'rerun'"):
        load_sessions([str(tmp_path / "odd.yaml")])
    (tmp_path / "bad.yaml").write_text("sessions:\n- requests: [a, b]\n")
    with pytest.raises(LocalspecError, match="is not a sessions file"):
        load_sessions([str(tmp_path / "bad.yaml")])


def test_the_heads_estimate_is_the_best_length_at_published_acceptance():
    from localspec.bench.estimate import Published, estimate
    from localspec.engine.adaptive import CostModel

    published = Published("a head", "somewhere", (0.8, 0.6, 0.3))
    assert published.chained() == pytest.approx([0.8, 0.75, 0.5])
    cost = CostModel({1: 0.10, 2: 0.11, 3: 0.12, 4: 0.20})
    guess = estimate(cost, 0.01, published)
    # k=1: 1.8 tokens in 0.12 s; k=2: 2.4 in 0.14 s (the best); k=3: 2.7 in 0.23 s; plain: 1 in 0.10 s
    assert guess.draft_len == 2 and guess.speedup == pytest.approx(2.4 / 0.14 / 10)
    assert guess.step_share == pytest.approx(0.1)
    assert "1.71x plain decoding with 2-token drafts" in guess.describe()
    assert "not a measured speed" in guess.describe() and "0.8/0.6/0.3 of drafts kept through positions 1-3" in guess.describe()
    # chained heads cap the length (one head a token): a file with one such head drafts one token
    assert estimate(cost, 0.01, published, max_len=1).draft_len == 1
    slow = estimate(CostModel({1: 0.10, 2: 0.30, 3: 0.45, 4: 0.60}), 0.05, published)
    assert slow.draft_len == 0 and slow.speedup == pytest.approx(1.0) and "no gain" in slow.describe()

"""Self-speculative drafts built from SmolLM2-135M's own layers, used by the real engine."""

import subprocess
import sys

import pytest

from localspec import selfdraft
from localspec.loader import load
from localspec.engine.backend import Model, ModelOptions, VocabFile
from localspec.engine.events import Summary, answer_tokens
from localspec.engine.pairing import check_pair
from localspec.errors import LocalspecError

pytestmark = pytest.mark.model

KEEP = [i for i in range(30) if i not in (12, 14, 16)]


@pytest.fixture(scope="module")
def self_draft(smollm2_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("sd") / "smollm2.self.gguf"
    return selfdraft.make(smollm2_path, KEEP, out)


def test_the_self_draft_has_the_kept_blocks_renumbered_and_pairs(smollm2_path, self_draft):
    assert selfdraft.describe(self_draft) == ("llama", len(KEEP))
    import gguf

    reader = gguf.GGUFReader(str(self_draft))
    names = {t.name for t in reader.tensors}
    assert f"blk.{len(KEEP) - 1}.attn_q.weight" in names and f"blk.{len(KEEP)}.attn_q.weight" not in names
    assert list(reader.get_field("localspec.self_draft.layers").contents()) == KEEP
    with VocabFile(smollm2_path) as tv, VocabFile(self_draft) as dv:
        assert check_pair(tv.vocab, dv.vocab).ok
    model = Model(self_draft, ModelOptions(n_ctx=256))  # it loads in llama.cpp
    assert model.meta("llama.block_count") == str(len(KEEP))
    model.close()


def test_greedy_self_speculation_emits_only_target_argmax_tokens(smollm2_path, self_draft):
    engine = load(str(smollm2_path), self_draft=self_draft, drafter="self", draft_len=4, n_ctx=1024, calibrate=False)
    try:
        messages = [{"role": "user", "content": "List the days of the week."}]
        events = list(engine.chat(messages, max_tokens=40))
        engine.reset()
        plain = answer_tokens(engine.chat(messages, max_tokens=40, drafter="none"))  # argmax, one token at a time
    finally:
        engine.close()
    summary = events[-1]
    assert isinstance(summary, Summary)
    assert summary.rounds_by_drafter.get("self", 0) > 0 and summary.drafted > 0
    assert 0 < summary.accepted <= summary.drafted  # acceptance is reported, and the draft is often right
    spec = answer_tokens(events)
    # Identical to plain greedy decoding; llama.cpp's batched and single-token kernels may only flip a near-tie.
    first = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    assert first is None and spec == plain, f"speculative output parts from plain decoding at token {first}"


def test_auto_search_with_a_tiny_budget_returns_a_valid_subset(smollm2_path):
    plan = selfdraft.search(smollm2_path, budget_s=1, prompts=["Say hello."], answer_tokens=8)
    assert 0 < len(plan.keep) < plan.block_count == 30
    assert plan.keep == sorted(set(plan.keep)) and all(0 <= k < 30 for k in plan.keep)
    assert 0.0 <= plan.acceptance <= 1.0 and plan.predicted_speedup >= 1.0


def test_draft_make_cli_remembers_the_draft_for_the_self_drafter(smollm2_path, isolated_home, tmp_path):
    env = {"LOCALSPEC_HOME": str(isolated_home), "PATH": ""}
    out = tmp_path / "d.gguf"
    made = subprocess.run([sys.executable, "-m", "localspec.cli", "draft", "make", str(smollm2_path), "--keep",
                           "0-26,29", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    assert out.exists() and "28 of 30 blocks" in made.stdout
    assert selfdraft.find_self_draft(str(smollm2_path)) == out  # keyed by the target's sha256
    bad = subprocess.run([sys.executable, "-m", "localspec.cli", "draft", "make", str(smollm2_path), "--keep", "0-40"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1 and "Layer 40 does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_layer_lists_and_refused_architectures(tmp_path):  # needs no model
    assert selfdraft.parse_layers("0-3,6, 10-11", 12) == [0, 1, 2, 3, 6, 10, 11]
    for spec, message in [("5-2", "backwards"), ("0-11", "every layer"), ("a", "Cannot read"), ("", "at least one")]:
        with pytest.raises(LocalspecError, match=message):
            selfdraft.parse_layers(spec, 12)
    import gguf

    mamba = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(mamba), "mamba")
    writer.add_block_count(4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(LocalspecError, match="hybrid/recurrent"):
        selfdraft.describe(mamba)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 10)
    with pytest.raises(LocalspecError, match="not a readable GGUF"):
        selfdraft.describe(broken)


def test_a_gguf_that_was_not_pulled_is_hashed_once_per_version(tmp_path, monkeypatch):  # needs no model
    """Opening a bare GGUF path looks up its self-draft by the file's sha256: computed once, not per load."""
    import hashlib
    import os

    from localspec import pull, selfdraft

    calls = []
    real = pull.sha256_file

    def counting(path, label=""):
        calls.append(path)
        return real(path, label)

    monkeypatch.setattr(pull, "sha256_file", counting)
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    expected = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert selfdraft.target_digest(gguf) == expected == selfdraft.target_digest(gguf)
    assert len(calls) == 1
    gguf.write_bytes(b"GGUF" + b"\1" * 100)  # a new version of the file is hashed again
    os.utime(gguf, ns=(1, 1))
    assert selfdraft.target_digest(gguf) == hashlib.sha256(gguf.read_bytes()).hexdigest() and len(calls) == 2

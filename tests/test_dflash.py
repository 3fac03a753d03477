"""DFlash drafts on the real llama.cpp: a random DFlash GGUF for the tests' SmolLM2 (tests/fixtures/random_gguf.py
dflash), filling a block at a time from the target's layer inputs (engine/backend/dflash.py, the "dflash"
drafter).

The reference is llama.cpp's own `draft-dflash`: tests/data/dflash_reference.json and
dflash-varied_reference.json hold what its `llama-speculative-simple` drafted on these very files (sha256
checked), recorded by tests/fixtures/mtp_reference.py --kind dflash|dflash-varied; LOCALSPEC_LLAMA_SPECULATIVE
runs it live too."""

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import random_file
from reference_drafts import SCRIPT, SCRIPTS, assert_drafts_match, recorded
from localspec.engine.backend import Model, ModelOptions
from localspec.engine.backend.dflash import DFlashDraft
from localspec.engine.events import answer_tokens
from localspec.engine.files import load_files
from localspec.errors import ModelFileError

pytestmark = pytest.mark.model

KINDS = ("dflash", "dflash-varied")  # drafts kept whole, in part and not at all; drafts that follow the cache


def _file(smollm2_path, kind: str) -> Path:
    return random_file(f"{kind}-for-smollm2-135m.gguf", lambda path: SCRIPT.write_file(path, smollm2_path, kind))


@pytest.fixture(scope="module")
def dflash_gguf(smollm2_path) -> Path:
    return _file(smollm2_path, "dflash-varied")


def _engine(smollm2_path, path: Path):
    engine = load_files(smollm2_path, draft_path=path, drafter="dflash", calibrate=False, history="off", n_ctx=1024)
    engine.drafter("dflash").p_min = 0.0  # llama.cpp's default: every draft n_max long
    return engine


@pytest.fixture(scope="module")
def engine(smollm2_path, dflash_gguf):
    engine = _engine(smollm2_path, dflash_gguf)
    yield engine
    engine.close()


@pytest.mark.parametrize("kind", KINDS)
def test_the_files_are_the_ones_the_references_ran_on(smollm2_path, kind):
    path = _file(smollm2_path, kind)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded(kind)["file"]["sha256"]


def test_a_pair_whose_draft_is_dflash_drafts_with_it(engine):
    assert engine.draft is None and "dflash" in engine.drafters  # no second model: a drafter on the target's states


@pytest.mark.parametrize("kind", KINDS)
def test_dflash_drafts_equal_llama_cpps_own_round_for_round(smollm2_path, kind):
    reference = recorded(kind)
    engine = _engine(smollm2_path, _file(smollm2_path, kind))
    try:
        events = list(engine.generate(reference["prompt"], max_tokens=reference["n_predict"] + 16,
                                      draft_len=reference["n_max"]))
    finally:
        engine.close()
    accepted, _n = assert_drafts_match(events, reference, min_rounds=10)
    if kind == "dflash":  # the file that exercises acceptance: kept whole, in part and not at all
        assert {0, 3} <= set(accepted) and any(0 < a < 3 for a in accepted)
    else:  # the one whose blocks follow the cache: they change with it
        assert len({tuple(d) for d in reference["drafts"]}) >= 5


@pytest.mark.skipif(not os.environ.get("LOCALSPEC_LLAMA_SPECULATIVE"),
                    reason="LOCALSPEC_LLAMA_SPECULATIVE does not name llama.cpp's llama-speculative-simple")
def test_dflash_drafts_equal_a_live_run_of_llama_cpp(smollm2_path, dflash_gguf):
    live = SCRIPT.run_reference(Path(os.environ["LOCALSPEC_LLAMA_SPECULATIVE"]), smollm2_path,
                                kind="dflash-varied", draft=dflash_gguf)
    assert live["drafts"][:10] == recorded("dflash-varied")["drafts"][:10]


def test_greedy_answers_equal_plain_decoding(engine):
    prompt = "Write a short poem about the sea."
    plain = answer_tokens(engine.generate(prompt, max_tokens=32, drafter="none"))
    for drafter, draft_len in (("dflash", 1), ("dflash", 3), ("auto", "default")):
        assert answer_tokens(engine.generate(prompt, max_tokens=32, drafter=drafter, draft_len=draft_len)) == plain


def test_the_block_depends_on_the_context_only_not_on_how_it_was_decoded(smollm2_path, dflash_gguf):
    """The block after a context is the same whether the target decoded it at once, or in chunks with a
    draft kept whole between them and one thrown away (the cache follows every decode and truncation)."""
    target = Model(smollm2_path, ModelOptions(n_ctx=512))
    try:
        head = DFlashDraft(dflash_gguf, target)
        context = target.vocab.tokenize("One fish, two fish, red fish, blue fish. One fish, two fish")

        def block() -> np.ndarray:
            return head.predict_block(0, context[-1], len(context) - 1, 3)  # the last token is the pending one

        target.decode(context[:-1], 0, [])
        at_once = block()
        target.clear()
        target.decode(context[:6], 0, [])
        target.decode(context[6:10], 6, [])                  # a verify kept whole
        target.decode(context[10:12] + [101, 202], 10, [])  # one whose last two are thrown away
        target.truncate(12)
        target.decode(context[12:-1], 12, [])
        in_steps = block()
        assert list(np.argmax(in_steps, axis=1)) == list(np.argmax(at_once, axis=1))
        np.testing.assert_allclose(in_steps, at_once, atol=1e-2 * float(np.abs(at_once).max()))
        assert block().tolist() == in_steps.tolist()  # drafting leaves the cache as it was
    finally:
        target.close()


def test_a_dflash_draft_for_another_target_is_refused_with_the_mismatch(dflash_gguf, tmp_path, smollm2_path):
    spec = importlib.util.spec_from_file_location("random_gguf", SCRIPTS / "random_gguf.py")
    writer = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = writer
    spec.loader.exec_module(writer)
    other = writer.write("lfm2", tmp_path / "other.gguf", smollm2_path)  # the same vocabulary, 64 wide
    with pytest.raises(ModelFileError) as err:
        load_files(other, draft_path=dflash_gguf, calibrate=False, history="off", n_ctx=512)
    assert "DFlash draft for a target of hidden size 576" in str(err.value) and "has 64" in str(err.value)


def test_check_and_run_with_a_dflash_pair(smollm2_path, dflash_gguf):
    check = subprocess.run([sys.executable, "-m", "localspec.cli", "check", str(smollm2_path), str(dflash_gguf)],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "a DFlash draft for a target of hidden size 576" in check.stdout
    assert "DFlash draft's target width: target 576, draft made for 576" in check.stdout
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "run", str(smollm2_path), "Hello there",
                             "--draft", str(dflash_gguf), "--drafter", "dflash", "--max-tokens", "12", "--ctx", "1024"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "12 tokens" in result.stdout + result.stderr

"""EAGLE-3 drafts on the real llama.cpp: a random EAGLE-3 GGUF for the tests' SmolLM2 (tests/fixtures/random_gguf.py
eagle3), drafting from the target's layer inputs (engine/backend/eagle3.py, the "eagle3" drafter).

The reference is llama.cpp's own `draft-eagle3`: tests/data/eagle3_reference.json holds what its
`llama-speculative-simple` drafted on this very file (sha256 checked), recorded by
tests/fixtures/mtp_reference.py --kind eagle3; LOCALSPEC_LLAMA_SPECULATIVE runs it live too."""

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import random_file
from reference_drafts import SCRIPT, SCRIPTS, assert_drafts_match, assert_two_at_once_draft_as_alone, recorded
from localspec.engine.backend import Model, ModelOptions
from localspec.engine.backend.eagle3 import Eagle3Draft
from localspec.engine.events import answer_tokens
from localspec.engine.files import load_files
from localspec.errors import ModelFileError

pytestmark = pytest.mark.model

REFERENCE = recorded("eagle3")


@pytest.fixture(scope="module")
def eagle3_gguf(smollm2_path) -> Path:
    return random_file("eagle3-for-smollm2-135m.gguf", lambda path: SCRIPT.write_file(path, smollm2_path, "eagle3"))


@pytest.fixture(scope="module")
def engine(smollm2_path, eagle3_gguf):
    engine = load_files(smollm2_path, draft_path=eagle3_gguf, drafter="eagle3", calibrate=False, history="off",
                        n_ctx=1024)
    engine.drafter("eagle3").p_min = 0.0  # llama.cpp's default: every draft n_max long
    yield engine
    engine.close()


def test_the_file_is_the_one_the_reference_ran_on(eagle3_gguf):
    assert hashlib.sha256(eagle3_gguf.read_bytes()).hexdigest() == REFERENCE["file"]["sha256"]


def test_a_pair_whose_draft_is_eagle3_drafts_with_it(engine):
    assert engine.draft is None and "eagle3" in engine.drafters  # no second model: a head on the target


def test_eagle3_drafts_equal_llama_cpps_own_round_for_round(engine):
    events = list(engine.generate(REFERENCE["prompt"], max_tokens=REFERENCE["n_predict"] + 16,
                                  draft_len=REFERENCE["n_max"]))
    assert_drafts_match(events, REFERENCE, min_rounds=30)


@pytest.mark.skipif(not os.environ.get("LOCALSPEC_LLAMA_SPECULATIVE"),
                    reason="LOCALSPEC_LLAMA_SPECULATIVE does not name llama.cpp's llama-speculative-simple")
def test_eagle3_drafts_equal_a_live_run_of_llama_cpp(smollm2_path, eagle3_gguf):
    live = SCRIPT.run_reference(Path(os.environ["LOCALSPEC_LLAMA_SPECULATIVE"]), smollm2_path,
                                             kind="eagle3", draft=eagle3_gguf)
    assert live["drafts"][:30] == REFERENCE["drafts"][:30]


def test_greedy_answers_equal_plain_decoding(engine):
    prompt = "Write a short poem about the sea."
    plain = answer_tokens(engine.generate(prompt, max_tokens=32, drafter="none"))
    for drafter, draft_len in (("eagle3", 1), ("eagle3", 4), ("auto", "default")):
        assert answer_tokens(engine.generate(prompt, max_tokens=32, drafter=drafter, draft_len=draft_len)) == plain


def test_the_drafts_depend_on_the_context_only_not_on_how_it_was_decoded(smollm2_path, eagle3_gguf):
    """The head's prediction after a context is the same whether the target decoded it at once, or in
    chunks with a draft kept whole between them and one thrown away (the pair that waits for the
    next token, kept across decodes and truncations)."""
    target = Model(smollm2_path, ModelOptions(n_ctx=512))
    try:
        head = Eagle3Draft(eagle3_gguf, target)
        context = target.vocab.tokenize("One fish, two fish, red fish, blue fish. One fish, two fish")

        def prediction() -> np.ndarray:
            pos = len(context) - 1  # the last token is the pending one, not in the cache
            logits, _state = head.predict(0, context[-1], pos, head.hidden_at(0, pos - 1))
            head.forget(0, pos)
            return logits

        target.decode(context[:-1], 0, [])
        at_once = prediction()
        target.clear()
        target.decode(context[:6], 0, [])
        target.decode(context[6:10], 6, [])                  # a verify kept whole
        target.decode(context[10:12] + [101, 202], 10, [])  # one whose last two are thrown away
        target.truncate(12)
        target.decode(context[12:-1], 12, [])
        in_steps = prediction()
        assert int(np.argmax(in_steps)) == int(np.argmax(at_once))
        np.testing.assert_allclose(in_steps, at_once, atol=1e-2 * float(np.abs(at_once).max()))
    finally:
        target.close()


def test_two_requests_at_once_draft_with_eagle3_as_each_does_alone(smollm2_path, eagle3_gguf):
    engine = load_files(smollm2_path, draft_path=eagle3_gguf, drafter="eagle3", calibrate=False, history="off",
                        n_ctx=2048, slots=2)
    try:
        engine.drafter("eagle3").p_min = 0.0
        assert_two_at_once_draft_as_alone(engine, ("Count: one two three", "Name three colours"), "eagle3",
                                          round_for_round=False)
    finally:
        engine.close()


def test_an_eagle3_draft_for_another_target_is_refused_with_the_mismatch(eagle3_gguf, tmp_path, smollm2_path):
    spec = importlib.util.spec_from_file_location("random_gguf", SCRIPTS / "random_gguf.py")
    writer = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = writer
    spec.loader.exec_module(writer)
    other = writer.write("lfm2", tmp_path / "other.gguf", smollm2_path)  # the same vocabulary, 64 wide
    with pytest.raises(ModelFileError) as err:
        load_files(other, draft_path=eagle3_gguf, calibrate=False, history="off", n_ctx=512)
    assert "EAGLE-3 draft for a target of hidden size 576" in str(err.value) and "has 64" in str(err.value)


def test_run_answers_with_an_eagle3_pair(smollm2_path, eagle3_gguf):
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "run", str(smollm2_path), "Hello there",
                             "--draft", str(eagle3_gguf), "--drafter", "eagle3", "--max-tokens", "12", "--ctx", "1024"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "12 tokens" in result.stdout + result.stderr

"""Gemma 4 assistants on the real llama.cpp: a random Gemma 4 target and a random assistant for it
(tests/fixtures/random_gguf.py gemma4 / gemma4-assistant), the assistant reading the target's cache and hidden
states (engine/backend/assistant.py) and drafting as the target's `mtp` head.

The reference is llama.cpp's own `draft-mtp` with the assistant as its draft (common/speculative.cpp,
`is_mem_shared`): tests/data/mtp-gemma4_reference.json holds what its `llama-speculative-simple` drafted on
these very files (both sha256 checked), recorded by tests/fixtures/mtp_reference.py --kind mtp-gemma4;
LOCALSPEC_LLAMA_SPECULATIVE runs it live too."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEST_CACHE
from reference_drafts import (SCRIPT, assert_drafts_match, assert_greedy_answers_equal_plain,
                              assert_sampling_keeps_the_targets_distribution, assert_two_at_once_draft_as_alone,
                              recorded)
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.backend import Model, ModelOptions
from localspec.engine.backend.assistant import Gemma4Assistant
from localspec.engine.files import load_files
from localspec.errors import ModelFileError

pytestmark = pytest.mark.model

KIND = "mtp-gemma4"
REFERENCE = recorded(KIND)


@pytest.fixture(scope="module")
def files(smollm2_path) -> tuple[Path, Path]:
    """(target, assistant)"""
    folder = TEST_CACHE / "random-ggufs"
    folder.mkdir(parents=True, exist_ok=True)
    assistant = folder / "gemma4-assistant-tiny-stdev0.1.gguf"
    target = SCRIPT.target_path(assistant)
    if not (target.exists() and assistant.exists()):
        SCRIPT.write_pair(assistant, smollm2_path, KIND)
    return target, assistant


@pytest.fixture(scope="module")
def engine(files):
    target_path, assistant_path = files
    target = Model(target_path, ModelOptions(n_ctx=1024))
    assistant = Gemma4Assistant(assistant_path, target)
    # draft_p_min 0: llama.cpp's default for draft-mtp (every draft n_max long); costs given, nothing timed
    engine = Engine(target, None, EngineOptions(draft_p_min=0.0, calibrate=False, history_drafts=False),
                    draft_cost_s=0.001, assistant=assistant)
    yield engine
    target.close()


def test_the_files_are_the_ones_the_reference_ran_on(files):
    target, assistant = files
    assert hashlib.sha256(target.read_bytes()).hexdigest() == REFERENCE["file"]["target"]["sha256"]
    assert hashlib.sha256(assistant.read_bytes()).hexdigest() == REFERENCE["file"]["sha256"]


def test_the_assistant_drafts_as_the_mtp_drafter(engine):
    assert isinstance(engine.drafter("mtp").head, Gemma4Assistant)
    assert engine.target.n_mtp_layers == 0 and engine.target.mtp is None  # (the target file carries none)


def test_assistant_drafts_equal_llama_cpps_own_round_for_round(engine):
    events = list(engine.generate(REFERENCE["prompt"], max_tokens=REFERENCE["n_predict"] + 16, drafter="mtp",
                                  draft_len=REFERENCE["n_max"]))
    accepted, n = assert_drafts_match(events, REFERENCE, min_rounds=30)
    # the reference covers a draft kept whole, one kept in part, and one thrown away
    assert {0, 1, REFERENCE["n_max"]} <= set(accepted[:n])
    # and drafts whose later tokens are not the first one again: they read the states fed to each step
    assert any(len(set(draft)) > 1 for draft in REFERENCE["drafts"][:n])


@pytest.mark.skipif(not os.environ.get("LOCALSPEC_LLAMA_SPECULATIVE"),
                    reason="LOCALSPEC_LLAMA_SPECULATIVE does not name llama.cpp's llama-speculative-simple")
def test_assistant_drafts_equal_a_live_run_of_llama_cpp(files):
    target, assistant = files
    live = SCRIPT.run_reference(Path(os.environ["LOCALSPEC_LLAMA_SPECULATIVE"]), target, kind=KIND, draft=assistant)
    assert live["drafts"][:30] == REFERENCE["drafts"][:30]


def test_greedy_answers_equal_plain_decoding(engine):
    assert_greedy_answers_equal_plain(engine, "mtp", REFERENCE["prompt"])


def test_sampled_answers_keep_the_targets_distribution(engine, files):
    assert_sampling_keeps_the_targets_distribution(engine, files[0], REFERENCE["prompt"], "mtp")


def test_two_requests_at_once_draft_with_the_assistant_as_each_does_alone(files):
    target_path, assistant_path = files
    target = Model(target_path, ModelOptions(n_ctx=2048, n_seq=2))
    try:
        engine = Engine(target, None, EngineOptions(draft_p_min=0.0, calibrate=False, history_drafts=False),
                        draft_cost_s=0.001, assistant=Gemma4Assistant(assistant_path, target))
        assert_two_at_once_draft_as_alone(engine, ("Count: one two three", "Name three colours"), "mtp",
                                          round_for_round=False)
    finally:
        target.close()


def test_an_assistant_for_another_target_is_refused_with_the_mismatch(files, smollm2_path):
    with pytest.raises(ModelFileError) as err:
        load_files(smollm2_path, draft_path=files[1], calibrate=False, history="off", n_ctx=512)
    assert "reads a Gemma 4 target's cache" in str(err.value) and "is llama" in str(err.value)


def test_run_answers_with_the_assistant_and_check_names_it(files):
    target, assistant = files
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "run", str(target), "Hello there",
                             "--draft", str(assistant), "--drafter", "mtp", "--max-tokens", "12", "--ctx", "1024"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "12 tokens" in result.stdout + result.stderr
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "check", str(target), str(assistant)],
                            capture_output=True, text=True, timeout=120)
    assert "a Gemma 4 assistant for a Gemma 4 target of hidden size 64" in result.stdout
    assert "pass  Gemma 4 assistant draft's target width: target 64, draft made for 64" in result.stdout

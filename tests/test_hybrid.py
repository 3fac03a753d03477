"""Hybrid and recurrent targets on the real llama.cpp: random-weight GGUFs of LFM2 (short convolutions)
and Qwen3.5 (gated delta net) written by tests/fixtures/random_gguf.py with the test model's tokenizer.

A recurrent state holds no entry per position: llama.cpp keeps `n_rs_seq` snapshots of it per decode
(ModelOptions.rollback), so a verify can drop up to that many draft tokens, and prompt checkpoints let a
follow-up start from the previous prompt's end."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import TEST_CACHE, random_gguf_writer
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.backend import Model, ModelOptions, supports_gpu_offload
from localspec.engine.events import Prefill, Summary, Round, answer_tokens
from localspec.engine.kv import KvSequence

pytestmark = pytest.mark.model

# The same context decoded in other batch shapes: on a CPU the logits agree closely; a GPU's kernels for one
# position and for many round differently, far more (docs/gpu.md, "Hybrid targets and MTP heads").
ACROSS_SHAPES_ATOL = 5e-2 if supports_gpu_offload() else 1e-3
ARCHS = ("lfm2", "qwen35")  # speculate: llama.cpp rolls their state back
PROMPT = "one two three four five six seven eight nine ten " * 3


@pytest.fixture(scope="session")
def random_ggufs(smollm2_path):
    """{arch: (target, draft)}: each target with a draft of the same seed plus noise (agrees partly)."""
    writer = random_gguf_writer()
    folder = TEST_CACHE / "random-ggufs"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for arch in (*ARCHS, "mamba"):
        target = folder / f"{arch}-tiny.gguf"
        draft = folder / f"{arch}-tiny-noise0.01.gguf"
        if not target.exists():
            writer.write(arch, target, smollm2_path)
        if not draft.exists():
            writer.write(arch, draft, smollm2_path, noise=0.01)
        files[arch] = (target, draft)
    return files


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param


def test_the_script_writes_a_file_llama_cpp_loads_as_a_hybrid_with_rollback(random_ggufs, arch):
    model = Model(random_ggufs[arch][0], ModelOptions(n_ctx=512))
    try:
        assert model.architecture == arch and model.recurrent
        assert model.max_rollback == ModelOptions().rollback
        assert not model.can_shift  # moving positions would leave the recurrent state holding what was cut
        assert model.vocab.detokenize(model.vocab.tokenize("Hello there", add_special=False)) == "Hello there"
        assert model.chat_template()  # the tokenizer's model came with its template
    finally:
        model.close()


def test_check_names_what_each_file_supports(random_ggufs, smollm2_path):
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "check", str(random_ggufs["lfm2"][0]),
                             str(smollm2_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "lfm2, with a recurrent state llama.cpp rolls back: drafts of up to 8 tokens" in result.stdout
    assert "llama, a KV cache: drafts of any length" in result.stdout


@pytest.mark.parametrize("arch", [*ARCHS, "mamba"])
def test_the_rollback_list_is_llama_cpps(random_ggufs, arch):
    """ROLLBACK_ARCHITECTURES (what `check` says without loading weights) agrees with what a context of
    the pinned llama.cpp grants: n_rs_seq kept for these, clamped to 0 otherwise."""
    from localspec.engine.backend import ROLLBACK_ARCHITECTURES

    model = Model(random_ggufs[arch][0], ModelOptions(n_ctx=256))
    try:
        assert (model.max_rollback > 0) == (arch in ROLLBACK_ARCHITECTURES)
    finally:
        model.close()


def _logits_after(model: Model, tokens: list[int]) -> np.ndarray:
    model.clear()
    return model.decode(tokens, 0, [len(tokens) - 1])[0]


def _logits_after_rejecting(model: Model, prompt: list[int], drafts: list[int], kept: int, token: int) -> np.ndarray:
    """Verify the prompt's last token and `drafts` in one batch, keep the context up to `kept`, decode `token`."""
    model.clear()
    model.decode(prompt[:-1], 0, [])
    model.decode([prompt[-1], *drafts], len(prompt) - 1, list(range(len(drafts) + 1)))
    assert model.truncate(kept) == kept
    return model.decode([token], kept, [0])[0]


def test_a_rejected_draft_leaves_the_state_plain_decoding_has(random_ggufs, arch):
    """Verify a pending token and 8 drafts, keep 2 of them: the next logits are those of a context
    that never saw the rejected ones (the snapshots, not a replay: truncate keeps what was asked)."""
    model = Model(random_ggufs[arch][0], ModelOptions(n_ctx=512))
    try:
        prompt = model.vocab.tokenize(PROMPT)
        kept = len(prompt) + 2
        after = _logits_after_rejecting(model, prompt, [101, 202, 303, 404, 505, 606, 707, 808], kept, 909)
        # other rejected tokens, the same batches: no trace of either set, on any backend
        other = _logits_after_rejecting(model, prompt, [101, 202, 13, 14, 15, 16, 17, 18], kept, 909)
        np.testing.assert_allclose(after, other, atol=1e-5)
        reference = _logits_after(model, prompt + [101, 202, 909])
        assert int(np.argmax(after)) == int(np.argmax(reference))
        np.testing.assert_allclose(after, reference, atol=ACROSS_SHAPES_ATOL)
    finally:
        model.close()


def test_going_back_further_than_the_snapshots_restores_a_checkpoint_or_replays(random_ggufs, arch):
    model = Model(random_ggufs[arch][0], ModelOptions(n_ctx=512))
    try:
        prompt = model.vocab.tokenize(PROMPT)
        kv = KvSequence(model)
        kv.extend(prompt[:-1])
        kv.checkpoint()
        for token in [prompt[-1], 11, 12, 13, 14, 15]:  # one token per decode: no snapshot reaches back 3
            kv.extend([token])
        assert model.truncate(len(prompt) + 2) == len(prompt) - 1  # back to the prompt's checkpoint
        kv.tokens = kv.tokens[:len(prompt) - 1]
        evaluated = kv.evaluated
        logits = kv.sync(prompt + [11, 12])
        assert kv.evaluated - evaluated == 3  # from the checkpoint, not from the first token
        np.testing.assert_allclose(logits, _logits_after(model, prompt + [11, 12]), atol=ACROSS_SHAPES_ATOL)

        model.clear()  # no checkpoint: the sequence is emptied, and KvSequence replays what it kept
        kv = KvSequence(model)
        kv.extend(prompt)
        kv.extend([21])
        kv.extend([22])
        kv.rewind(len(prompt) - 3)
        assert kv.tokens == prompt[:-3]
        logits = kv.extend([prompt[-3]], [0])[0]
        np.testing.assert_allclose(logits, _logits_after(model, prompt[:-2]), atol=ACROSS_SHAPES_ATOL)
    finally:
        model.close()


@pytest.fixture
def hybrid_engine(random_ggufs, arch):
    target_path, draft_path = random_ggufs[arch]
    target = Model(target_path, ModelOptions(n_ctx=1024))
    draft = Model(draft_path, ModelOptions(n_ctx=1024))
    # draft_p_min 0: the random draft's flat distributions would stop every draft at one token
    engine = Engine(target, draft, EngineOptions(draft_p_min=0.0, calibrate=False, history_drafts=False))
    yield engine
    target.close()
    draft.close()


def test_drafted_greedy_answers_equal_plain_decoding(hybrid_engine):
    engine = hybrid_engine
    plain = answer_tokens(engine.generate(PROMPT, max_tokens=40, drafter="none"))
    drafted = rejected = 0
    for draft_len in (4, 12):  # 12: more than the snapshots, so drafts are cut to 8
        events = list(engine.generate(PROMPT, max_tokens=40, drafter="model", draft_len=draft_len))
        assert answer_tokens(events) == plain
        rounds = [e for e in events if isinstance(e, Round)]
        assert max(r.drafted for r in rounds) == min(draft_len, engine.target.max_rollback)
        drafted += sum(r.drafted for r in rounds)
        rejected += sum(len(r.rejected) for r in rounds)
    assert drafted > 0 and rejected > 0
    assert answer_tokens(engine.generate(PROMPT, max_tokens=40, drafter="ngram", draft_len=4)) == plain


def test_a_follow_up_evaluates_only_its_new_tokens(hybrid_engine):
    engine = hybrid_engine
    prompt = engine.vocab.tokenize(PROMPT)
    answer = answer_tokens(engine.generate(prompt, max_tokens=12, drafter="model", draft_len=4))
    follow_up = prompt + answer + engine.vocab.tokenize(" and then", add_special=False)
    prefill = next(e for e in engine.generate(follow_up, max_tokens=4, drafter="none") if isinstance(e, Prefill))
    # the cache holds all but the answer's last token (never evaluated): that and the new text
    assert prefill.evaluated == len(follow_up) - (len(prompt) + len(answer) - 1)

    # A follow-up that parts from the cache inside the answer starts again from the prompt's checkpoint.
    edited = prompt + answer[:3] + [answer[3] + 1]
    before = engine.kv.evaluated
    events = list(engine.generate(edited, max_tokens=4, drafter="none"))
    assert events[0].cached == len(prompt) + 3
    # 4 answer tokens replayed from the checkpoint, the pending token, 3 more rounds: not the prompt again
    assert engine.kv.evaluated - before == 4 + 1 + 3 < len(prompt)


def test_plain_decoding_keeps_no_snapshots_and_answers_the_same(random_ggufs, arch):
    """`--drafter none` loads a hybrid without state snapshots (they only serve drafts), says nothing about
    drafts, answers as a load with them does, and a follow-up still resumes from the prompt's end."""
    from localspec.engine.files import load_files

    path = random_ggufs[arch][0]
    with_snapshots = Model(path, ModelOptions(n_ctx=1024))
    try:
        expected = answer_tokens(Engine(with_snapshots, None, EngineOptions(calibrate=False, history_drafts=False))
                                 .generate(PROMPT, max_tokens=16, drafter="none"))
    finally:
        with_snapshots.close()
    engine = load_files(path, drafter="none", n_ctx=1024, calibrate=False, history="off")
    try:
        assert engine.target.max_rollback == 0 and engine.warnings == []
        prompt = engine.vocab.tokenize(PROMPT)
        answer = answer_tokens(engine.generate(prompt, max_tokens=16))
        assert answer == expected
        follow_up = prompt + answer + engine.vocab.tokenize(" and then", add_special=False)
        prefill = next(e for e in engine.generate(follow_up, max_tokens=2) if isinstance(e, Prefill))
        assert prefill.evaluated == len(follow_up) - (len(prompt) + len(answer) - 1)
    finally:
        engine.close()


@pytest.mark.parametrize("arch, options", [("mamba", {}), ("lfm2", {"rollback": 0})])
def test_a_target_without_rollback_decodes_plainly_and_says_so(random_ggufs, arch, options):
    target = Model(random_ggufs[arch][0], ModelOptions(n_ctx=1024, **options))
    try:
        assert target.max_rollback == 0
        engine = Engine(target, None, EngineOptions(calibrate=False, history_drafts=False))
        assert [w for w in engine.warnings if w.startswith(f"{arch} keeps a recurrent state")]
        events = list(engine.generate(PROMPT + PROMPT, max_tokens=24, drafter="ngram", draft_len=4))
        assert sum(e.drafted for e in events if isinstance(e, Round)) == 0
        assert isinstance(events[-1], Summary) and events[-1].generated_tokens == 24
    finally:
        target.close()


def test_localspec_run_answers_with_a_hybrid_file(random_ggufs, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", str(random_ggufs["qwen35"][0]), "Hello there",
         "--max-tokens", "8", "--ctx", "1024"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_serve_answers_requests_at_once_with_a_hybrid_file(random_ggufs):
    """Two chats at once share the target's decodes (engine/parallel.py): each sequence's recurrent state
    is its own, so each answer equals the one it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from servers import serving

    def ask(server, text):
        body = {"model": "hybrid", "messages": [{"role": "user", "content": text}], "max_tokens": 24,
                "temperature": 0}
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    questions = ["Name three colours.", "Write a haiku about rain."]
    with serving(random_ggufs["qwen35"][0], "hybrid", 2048, slots=2) as server:
        alone = [ask(server, q) for q in questions]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda q: ask(server, q), questions))
    assert together == alone
    assert all(alone)


def test_bench_runs_llama_beside_a_hybrid_target(random_ggufs, tmp_path):
    """The bench's `Llama` peer cannot drop an answer from a recurrent state, so it evaluates the prompt
    again for every run (bench/peers.py) instead of failing the whole bench at the second run."""
    out = tmp_path / "runs.json"
    proc = subprocess.run([sys.executable, "-m", "localspec.cli", "bench", str(random_ggufs["qwen35"][0]),
                           "--suite", "chat", "--prompts", "1", "--max-tokens", "8", "--repeat", "2",
                           "--drafter", "ngram", "--temperature", "0", "--peer-prompts", "0", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    llama = [r for r in json.loads(out.read_text())["runs"] if r["variant"] == "llama-cpp-python"]
    assert len(llama) == 2 and llama[0]["generated"] > 0
    assert llama[0]["tokens"] == llama[1]["tokens"]  # greedy, and nothing of the first answer left behind

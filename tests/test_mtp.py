"""The `mtp` drafter on the real llama.cpp: random files with MTP blocks (tests/fixtures/random_gguf.py --mtp N),
a hybrid (Qwen3.5) and a transformer (GLM-4.5's mixture of experts) with one, and a transformer with three
(Step-3.5's, which llama.cpp chains: head k drafts the k-th token), drafting from the target's own hidden
states (engine/backend/mtp.py, engine/drafters/heads.py).

The reference is llama.cpp's own `draft-mtp` (common/speculative.cpp): tests/data/KIND_reference.json holds
what its `llama-speculative-simple` drafted, round by round, on the very file (its sha256 is checked),
recorded by tests/fixtures/mtp_reference.py; with LOCALSPEC_LLAMA_SPECULATIVE naming that binary, the
reference is also run live."""

import hashlib
import json
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
from localspec.engine.events import Round, answer_tokens

pytestmark = pytest.mark.model

KINDS = {"mtp": "qwen35-tiny-mtp1-stdev0.06.gguf", "mtp-glm4moe": "glm4moe-tiny-mtp1-stdev0.13.gguf",
         "mtp-step35": "step35-tiny-mtp3-stdev0.1.gguf"}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def reference(kind) -> dict:
    return recorded(kind)


def _random_file(kind: str, smollm2_path: Path) -> Path:
    folder = TEST_CACHE / "random-ggufs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / KINDS[kind]
    if not path.exists():
        SCRIPT.write_file(path, smollm2_path, kind)
    return path


@pytest.fixture(scope="module")
def mtp_gguf(smollm2_path, kind) -> Path:
    return _random_file(kind, smollm2_path)


@pytest.fixture(scope="module")
def engine(mtp_gguf):
    target = Model(mtp_gguf, ModelOptions(n_ctx=1024))
    # draft_p_min 0: llama.cpp's default for its heads (every draft is n_max long); costs given, so
    # nothing is timed
    engine = Engine(target, None, EngineOptions(draft_p_min=0.0, calibrate=False, history_drafts=False),
                    draft_cost_s=0.001)
    yield engine
    target.close()


def test_the_file_is_the_one_the_reference_ran_on(mtp_gguf, reference):
    assert hashlib.sha256(mtp_gguf.read_bytes()).hexdigest() == reference["file"]["sha256"]


def test_the_head_is_loaded_and_offered(engine, reference):
    assert engine.target.n_mtp_layers == reference["file"]["mtp"] and engine.target.mtp is not None
    assert "mtp" in engine.drafters


def test_mtp_drafts_equal_llama_cpps_own_round_for_round(engine, reference):
    # past the reference's answer, so no draft here is cut by the budget; its own last one may be
    events = list(engine.generate(reference["prompt"], max_tokens=reference["n_predict"] + 16, drafter="mtp",
                                  draft_len=reference["n_max"]))
    accepted, n = assert_drafts_match(events, reference, min_rounds=15)
    # the reference covers a draft kept whole, one kept in part, and one thrown away
    assert {0, 1, reference["n_max"]} <= set(accepted[:n])


@pytest.mark.skipif(not os.environ.get("LOCALSPEC_LLAMA_SPECULATIVE"),
                    reason="LOCALSPEC_LLAMA_SPECULATIVE does not name llama.cpp's llama-speculative-simple")
def test_mtp_drafts_equal_a_live_run_of_llama_cpp(engine, mtp_gguf, kind, reference):
    live = SCRIPT.run_reference(Path(os.environ["LOCALSPEC_LLAMA_SPECULATIVE"]), mtp_gguf, kind=kind)
    assert live["drafts"][:30] == reference["drafts"][:30]


def test_greedy_answers_equal_plain_decoding(engine, reference):
    assert_greedy_answers_equal_plain(engine, "mtp", reference["prompt"])


def test_sampled_answers_keep_the_targets_distribution(engine, mtp_gguf, reference):
    """End to end on llama.cpp, where the head's greedy drafts are kept in part and whole."""
    assert_sampling_keeps_the_targets_distribution(engine, mtp_gguf, reference["prompt"], "mtp")


def test_a_follow_up_turn_drafts_as_a_fresh_start_does(engine, mtp_gguf, reference):
    """The head's cache follows the target's through a second request on the same slot (its prompt
    continuing the first answer): the drafts equal those of a new engine given the whole prompt at once,
    but the one position where the cached prefix ends (the head pairs it with a state the first request
    left; llama.cpp does the same with its stale state)."""
    first = answer_tokens(engine.generate(reference["prompt"], max_tokens=12, drafter="mtp", draft_len=3))
    follow_up = engine.vocab.tokenize(reference["prompt"]) + first + engine.vocab.tokenize(" more", add_special=False)
    continued_events = list(engine.generate(follow_up, max_tokens=24, drafter="mtp", draft_len=3))
    target = Model(mtp_gguf, ModelOptions(n_ctx=1024))
    try:
        fresh_engine = Engine(target, None, EngineOptions(draft_p_min=0.0, calibrate=False, history_drafts=False),
                              draft_cost_s=0.001)
        fresh_events = list(fresh_engine.generate(follow_up, max_tokens=24, drafter="mtp", draft_len=3))
    finally:
        target.close()
    # Where the target's own answers part, the drafts cannot agree: on a CPU they never part (its kernels
    # round a row alike whatever the batch), on a GPU they may (the follow-up's prompt is evaluated in other
    # batch shapes than a fresh start's: docs/gpu.md), and the drafts are compared before that point.
    answers = answer_tokens(continued_events), answer_tokens(fresh_events)
    if engine.target.options.gpu_layers() == 0:
        assert answers[0] == answers[1]
    parted = next((i for i, (a, b) in enumerate(zip(*answers)) if a != b), min(map(len, answers)))
    continued, fresh = drafts_before(continued_events, parted), drafts_before(fresh_events, parted)
    assert len(continued) == len(fresh) > (5 if parted == len(answers[0]) else 0)
    assert sum(a != b for a, b in zip(continued, fresh)) <= 1


def test_two_requests_at_once_draft_with_the_head_as_each_does_alone(smollm2_path):
    """On a Qwen3.5-shaped file (recurrent layers and a head), two requests in the same steps draft with
    the head in one head step for both, each what it drafts alone."""
    target = Model(_random_file("mtp", smollm2_path), ModelOptions(n_ctx=2048, n_seq=2))
    try:
        engine = Engine(target, None, EngineOptions(draft_p_min=0.0, calibrate=False, history_drafts=False),
                        draft_cost_s=0.001)
        assert_two_at_once_draft_as_alone(engine, ("Count: one two three", "Name three colours"), "mtp")
    finally:
        target.close()


def drafts_before(events, end: int) -> list[list[int]]:
    """The drafts of the rounds that drafted only for answer positions before `end`."""
    drafts, start = [], 0
    for event in events:
        if isinstance(event, Round):
            if event.drafted and start + event.drafted <= end:
                drafts.append(list(event.accepted + event.rejected))
            start += len(event.accepted) + (event.token is not None)
    return drafts


def test_run_answers_with_the_mtp_drafter_and_check_names_the_head(mtp_gguf, smollm2_path, kind):
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "run", str(mtp_gguf), "Hello there",
                             "--max-tokens", "12", "--ctx", "1024", "--drafter", "mtp"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "12 tokens" in result.stdout + result.stderr
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "check", str(mtp_gguf), str(smollm2_path)],
                            capture_output=True, text=True, timeout=120)
    heads = recorded(kind)["file"]["mtp"]
    assert ("1 MTP head (the `mtp` drafter)" if heads == 1
            else f"{heads} MTP heads, chained (the `mtp` drafter: drafts of up to {heads} tokens)") in result.stdout


def test_mtp_on_a_file_without_heads_is_a_clear_error(smollm2_path):
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "run", str(smollm2_path), "Hi",
                             "--max-tokens", "4", "--drafter", "mtp"], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "The drafter 'mtp' needs a target whose file carries MTP heads" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_answers_with_the_head_drafting(mtp_gguf):
    """Through the server, a chat that asks for the head drafts with it and answers as plain decoding does."""
    import httpx

    from servers import serving

    def ask(server, drafter):
        body = {"model": "mtp", "messages": [{"role": "user", "content": "Count: one two three"}],
                "max_tokens": 24, "temperature": 0, "drafter": drafter, "draft_len": 3}
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        answer = response.json()
        return answer["choices"][0]["message"]["content"], answer["localspec"]["drafted"]

    with serving(mtp_gguf, "mtp", 1024) as server:
        drafted, drafts = ask(server, "mtp")
        plain, none = ask(server, "none")
    assert drafted == plain and drafts > 0 and none == 0


def test_a_server_with_several_slots_loads_the_head_and_answers_two_chats_at_once(mtp_gguf):
    """The head's context holds as many sequences as the target (llama.cpp reserves an output row for
    each): with 2 slots it loads, and two chats asking for the head at once answer as each does alone."""
    import threading

    import httpx

    from servers import serving

    questions = ["Count: one two three", "Name three colours"]

    def ask(server, question, into=None):
        body = {"model": "mtp", "messages": [{"role": "user", "content": question}], "max_tokens": 16,
                "temperature": 0, "drafter": "mtp", "draft_len": 3}
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["message"]["content"]
        if into is not None:
            into[question] = text
        return text

    with serving(mtp_gguf, "mtp", 2048, slots=2) as server:
        alone = {q: ask(server, q) for q in questions}
        together: dict[str, str] = {}
        threads = [threading.Thread(target=ask, args=(server, q, together)) for q in questions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert together == alone


@pytest.mark.anyio
async def test_the_chat_app_drafts_with_the_head(mtp_gguf):
    import time

    from localspec.config import ChatSettings, UserConfig
    from localspec.tui.app import create_app
    from localspec.tui.provider import LocalProvider

    config = UserConfig(chat=ChatSettings(max_tokens=24, drafter="mtp", draft_len=3))
    app = create_app(str(mtp_gguf), provider=LocalProvider(n_ctx=1024), config=config)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 120
        while app.engine is None:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        for ch in "Hello":
            await pilot.press(ch)
        await pilot.press("enter")
        while len(app.history.messages(app.conversation.id)) < 2 or app.generating:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        answer = app.history.messages(app.conversation.id)[-1]
        assert answer.status == "complete" and answer.stats["drafted"] > 0


def test_bench_prints_the_heads_estimate_from_its_costs(smollm2_path, tmp_path):
    """`localspec bench` on a file with a head measures what it ran and adds the estimate at published
    acceptance, labelled as one (bench/estimate.py)."""
    out = tmp_path / "runs.json"
    path = _random_file("mtp", smollm2_path)
    proc = subprocess.run([sys.executable, "-m", "localspec.cli", "bench", str(path), "--suite", "chat",
                           "--prompts", "1", "--max-tokens", "8", "--drafter", "mtp", "--temperature", "0",
                           "--no-peers", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "MTP head, an estimate from this machine's costs, not a measured speed" in proc.stdout
    assert "vllm-ascend/issues/9871" in proc.stdout
    guess = json.loads(out.read_text())["meta"]["mtp_estimate"]
    assert guess["kept"] == [0.867, 0.743, 0.615] and 0 < guess["step_share"]
    said = f"{guess['speedup']:.2f}x plain decoding with {guess['draft_len']}-token drafts" if guess["draft_len"] \
        else "no gain: at these costs plain decoding is faster"
    assert said in proc.stdout

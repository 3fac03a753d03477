"""Images in prompts (engine/backend/vision.py): the tests' SmolLM2 with a random-weight projector
(mtmd's `mlp` type), held to what llama.cpp's own `llama-mtmd-cli` answered about the same images
(tests/data/mtmd_reference.json, recorded by tests/fixtures/mtmd_reference.py), with the drafts on."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from localspec.config import ChatSettings, UserConfig
from localspec.engine.backend import system_info
from localspec.engine.backend.media import media_id, media_runs
from localspec.engine.backend.vision import ImageError
from localspec.engine.drafters import Draft, text_only
from localspec.engine.events import Prefill, Summary
from localspec.engine.files import load_files
from localspec.engine.sampling import SamplingSettings
from localspec.engine.session import MEDIA_MARKER, with_images
from localspec.errors import LocalspecError, ModelFileError
from servers import serving
from conftest import TEST_CACHE, random_file, random_gguf_writer

HERE = Path(__file__).parent
RECORDED = json.loads((HERE / "data" / "mtmd_reference.json").read_text())
REFERENCE, GRIDDED = RECORDED["mlp"], RECORDED["mrope"]  # (one position per row; M-RoPE's grid)
_spec = importlib.util.spec_from_file_location("mtmd_reference", HERE / "fixtures" / "mtmd_reference.py")
RECORDER = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(RECORDER)  # type: ignore[union-attr]
GREEDY = SamplingSettings(temperature=0.0)
IMAGE_A, IMAGE_B = RECORDER.png(RECORDER.IMAGES["a"]), RECORDER.png(RECORDER.IMAGES["b"])


@pytest.fixture(scope="module")
def projector_path(smollm2_path) -> Path:
    return random_file("mmproj-for-smollm2-135m.gguf", lambda path: RECORDER.write_projector(path, smollm2_path))


@pytest.fixture(scope="module")
def engine(smollm2_path, smollm2_q2k_path, projector_path):
    engine = load_files(smollm2_path, draft_path=smollm2_q2k_path, mmproj=projector_path, calibrate=False,
                        history="off", n_ctx=2048)
    yield engine
    engine.close()


def answer(events) -> Summary:
    return [e for e in events if isinstance(e, Summary)][-1]


def assert_as_recorded(case: dict, name: str, text: str) -> None:
    """`text` is llama-mtmd-cli's answer about image `name`, as recorded with this CPU's kernels; with kernels
    no recording ran on, it begins with the words every recording shares (a random file's near ties part
    greedy answers on the last bits that AVX2 and AVX-512 kernels differ in)."""
    recorded = {r["cpu"]: r["answers"][name] for r in case["recordings"]}
    if system_info() in recorded:
        assert text == recorded[system_info()]
        return
    words = zip(*(answer.split(" ") for answer in recorded.values()))
    shared = " ".join(w[0] for w in itertools.takewhile(lambda w: len(set(w)) == 1, words))
    assert shared and text.startswith(shared), (text, recorded)


def test_the_projector_is_the_one_the_reference_ran_on(projector_path):
    assert hashlib.sha256(projector_path.read_bytes()).hexdigest() == REFERENCE["projector_sha256"]


@pytest.mark.parametrize("name", sorted(RECORDER.IMAGES))
def test_greedy_answers_about_an_image_equal_llama_mtmd_clis(engine, name):
    image = RECORDER.png(RECORDER.IMAGES[name])
    tokens = engine.image_tokens(REFERENCE["prompt"], [image])
    assert sum(t < 0 for t in tokens) == 16  # the projector's 16 embeddings, one position each
    summary = answer(engine.generate(tokens, max_tokens=REFERENCE["tokens"], sampling=GREEDY, drafter="none"))
    assert_as_recorded(REFERENCE, name, summary.text)


def test_on_kernels_no_recording_ran_on_an_answer_is_held_to_the_words_all_recordings_share():
    case = {"recordings": [{"cpu": "kernels x", "answers": {"a": "The sun sets, a ballet"}},
                           {"cpu": "kernels y", "answers": {"a": "The sun sets, a stark sky"}}]}
    assert_as_recorded(case, "a", "The sun sets, a quiet evening")
    with pytest.raises(AssertionError):
        assert_as_recorded(case, "a", "The moon rises")


def test_the_two_images_give_different_answers():
    for recording in REFERENCE["recordings"]:  # (the image is read, not ignored)
        assert recording["answers"]["a"].split()[:3] != recording["answers"]["b"].split()[:3]


@pytest.mark.parametrize("drafter", ["model", "ngram", "auto"])
def test_a_drafted_answer_after_an_image_equals_the_plain_one(engine, drafter):
    messages = [with_images({"role": "user", "content": "Describe the image, then describe it again."}, [IMAGE_B])]
    plain = answer(engine.chat(messages, max_tokens=48, sampling=GREEDY, drafter="none"))
    # (a fixed length: the engine is not calibrated here, and would not bet without its costs; 2 tokens,
    # so that every verify is one plain decoding's rows bit for bit: speculative.EXACT_VERIFY_POSITIONS)
    drafted = answer(engine.chat(messages, max_tokens=48, sampling=GREEDY, drafter=drafter, draft_len=2))
    assert drafted.text == plain.text
    assert drafted.drafted > 0
    if drafter == "model":  # the draft model (no projector) drafts from the text it sees, and is kept
        assert drafted.accepted > 0


def test_a_follow_up_on_the_same_image_encodes_nothing_and_evaluates_only_its_new_text(engine):
    first = [with_images({"role": "user", "content": "What is in this picture?"}, [IMAGE_A])]
    events = list(engine.chat(first, max_tokens=8, sampling=GREEDY, drafter="none"))
    reply = answer(events).text
    encoded = engine.projector.encoded
    follow_up = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the colours?"}]
    events = list(engine.chat(follow_up, max_tokens=8, sampling=GREEDY, drafter="none"))
    prefill = next(e for e in events if isinstance(e, Prefill))
    assert engine.projector.encoded == encoded
    new_text = len(engine.chat_tokens(follow_up)) - len(engine.chat_tokens(first))
    assert prefill.evaluated <= new_text + len(engine.target.vocab.tokenize(reply, add_special=False)) + 2
    assert prefill.cached >= sum(t < 0 for t in engine.chat_tokens(first))


def test_an_image_no_longer_held_is_refused_and_encoded_again_when_sent_again(engine, monkeypatch):
    from localspec.engine.backend import vision

    monkeypatch.setattr(vision, "IMAGES_KEPT", 1)
    first = engine.image_tokens(MEDIA_MARKER + "?", [IMAGE_A])
    engine.image_tokens(MEDIA_MARKER + "?", [IMAGE_B])  # (A is the least recently used: forgotten)
    assert not engine.projector.holds(min(first))
    with pytest.raises(LocalspecError, match="no longer holds; send the image again"):
        list(engine.generate(first, max_tokens=2))
    encoded = engine.projector.encoded
    again = engine.image_tokens(MEDIA_MARKER + "?", [IMAGE_A])
    assert engine.projector.encoded == encoded + 1 and engine.projector.holds(min(again))


def test_two_images_in_one_message_stand_in_order(engine):
    tokens = engine.chat_tokens([with_images({"role": "user", "content": "Compare them."}, [IMAGE_A, IMAGE_B])])
    images = [run for _first, run in media_runs(tokens) if run[0] < 0]
    assert [len(run) for run in images] == [16, 16] and images[0] != images[1]


@pytest.mark.parametrize("data, complaint", [
    (b"GIF87a not really", "not an image"),
    (IMAGE_A[:60], "not an image"),
    (b"", "empty"),
])
def test_a_bad_image_is_refused_with_a_clear_message(engine, data, complaint):
    with pytest.raises(ImageError, match=complaint):
        engine.chat_tokens([with_images({"role": "user", "content": "?"}, [data])])
    summary = answer(engine.generate("Hello", max_tokens=2, sampling=GREEDY))  # the engine still answers
    assert summary.stop_reason in ("length", "eog")


def test_an_image_over_the_pixel_limit_is_refused(engine, monkeypatch):
    from localspec.engine.backend import vision

    monkeypatch.setattr(vision, "MAX_PIXELS", 1000)
    with pytest.raises(ImageError, match="64x40 pixels"):
        engine.image_tokens(MEDIA_MARKER + "?", [IMAGE_A])


def test_markers_and_images_must_agree(engine):
    with pytest.raises(ImageError, match="2 places for images and 1 images"):
        engine.image_tokens(MEDIA_MARKER * 2, [IMAGE_A])


def test_a_model_without_a_projector_names_what_is_missing(smollm2_path):
    engine = load_files(smollm2_path, calibrate=False, history="off", n_ctx=512, drafter="none")
    try:
        with pytest.raises(LocalspecError, match="cannot see images.*--mmproj"):
            engine.chat_tokens([with_images({"role": "user", "content": "?"}, [IMAGE_A])])
        with pytest.raises(LocalspecError, match="outside this model's vocabulary"):
            list(engine.generate([1, media_id(0, 0)], max_tokens=2))
    finally:
        engine.close()


def test_a_projector_for_another_model_is_named_at_load(qwen_coder_path, projector_path):
    with pytest.raises(ModelFileError, match="mismatch between text model"):
        load_files(qwen_coder_path, mmproj=projector_path, calibrate=False, history="off", n_ctx=512, drafter="none")


def test_a_gguf_that_is_not_a_projector_is_named(smollm2_path):
    with pytest.raises(ModelFileError, match="not an image projector"):
        load_files(smollm2_path, mmproj=smollm2_path, calibrate=False, history="off", n_ctx=512, drafter="none")


def test_a_gemma4_assistant_drafts_after_an_image_and_its_answer_equals_plain(smollm2_path):
    """The assistant keeps only the target's states, which an image's rows have as text's do: it follows
    an image's decode, and drafts after it."""
    from reference_drafts import SCRIPT

    folder = TEST_CACHE / "random-ggufs"
    assistant = folder / "gemma4-assistant-tiny-stdev0.1.gguf"
    target = SCRIPT.target_path(assistant)
    if not (target.exists() and assistant.exists()):
        SCRIPT.write_pair(assistant, smollm2_path, "mtp-gemma4")
    projector = random_file("mmproj-for-gemma4-tiny.gguf", lambda path: RECORDER.write_projector(path, target))
    engine = load_files(target, draft_path=assistant, drafter="mtp", mmproj=projector, calibrate=False,
                        history="off", n_ctx=1024)
    try:
        tokens = engine.image_tokens(MEDIA_MARKER + "one two three four five six seven eight nine ten one two",
                                     [IMAGE_A])
        plain = answer(engine.generate(tokens, max_tokens=40, sampling=GREEDY, drafter="none"))
        drafted = answer(engine.generate(tokens, max_tokens=40, sampling=GREEDY, drafter="mtp", draft_len=3))
        assert drafted.text == plain.text
        assert drafted.drafted_by_drafter.get("mtp", 0) > 0 and drafted.accepted > 0
    finally:
        engine.close()


@pytest.fixture(scope="module")
def gridded(smollm2_path):
    """A random Qwen3.5 (M-RoPE positions) with a random `qwen2vl_merger` projector and, to draft with, the
    same weights plus noise (tests/test_hybrid.py's pair)."""
    writer = random_gguf_writer()
    target = random_file("qwen35-tiny.gguf", lambda path: writer.write("qwen35", path, smollm2_path))
    draft = random_file("qwen35-tiny-noise0.01.gguf", lambda path: writer.write("qwen35", path, smollm2_path, noise=0.01))
    projector = random_file("mmproj-qwen2vl-for-qwen35-tiny.gguf",
                            lambda path: RECORDER.write_projector(path, target, "mmproj-qwen2vl"))
    engine = load_files(target, draft_path=draft, mmproj=projector, calibrate=False, history="off", n_ctx=1024)
    yield target, projector, engine
    engine.close()


def test_the_gridded_files_are_the_ones_the_reference_ran_on(gridded):
    target, projector, _engine = gridded
    assert hashlib.sha256(target.read_bytes()).hexdigest() == GRIDDED["target_sha256"]
    assert hashlib.sha256(projector.read_bytes()).hexdigest() == GRIDDED["projector_sha256"]


@pytest.mark.parametrize("name", sorted(RECORDER.IMAGES))
def test_m_rope_images_answer_as_llama_mtmd_cli_does(gridded, name):
    """12 rows on a 4x3 grid take 4 positions: the text after the image goes on from there."""
    _target, _projector, engine = gridded
    assert engine.projector.mrope
    tokens = engine.image_tokens(GRIDDED["prompt"], [RECORDER.png(RECORDER.IMAGES[name])])
    summary = answer(engine.generate(tokens, max_tokens=GRIDDED["tokens"], sampling=GREEDY, drafter="none"))
    assert_as_recorded(GRIDDED, name, summary.text)


def test_m_rope_follow_ups_reuse_the_cache_and_drafts_roll_back(gridded):
    """A hybrid target's follow-up restarts from its checkpoint after the image; drafts of a draft model
    (rejected ones rolled back) leave the answer as plain decoding's."""
    _target, _projector, engine = gridded
    first = [with_images({"role": "user", "content": "Describe the image."}, [IMAGE_A])]
    reply = answer(engine.chat(first, max_tokens=8, sampling=GREEDY, drafter="none")).text
    follow_up = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then? " * 4}]
    events = list(engine.chat(follow_up, max_tokens=24, sampling=GREEDY, drafter="none"))
    prefill = next(e for e in events if isinstance(e, Prefill))
    assert prefill.cached >= len(engine.chat_tokens(first))  # the image and the first turn, from the cache
    plain = answer(events).text
    drafted = answer(engine.chat(follow_up, max_tokens=24, sampling=GREEDY, drafter="model", draft_len=3))
    assert drafted.text == plain and drafted.drafted > 0 and drafted.accepted < drafted.drafted


@pytest.mark.parametrize("kind", ["mtp", "eagle3", "dflash"])
def test_heads_that_keep_the_targets_tokens_draft_after_an_image(smollm2_path, projector_path, kind):
    """MTP, EAGLE-3 and DFlash mirror the target's cache token by token; at an image's rows they pair the
    target's states with a newline (as a draft model sees the image), and drafting goes on after it."""
    from reference_drafts import SCRIPT

    if kind == "mtp":  # Qwen3.5 with its MTP block, and its images on M-RoPE's grid
        target = random_file("qwen35-tiny-mtp1-stdev0.06.gguf", lambda path: SCRIPT.write_file(path, smollm2_path, "mtp"))
        projector = random_file("mmproj-qwen2vl-for-qwen35-tiny-mtp.gguf",
                                lambda path: RECORDER.write_projector(path, target, "mmproj-qwen2vl"))
        engine = load_files(target, mmproj=projector, drafter="mtp", calibrate=False, history="off", n_ctx=1024)
    else:  # a draft beside the tests' SmolLM2
        draft = random_file(f"{kind}-for-smollm2-135m.gguf", lambda path: SCRIPT.write_file(path, smollm2_path, kind))
        engine = load_files(smollm2_path, draft_path=draft, mmproj=projector_path, drafter=kind, calibrate=False,
                            history="off", n_ctx=1024)
    try:
        assert engine.sees_images
        tokens = engine.image_tokens(MEDIA_MARKER + "one two three four five six seven eight nine ten one two",
                                     [IMAGE_A])
        plain = answer(engine.generate(tokens, max_tokens=32, sampling=GREEDY, drafter="none"))
        drafted = answer(engine.generate(tokens, max_tokens=32, sampling=GREEDY, drafter=kind, draft_len=3))
        assert drafted.text == plain.text
        assert drafted.drafted_by_drafter.get(kind, 0) > 0
    finally:
        engine.close()


def test_a_target_whose_graph_refuses_embeddings_is_refused_at_load_not_aborted(smollm2_path):
    """llama.cpp aborts the process on an image's embeddings for GLM-4 files without M-RoPE sections."""
    from reference_drafts import SCRIPT

    target = random_file("glm4moe-tiny-mtp1-stdev0.13.gguf",
                         lambda path: SCRIPT.write_file(path, smollm2_path, "mtp-glm4moe"))
    projector = random_file("mmproj-for-glm4moe-tiny.gguf", lambda path: RECORDER.write_projector(path, target))
    with pytest.raises(ModelFileError, match="cannot take images"):
        load_files(target, mmproj=projector, drafter="none", calibrate=False, history="off", n_ctx=512)
    engine = load_files(target, mmproj=projector, mmproj_optional=True, drafter="mtp", calibrate=False,
                        history="off", n_ctx=512)
    try:  # (the catalog's projector: a warning, and the model answers text)
        assert not engine.sees_images and any(w.startswith("images are off") for w in engine.warnings)
    finally:
        engine.close()


def test_media_runs_split_text_and_each_image():
    a, b = [media_id(3, r) for r in range(3)], [media_id(4, r) for r in range(2)]
    again = [media_id(3, r) for r in range(3)]
    runs = media_runs([1, 2, *a, *again, 5, *b])
    assert runs == [(0, [1, 2]), (2, a), (5, again), (8, [5]), (9, b)]


def test_a_draft_never_proposes_an_image_position():
    draft = text_only(Draft(tokens=[5, 6, media_id(0, 0), 7], source="ngram"))
    assert draft.tokens == [5, 6]
    assert text_only(Draft(tokens=[5])).tokens == [5]


# ----------------------------------------------------------------------------- on the wire


def data_uri(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


@pytest.fixture(scope="module")
def vision_server(smollm2_path, projector_path):
    with serving(smollm2_path, "smollm2", 2048, slots=2, mmproj=str(projector_path)) as running:
        yield running


def engine_answer(running, messages, max_tokens=16) -> str:
    """What the served engine answers the same messages in process (greedy, no drafts)."""
    return answer(running.served.engine.chat(messages, max_tokens=max_tokens, sampling=GREEDY, drafter="none")).text


def test_the_openai_sdk_sends_a_data_uri_and_gets_the_answer_about_that_image(vision_server):
    from openai import OpenAI

    client = OpenAI(base_url=vision_server.url + "/v1", api_key="unused")
    answers = {}
    for name, image in (("a", IMAGE_A), ("b", IMAGE_B)):
        reply = client.chat.completions.create(model="smollm2", max_tokens=16, temperature=0, messages=[
            {"role": "user", "content": [{"type": "text", "text": "Describe this: "},
                                         {"type": "image_url", "image_url": {"url": data_uri(image)}}]}])
        answers[name] = reply.choices[0].message.content
        expected = [{"role": "user", "content": "Describe this: " + MEDIA_MARKER, "images": [image]}]
        assert answers[name] == engine_answer(vision_server, expected)
    assert answers["a"] != answers["b"]


def test_the_ollama_client_sends_images_and_gets_the_answer_about_them(vision_server):
    import ollama

    client = ollama.Client(host=vision_server.url)
    reply = client.chat(model="smollm2", options={"temperature": 0, "num_predict": 16},
                        messages=[{"role": "user", "content": "What is this?", "images": [IMAGE_B]}])
    expected = [with_images({"role": "user", "content": "What is this?"}, [IMAGE_B])]
    assert reply.message.content == engine_answer(vision_server, expected)
    generated = client.generate(model="smollm2", prompt="What is this?", images=[IMAGE_B],
                                options={"temperature": 0, "num_predict": 16})
    assert generated.response == reply.message.content  # (the same conversation, sent the other way)


def test_llama_cpps_multimodal_data_on_completion(vision_server):
    body = {"prompt": {"prompt_string": REFERENCE["prompt"], "multimodal_data": [base64.b64encode(IMAGE_A).decode()]},
            "n_predict": REFERENCE["tokens"], "temperature": 0}
    reply = httpx.post(vision_server.url + "/completion", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert_as_recorded(REFERENCE, "a", reply.json()["content"])


def test_chat_connect_sends_images_through_the_native_stream(vision_server):
    """What `chat --connect` does: RemoteEngine sends a message's images base64; /info says the model sees."""
    from localspec.tui.remote import RemoteEngine

    client = httpx.Client(base_url=vision_server.url, timeout=120)
    info = client.get("/localspec/v1/info").json()
    assert info["sees_images"] is True
    remote = RemoteEngine(client, info)
    messages = [with_images({"role": "user", "content": "What is this?"}, [IMAGE_A])]
    assert answer(remote.chat(messages, max_tokens=12, sampling=GREEDY, drafter="none")).text == \
        engine_answer(vision_server, messages, max_tokens=12)


def test_two_requests_with_images_at_once_both_answer_as_alone(vision_server):
    def ask(image: bytes) -> str:
        reply = httpx.post(vision_server.url + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2", "max_tokens": 24, "temperature": 0, "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_uri(image)}},
                                             {"type": "text", "text": "Tell me about it."}]}]})
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["message"]["content"]

    alone = [ask(IMAGE_A), ask(IMAGE_B)]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(ask, [IMAGE_A, IMAGE_B]))
    assert together == alone


@pytest.mark.parametrize("url, complaint", [
    ("https://example.com/cat.png", "--allow-image-urls"),
    ("file:///etc/hostname", "--allow-image-files"),
    ("data:image/png;base64,@@@", "not valid base64"),
    ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not an image"),
])
def test_an_image_the_server_will_not_use_is_a_400_and_it_keeps_serving(vision_server, url, complaint):
    reply = httpx.post(vision_server.url + "/v1/chat/completions", timeout=60, json={
        "model": "smollm2", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
    assert reply.status_code == 400 and complaint in reply.text
    ok = httpx.post(vision_server.url + "/v1/chat/completions", timeout=60, json={
        "model": "smollm2", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert ok.status_code == 200


def test_a_text_only_model_answers_images_with_a_400_naming_it(smollm2_path):
    with serving(smollm2_path, "smollm2-text", 512) as running:
        reply = httpx.post(running.url + "/api/chat", timeout=60, json={
            "model": "smollm2-text", "stream": False,
            "messages": [{"role": "user", "content": "?", "images": [base64.b64encode(IMAGE_A).decode()]}]})
        assert reply.status_code == 400 and "smollm2-text" in reply.text and "--mmproj" in reply.text


# ----------------------------------------------------------------------------- in the chat app


async def _until(pilot, condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await pilot.pause(0.05)


async def _type(pilot, text: str) -> None:
    for ch in text:
        await pilot.press({" ": "space", "/": "slash", ".": "full_stop", "-": "minus", "_": "underscore"}.get(ch, ch))


@pytest.mark.anyio
async def test_the_chat_app_sends_an_image_shows_it_and_shows_it_again_on_reopening(smollm2_path, projector_path,
                                                                                     tmp_path):
    from localspec.tui.app import create_app
    from localspec.tui.provider import LocalProvider
    from localspec.tui.widgets import UserMessage

    picture = tmp_path / "shot.png"
    picture.write_bytes(IMAGE_A)
    config = UserConfig(chat=ChatSettings(max_tokens=12, drafter="none"))
    provider = LocalProvider(n_ctx=2048, mmproj=(str(smollm2_path), str(projector_path)))
    app = create_app(str(smollm2_path), provider=provider, config=config)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.engine is not None, 120)
        app.chat.attach(str(picture))  # (what F2's dialog and "/image PATH" both do)
        assert app.chat.attached == [("shot.png", IMAGE_A)]
        assert "shot.png" in str(app.chat.query_one("#attachments").render())
        await _type(pilot, "Describe it.")
        await pilot.press("enter")
        await _until(pilot, lambda: len(app.history.messages(app.conversation.id)) == 2 and not app.generating, 120)
        prompt, reply = app.history.messages(app.conversation.id)
        assert prompt.images == [{"sha256": hashlib.sha256(IMAGE_A).hexdigest(), "name": "shot.png"}]
        assert reply.status == "complete" and app.chat.attached == []
        shown = [m for m in app.log_view.query(UserMessage)]
        assert shown[-1].images == ("shot.png",) and "▣ shot.png" in str(shown[-1].render())
        expected = [with_images({"role": "user", "content": "Describe it."}, [IMAGE_A])]
        assert reply.content == answer(app.engine.chat(expected, max_tokens=12, sampling=GREEDY, drafter="none")).text
        conversation = app.conversation.id
    # reopened: the image is shown and goes with the conversation again (read back by its hash)
    app = create_app(None, provider=LocalProvider(n_ctx=512), config=config)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        assert app.conversation.id == conversation
        assert [m.images for m in app.log_view.query(UserMessage)] == [("shot.png",)]
        [user] = [m for m in app.chats.context_messages() if m["role"] == "user"]
        assert user["images"] == [IMAGE_A] and user["content"] == MEDIA_MARKER + "Describe it."


@pytest.mark.anyio
async def test_the_chat_app_keeps_a_message_with_images_a_model_cannot_see(smollm2_path, tmp_path):
    from localspec.tui.app import create_app
    from localspec.tui.provider import LocalProvider

    picture = tmp_path / "shot.png"
    picture.write_bytes(IMAGE_A)
    config = UserConfig(chat=ChatSettings(max_tokens=4, drafter="none"))
    app = create_app(str(smollm2_path), provider=LocalProvider(n_ctx=512), config=config)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.engine is not None, 120)
        await _type(pilot, f"/image {picture}")
        await pilot.press("enter")
        assert [name for name, _data in app.chat.attached] == ["shot.png"]
        await _type(pilot, "What is it?")
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.history.messages(app.conversation.id) == []  # nothing sent
        assert app.prompt.text == "What is it?"
        app.chat.attach(str(tmp_path / "missing.png"))  # a path that is not there: said, nothing attached
        assert len(app.chat.attached) == 1


# ----------------------------------------------------------------------------- on the command line


def test_run_answers_about_an_image_and_check_says_whether_a_projector_fits(smollm2_path, projector_path, tmp_path):
    from click.testing import CliRunner

    from localspec.cli import cli

    picture = tmp_path / "a.png"
    picture.write_bytes(IMAGE_A)
    runner = CliRunner()
    ran = runner.invoke(cli, ["run", str(smollm2_path), REFERENCE["prompt"], "--raw", "--mmproj", str(projector_path),
                              "--image", str(picture), "--max-tokens", str(REFERENCE["tokens"]), "--temperature", "0",
                              "--drafter", "none"])
    assert ran.exit_code == 0, ran.output
    assert_as_recorded(REFERENCE, "a", ran.output.splitlines()[0])  # (the answer, then its summary line)
    fits = runner.invoke(cli, ["check", str(smollm2_path), "--mmproj", str(projector_path)])
    assert fits.exit_code == 0 and "pass" in fits.output and "sees images" in fits.output
    blind = runner.invoke(cli, ["run", str(smollm2_path), "?", "--image", str(picture), "--max-tokens", "2"])
    assert isinstance(blind.exception, LocalspecError) and "cannot see images" in str(blind.exception)  # (main() prints it)


def test_check_names_why_a_projector_does_not_fit(qwen_coder_path, projector_path):
    from click.testing import CliRunner

    from localspec.cli import cli

    result = CliRunner().invoke(cli, ["check", str(qwen_coder_path), "--mmproj", str(projector_path)])
    assert result.exit_code == 1 and "FAIL" in result.output and "mismatch between text model" in result.output


def test_a_prompt_chunk_never_ends_inside_an_image():
    from localspec.engine.parallel import whole_images

    image = [media_id(2, r) for r in range(5)]
    prompt = [1, 2, *image, 7, 8]
    assert [whole_images(prompt, n) for n in range(1, 9)] == [1, 2, 7, 7, 7, 7, 7, 8]
    assert whole_images([*image, 9], 2) == 5

"""Embeddings from a real `localspec serve`, through the openai SDK, the ollama client and llama.cpp's
endpoint, against llama.cpp's own pooling of the same text (`Llama(embedding=True)` on the same file)."""

import threading

import httpx
import numpy as np
import pytest

from servers import serving

pytestmark = pytest.mark.model

SHORT = "The quick brown fox jumps over the lazy dog."
# Over one chunk (backend/embedding.py CHUNK, 128 tokens): evaluated in several decodes, pooled here.
LONG = "def add(values):\n    total = 0\n    for value in values:\n        total += value\n    return total\n" * 12


def _reference(path, texts):
    """llama-cpp-python's mean pooling of each text, unnormalized."""
    import llama_cpp

    ref = llama_cpp.Llama(str(path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=2048,
                          n_batch=2048, n_ubatch=2048, verbose=False)
    try:
        return [np.array(ref.embed(t), dtype=np.float64) for t in texts]
    finally:
        ref.close()


def _unit(v):
    return v / np.linalg.norm(v)


@pytest.fixture(scope="module")
def server(smollm2_path):
    with serving(smollm2_path, "smollm2", 1024) as running:
        yield running


@pytest.fixture(scope="module")
def expected(smollm2_path):
    return dict(zip([SHORT, LONG], _reference(smollm2_path, [SHORT, LONG])))


@pytest.mark.parametrize("encoding", ["base64", "float"])  # the SDK asks for base64 unless told otherwise
def test_openai_sdk_embeddings_of_one_text_and_a_batch_are_llama_cpps_pooling(server, expected, encoding):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    extra = {} if encoding == "base64" else {"encoding_format": "float"}
    one = client.embeddings.create(model="smollm2", input=SHORT, **extra)
    batch = client.embeddings.create(model="smollm2", input=[LONG, SHORT], **extra)
    assert len(one.data) == 1 and [d.index for d in batch.data] == [0, 1]
    np.testing.assert_allclose(one.data[0].embedding, _unit(expected[SHORT]), atol=1e-4)
    np.testing.assert_allclose(batch.data[0].embedding, _unit(expected[LONG]), atol=1e-4)
    np.testing.assert_allclose(batch.data[1].embedding, one.data[0].embedding, atol=1e-6)
    assert batch.usage.prompt_tokens > 128 and one.usage.prompt_tokens > 5


def test_ollama_client_embed_and_the_older_embeddings(server, expected):
    import ollama

    client = ollama.Client(host=server.url)
    one = client.embed(model="smollm2", input=SHORT)
    batch = client.embed(model="smollm2:latest", input=[SHORT, LONG])
    np.testing.assert_allclose(one.embeddings[0], _unit(expected[SHORT]), atol=1e-4)
    np.testing.assert_allclose(batch.embeddings[1], _unit(expected[LONG]), atol=1e-4)
    older = client.embeddings(model="smollm2", prompt=SHORT)  # Ollama's older endpoint: not normalized
    np.testing.assert_allclose(older.embedding, expected[SHORT], atol=1e-4 * np.abs(expected[SHORT]).max())
    cut = client.embed(model="smollm2", input=SHORT, dimensions=64)
    assert len(cut.embeddings[0]) == 64 and np.linalg.norm(cut.embeddings[0]) == pytest.approx(1.0, abs=1e-5)


def test_llama_cpp_embedding_endpoint_for_one_content_and_several(server, expected):
    one = httpx.post(server.url + "/embedding", json={"content": SHORT}, timeout=120).json()
    several = httpx.post(server.url + "/embeddings", json={"content": [SHORT, LONG], "embd_normalize": -1},
                         timeout=120).json()
    assert one[0]["index"] == 0 and len(one[0]["embedding"]) == 1  # llama.cpp's shape: one pooled vector per text
    np.testing.assert_allclose(one[0]["embedding"][0], _unit(expected[SHORT]), atol=1e-4)
    raw = several[1]["embedding"][0]
    np.testing.assert_allclose(raw, expected[LONG], atol=1e-4 * np.abs(expected[LONG]).max())


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/embeddings", {"model": "nope", "input": "x"}, 404, "Unknown model"),
    ("/v1/embeddings", {"input": []}, 400, "empty list"),
    ("/v1/embeddings", {"input": [""]}, 400, "empty"),
    ("/v1/embeddings", {"input": {"a": 1}}, 400, "must be a text"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "dimensions": 99999}, 400, "dimensions"),
    ("/v1/embeddings", {"input": [[1, 2, 10**9]]}, 400, "outside"),
    ("/v1/embeddings", {"input": "word " * 3000}, 400, "at most 2048"),
    ("/api/embed", {"model": "smollm2", "input": ""}, 400, "input"),
    ("/api/embeddings", {"model": "smollm2", "prompt": ""}, 400, "prompt"),
    ("/embedding", {"nothing": 1}, 400, "content"),
])
def test_bad_embedding_requests_get_a_clear_400_or_404(server, path, body, status, needle):
    response = httpx.post(server.url + path, json=body, timeout=120)
    assert response.status_code == status and needle in response.text, response.text


def test_ollama_truncates_a_text_longer_than_the_model_embeds(server):
    out = httpx.post(server.url + "/api/embed", json={"model": "smollm2", "input": "word " * 3000}, timeout=300).json()
    assert out["prompt_eval_count"] == 2048 and len(out["embeddings"][0]) == 576


def test_embeddings_while_a_chat_streams_leave_the_answer_as_it_is_alone(server):
    body = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse."}], "max_tokens": 96,
            "temperature": 0, "drafter": "none"}
    alone = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    results = {}

    def embed():
        results["embeddings"] = httpx.post(server.url + "/v1/embeddings", json={"input": [LONG] * 6},
                                           timeout=300).json()

    text = ""
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        worker = None
        for line in r.iter_lines():
            if worker is None:
                worker = threading.Thread(target=embed)
                worker.start()
            if line.startswith("data: {"):
                import json

                delta = json.loads(line[6:])["choices"]
                text += (delta[0]["delta"].get("content") or "") if delta else ""
    worker.join()
    assert text == alone["choices"][0]["message"]["content"]
    vectors = [d["embedding"] for d in results["embeddings"]["data"]]
    assert len(vectors) == 6 and np.allclose(vectors[0], vectors[5], atol=1e-6)


def test_an_embedding_model_of_its_own_answers_beside_the_chat_model(smollm2_path, qwen_coder_path):
    from localspec.server.embeddings import embedding_model

    with serving(smollm2_path, "smollm2", 1024) as running:
        running.served.embeddings.insert(0, embedding_model(str(qwen_coder_path)))
        url = running.url
        default = httpx.post(url + "/v1/embeddings", json={"input": SHORT}, timeout=120).json()
        named = httpx.post(url + "/api/embed", json={"model": qwen_coder_path.stem, "input": SHORT}, timeout=120).json()
        target = httpx.post(url + "/api/embed", json={"model": "smollm2", "input": SHORT}, timeout=120).json()
        chat = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                               "max_tokens": 4}, timeout=120)
    [reference] = _reference(qwen_coder_path, [SHORT])
    np.testing.assert_allclose(default["data"][0]["embedding"], _unit(reference), atol=1e-4)
    np.testing.assert_allclose(named["embeddings"][0], _unit(reference), atol=1e-4)
    assert len(target["embeddings"][0]) == 576 != len(reference)  # the chat model's own, when named
    assert chat.status_code == 200


def test_an_encoder_embedding_model_pools_the_whole_text_as_llama_cpp_does(smollm2_path):
    """A BERT-like encoder (bidirectional attention, the file's own mean pooling, as nomic-embed-text and
    bge are) sees a text whole, in one batch; random weights written by tests/fixtures/random_gguf.py."""
    from conftest import random_file, random_gguf_writer
    from localspec.server.embeddings import embedding_model

    path = random_file("bert-tiny.gguf", lambda out: random_gguf_writer().write("bert", out, smollm2_path))
    model = embedding_model(str(path))
    embedder = model.embedder()
    assert not embedder.causal and embedder.pooling_name == "mean" and embedder.chunk == embedder.max_tokens
    with serving(smollm2_path, "smollm2", 1024) as running:
        running.served.embeddings.insert(0, model)
        out = httpx.post(running.url + "/v1/embeddings", json={"input": [SHORT, LONG]}, timeout=120).json()
    for got, want in zip(out["data"], _reference(path, [SHORT, LONG])):
        np.testing.assert_allclose(got["embedding"], _unit(want), atol=1e-4)

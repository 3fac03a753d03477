"""llama.cpp's `infill` sampler (the last step of llama.vim's chain ["top_k", "top_p", "infill"]): our
numpy port against llama.cpp's own implementation, on the real vocabulary of a FIM model."""

import ctypes

import llama_cpp as L
import numpy as np
import pytest

from localspec.engine.backend import VocabFile
from localspec.engine.sampling import InfillVocab, SamplingSettings, Sampler, filtered_probs, infill_survivors

pytestmark = pytest.mark.model

WORDS = ["r", "re", "ret", "return", " r", " re", " ret", " return", "d", "de", "def", " def", "\n", "\n\n", "    ",
         "        ", "print", " print", "p", "pr", "s", "se", "self", " self", ".", ".append", "(", "()", "):"]


def _reference(vocab, ids: np.ndarray, logits: np.ndarray) -> set[int]:
    """What llama.cpp's llama_sampler_init_infill keeps of these candidates."""
    data = (L.llama_token_data * len(ids))(*[L.llama_token_data(int(t), float(x), 0.0) for t, x in zip(ids, logits)])
    array = L.llama_token_data_array(data, len(ids), -1, False)
    sampler = L.llama_sampler_init_infill(vocab._vocab)
    try:
        L.llama_sampler_apply(sampler, ctypes.byref(array))
        return {int(array.data[i].id) for i in range(array.size)}
    finally:
        L.llama_sampler_free(sampler)


def test_the_port_keeps_what_llama_cpp_keeps(qwen_coder_path):
    with VocabFile(qwen_coder_path) as file:
        vocab = file.vocab
        pool = sorted({t for w in WORDS for t in vocab.tokenize(w, add_special=False)[:1]} | {vocab.eos, vocab.eot})
        info = InfillVocab(is_eog=vocab.is_eog, piece=vocab.token_bytes, eot=vocab.eot)
        rng = np.random.default_rng(0)
        ends = texts = 0
        for case in range(400):
            ids = rng.choice(pool, size=int(rng.integers(2, len(pool))), replace=False)
            logits = rng.normal(size=len(ids)) * rng.choice([0.5, 2.0, 5.0])
            if case % 4 == 0:
                logits[[i for i, t in enumerate(ids) if vocab.is_eog(int(t))]] += 3.0
            order = np.argsort(-logits, kind="stable")
            ids, logits = ids[order], logits[order]
            ours = infill_survivors(ids, logits.astype(np.float64), info)
            assert set(int(t) for t in ours) == _reference(vocab, ids, logits), (case, list(ids), list(logits))
            texts += any(not vocab.is_eog(int(t)) for t in ours)
            ends += all(vocab.is_eog(int(t)) for t in ours)
        assert texts > 50 and ends > 50, (texts, ends)  # both branches were compared, many times


def test_a_chain_with_infill_ends_where_end_of_text_is_likely(qwen_coder_path):
    """Greedy with llama.vim's chain: where end-of-generation carries enough probability the infill step
    keeps only it, so the completion ends although a text token had the highest logit."""
    with VocabFile(qwen_coder_path) as file:
        vocab = file.vocab
        info = InfillVocab(is_eog=vocab.is_eog, piece=vocab.token_bytes, eot=vocab.eot)
        logits = np.full(vocab.n_tokens, -20.0, dtype=np.float32)
        text = vocab.tokenize(" return", add_special=False)[0]
        logits[text], logits[vocab.eot] = 2.0, 1.2
        chain = SamplingSettings(temperature=0, top_k=40, top_p=0.9, samplers=("top_k", "top_p", "infill"))
        assert Sampler(SamplingSettings(temperature=0), info).argmax(logits, []) == text
        assert Sampler(chain, info).argmax(logits, []) == vocab.eot
        probs = filtered_probs(logits, chain.with_(temperature=1.0), info)
        assert probs[vocab.eot] == pytest.approx(1.0)

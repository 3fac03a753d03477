"""A rename carried to the name's other tokens (engine/drafters/respelling.py), with a small vocabulary
and with the real tokenizer of a code model."""

from __future__ import annotations

import pytest

from localspec.engine.drafters import NgramDrafter
from localspec.engine.drafters.respelling import Respelling

PIECES = {10: b" calc", 11: b".calc", 12: b"(calc", 13: b" compute", 14: b"_total", 15: b".compute",
          16: b"(compute", 17: b" x", 18: b"(", 19: b")", 20: b":\n", 21: b" =", 22: b" cart", 23: b" return",
          24: b" total", 25: b" def", 26: b" self", 27: b" +", 28: b" 1", 29: b" y", 30: b"class", 31: b" Cart",
          50: b"Rename", 51: b" `", 52: b"calc", 53: b"`", 54: b" to", 55: b"compute", 56: b".\n"}


def _tokenize(text: bytes) -> list[int]:
    """Longest piece first, as a tokenizer with these pieces would."""
    tokens = []
    while text:
        token, piece = max(((t, p) for t, p in PIECES.items() if text.startswith(p)), key=lambda tp: len(tp[1]))
        tokens.append(token)
        text = text[len(piece):]
    return tokens


SPELLING = Respelling(lambda token: PIECES.get(token, b"#%d" % token), _tokenize)


def test_a_rename_carries_to_the_names_other_tokens_and_nowhere_else():
    # ` calc` -> ` compute` `_total`: `.calc` and `(calc` spell the same name.
    assert SPELLING.renamed(10, [13, 14], [10, 11, 12, 17, 22]) == {11: [15, 14], 12: [16, 14]}
    # A token that is not one name for another (` x` -> ` x` ` +`: characters after it differ) carries nowhere.
    assert SPELLING.renamed(17, [17, 27], [10, 11, 17]) == {}
    assert SPELLING.renamed(18, [19], [10, 11]) == {}


def test_a_copy_writes_the_renamed_name_where_the_source_spells_it_otherwise():
    """The answer wrote ` calc` as ` compute` `_total`; the source's later `.calc` is copied as
    `.compute` `_total`, without first breaking the copy there."""
    source = [30, 31, 20, 25, 10, 18, 26, 19, 20, 23, 24, 27, 28, 20, 22, 21, 22, 11, 18, 19, 20, 23, 22]
    source += list(range(40, 48))
    answer = [30, 31, 20, 25, 13, 14, 18, 26, 19, 20, 23]
    ngram = NgramDrafter(respelling=SPELLING)
    ngram.reset(prompt_len=len(source))
    draft = ngram.propose(source + answer, 12, None)
    assert ngram.replacements == {10: 13, 11: 15} and ngram.insertions == {10: 14, 11: 14}  # (no `(calc` here)
    assert draft.tokens == [24, 27, 28, 20, 22, 21, 22, 15, 14, 18, 19, 20]
    without = NgramDrafter()
    without.reset(prompt_len=len(source))
    assert without.propose(source + answer, 12, None).tokens[7] == 11  # (the source's own token: a break)


def test_the_renames_a_prompt_asks_for_are_known_before_the_answer_starts():
    """"Rename `calc` to `compute`": every prompt token spelling `calc` is written as the new name from the
    answer's first copy on, spaces around it included (the prompt named the name)."""
    spelling = SPELLING
    prompt = [50, 51, 52, 53, 54, 51, 55, 53, 56, 25, 10, 18, 26, 19, 20, 23, 22, 11, 18, 19]
    assert spelling.asked(prompt) == {10: [13], 11: [15], 52: [55]}
    assert spelling.asked([25, 10, 18, 26, 19, 20]) == {}                       # nothing asked
    ngram = NgramDrafter(respelling=spelling)
    ngram.reset(prompt_len=len(prompt))
    ngram.rename(spelling.asked(prompt))
    assert ngram.propose(prompt + [25], 8, None).tokens == [13, 18, 26, 19, 20, 23, 22, 15]


def test_an_images_positions_are_never_spelt():
    """Image positions (negative ids) stand in a prompt among its tokens; llama.cpp aborts the process
    on spelling one, so they spell nothing here."""
    def spell(token: int) -> bytes:
        assert token >= 0, "an image's position was spelt"
        return PIECES.get(token, b"#%d" % token)

    spelling = Respelling(spell, _tokenize)
    prompt = [50, 51, 52, 53, 54, 51, 55, 53, 56, -7, -7, -7, 25, 10, 18, 26, 19, 20]
    assert spelling.asked(prompt) == {10: [13], 52: [55]}
    assert spelling.renamed(10, [13, 14], prompt + [11]) == {11: [15, 14]}
    assert spelling.renamed(-7, [13], prompt) == {}


@pytest.mark.model
def test_the_real_tokenizer_respells_a_renamed_method_at_its_call(qwen_coder_path):
    from localspec.engine.backend.gguf import VocabFile

    code = ("class Cart:\n    def calc(self):\n        return sum(self.lines)\n\n\n"
            "def checkout(cart):\n    total = cart.calc()\n    return total\n")
    renamed = code.replace("calc", "compute_total")
    with VocabFile(qwen_coder_path) as file:
        vocab = file.vocab
        source = vocab.tokenize(code, add_special=False)
        answer = vocab.tokenize(renamed, add_special=False)
        def_line = next(i for i in range(len(answer)) if vocab.detokenize(answer[:i]).endswith("(self):\n"))
        ngram = NgramDrafter(respelling=Respelling.of(vocab))
        ngram.reset(prompt_len=len(source))
        draft = ngram.propose(source + answer[:def_line + 2], 64, None)
        rest = vocab.detokenize(answer[def_line + 2:])
        assert vocab.detokenize(draft.tokens).startswith(rest[:rest.index("()") + 2])
        assert ".compute_total()" in vocab.detokenize(draft.tokens)
        # Asked in so many words, the rename is written from the answer's first copy on.
        ask = vocab.tokenize("Rename the method `calc` to `compute_total`.\n\n" + code, add_special=False)
        asking = NgramDrafter(respelling=Respelling.of(vocab))
        asking.reset(prompt_len=len(ask))
        asking.rename(Respelling.of(vocab).asked(ask))
        opening = vocab.tokenize("class Cart:\n    def", add_special=False)
        first = asking.propose(ask + opening, 64, None)
        assert vocab.detokenize(first.tokens).startswith(" compute_total(self):\n")
        assert ".compute_total()" in vocab.detokenize(first.tokens)

"""Renames spelt through the target's vocabulary. Where the answer renamed ` calc` to ` compute_total`,
the source's `.calc` and `(calc` are the same name with other characters around it, so they are renamed
too, each written as the tokens of its new spelling (`.compute` `_total`); the copy drafter asks once per
rename it learns (ngram.NgramDrafter). And where the prompt asks for a rename in so many words
("Rename `calc` to `compute_total`"), every token spelling the old name is renamed from the answer's
start (copies.CopyTurn)."""

from __future__ import annotations

import re
from typing import Callable, Iterable, Sequence

from localspec.engine.model import Vocabulary

# A token spelling one name: the characters before it, the name, the characters after it.
_NAME = re.compile(rb"^([^0-9A-Za-z_]*)([0-9A-Za-z_]+)([^0-9A-Za-z_]*)$")
# A line asking for renames, and each rename it asks: `old` to `new`.
_ASKS_RENAMES = re.compile(rb"(?i)\brename\b[^\n]*")
_RENAME = re.compile(rb"`([A-Za-z_][0-9A-Za-z_]*)`\s+(?:to|into|as)\s+`([A-Za-z_][0-9A-Za-z_]*)`")


class Respelling:
    """Spells names through the target's vocabulary: `spell` gives a token's bytes, `tokenize` the tokens
    of a text (no special tokens)."""

    def __init__(self, spell: Callable[[int], bytes], tokenize: Callable[[bytes], list[int]]):
        self._spell = spell
        self.tokenize = tokenize

    def spell(self, token: int) -> bytes:
        """A token's bytes; an image's position (a negative id, engine/backend/vision.py) spells nothing:
        it is no token of the vocabulary, which aborts the process on one."""
        return self._spell(token) if token >= 0 else b""

    @classmethod
    def of(cls, vocab: Vocabulary) -> "Respelling":
        return cls(vocab.token_bytes, lambda text: vocab.tokenize(text.decode("utf-8", "replace"), add_special=False))

    def asked(self, prompt: Sequence[int]) -> dict[int, list[int]]:
        """The renames the prompt asks for in so many words ("Rename `calc` to `compute_total`"): each
        prompt token spelling an old name, with any characters around it, and the tokens spelling the new
        name in its place."""
        text = b"".join(self.spell(t) for t in prompt)
        names = {old: new for line in _ASKS_RENAMES.findall(text) for old, new in _RENAME.findall(line) if old != new}
        return self._respelt(set(prompt), names, anywhere=True) if names else {}

    def renamed(self, source: int, written: Sequence[int], candidates: Iterable[int]) -> dict[int, list[int]]:
        """The tokens among `candidates` that spell the name `source` spells with other characters around
        it, each with the tokens spelling the name `written` spells in its place; none where the rename
        is not one name for another with the same characters around both."""
        old = _NAME.match(self.spell(source))
        new = _NAME.match(b"".join(self.spell(t) for t in written))
        if old is None or new is None or old.group(1, 3) != new.group(1, 3) or old.group(2) == new.group(2):
            return {}
        return self._respelt(set(candidates) - {source}, {old.group(2): new.group(2)}, anywhere=False)

    def _respelt(self, tokens: set[int], names: dict[bytes, bytes], anywhere: bool) -> dict[int, list[int]]:
        """The tokens spelling an old name of `names`, each with the tokens spelling its new name with the
        same characters around it; `anywhere` False: only tokens with more than spaces around the name
        (prose keeps a word that code renamed: a docstring's "MIME type")."""
        found = {}
        for token in tokens:
            spelt = _NAME.match(self.spell(token))
            if spelt is None or spelt.group(2) not in names:
                continue
            before, after = spelt.group(1), spelt.group(3)
            if anywhere or (before + after).strip():
                found[token] = self.tokenize(before + names[spelt.group(2)] + after)
        return found

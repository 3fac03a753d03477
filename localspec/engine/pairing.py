"""llama.cpp's rules for whether a draft model may serve a target: their tokenizers must agree.

Pure: works on any objects with the `engine.backend.Vocab` fields (the tests use plain stand-ins).
"""

from __future__ import annotations

from dataclasses import dataclass

# llama.cpp's own rules (common/speculative.cpp): a draft may serve a target when the tokenizers
# agree on type, special tokens and flags, and on the text of every token from id 5 up.
VOCAB_SIZE_TOLERANCE = 128
FIRST_CHECKED_TOKEN = 5


@dataclass(frozen=True)
class RuleResult:
    rule: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class PairReport:
    results: tuple[RuleResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def first_failure(self) -> str:
        for r in self.results:
            if not r.ok:
                return f"{r.rule}: {r.detail}"
        return ""

    def with_rule(self, rule: str, ok: bool, detail: str) -> "PairReport":
        return PairReport((*self.results, RuleResult(rule, ok, detail)))


def check_pair(target, draft) -> PairReport:
    """Apply the pairing rules to two vocabularies (objects with type, bos, eos, add_bos, add_eos,
    n_tokens and text(id), such as `engine.backend.Vocab`)."""
    results = [
        _rule("same vocabulary type", target.type == draft.type, f"target {target.type}, draft {draft.type}"),
        _rule("same BOS token id", target.bos == draft.bos, f"target {target.bos}, draft {draft.bos}"),
        _rule("same EOS token id", target.eos == draft.eos, f"target {target.eos}, draft {draft.eos}"),
        _rule("same add-BOS flag", target.add_bos == draft.add_bos, f"target {target.add_bos}, draft {draft.add_bos}"),
        _rule("same add-EOS flag", target.add_eos == draft.add_eos, f"target {target.add_eos}, draft {draft.add_eos}"),
    ]
    diff = abs(target.n_tokens - draft.n_tokens)
    results.append(_rule(
        f"vocabulary sizes within {VOCAB_SIZE_TOLERANCE}", diff <= VOCAB_SIZE_TOLERANCE,
        f"target {target.n_tokens}, draft {draft.n_tokens} (difference {diff})",
    ))
    mismatch = None
    for token in range(FIRST_CHECKED_TOKEN, min(target.n_tokens, draft.n_tokens)):
        a, b = target.text(token), draft.text(token)
        if a != b:
            mismatch = f"first difference at token {token}: target {a!r}, draft {b!r}"
            break
    checked = max(0, min(target.n_tokens, draft.n_tokens) - FIRST_CHECKED_TOKEN)
    results.append(_rule(
        f"identical token texts from id {FIRST_CHECKED_TOKEN} up", mismatch is None,
        mismatch or f"{checked} tokens compared",
    ))
    return PairReport(tuple(results))


def hidden_state_width(target, draft) -> tuple[bool, str]:
    """An EAGLE-3, DFlash or Gemma 4 assistant draft reads the target's hidden states: whether their widths
    match, and what they are (EAGLE-3 and assistant files name their target's; a DFlash one has the
    target's width itself)."""
    arch = target.meta("general.architecture")
    wanted = (draft.meta("eagle3.target_hidden_size") or draft.meta("dflash.embedding_length")
              or draft.meta("gemma4-assistant.embedding_length_out"))
    width = target.meta(f"{arch}.embedding_length")
    return width == wanted, f"target {width}, draft made for {wanted}"


def _rule(name: str, ok: bool, detail: str) -> RuleResult:
    return RuleResult(rule=name, ok=ok, detail=detail)

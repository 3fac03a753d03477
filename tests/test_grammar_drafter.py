"""The grammar drafter on the toy model: what a grammar forces is found by asking it about the
single-character tokens, drafted (its last piece left to the model), kept, and never changes the answer."""

import json

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.drafters import GrammarDrafter, Plan
from localspec.engine.drafters.grammar import forced_text, single_characters
from localspec.engine.events import answer_tokens
from localspec.engine.sampling import SamplingSettings
from toy import ToyModel, ToyVocab

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class LetterVocab(ToyVocab):
    """Tokens 4-29 are the letters a-z, each a token of its own; any other character is a token of
    several bytes (30 and up), as a real vocabulary's merged pieces are."""

    def token_bytes(self, token: int) -> bytes:
        if 4 <= token < 4 + len(LETTERS):
            return LETTERS[token - 4].encode()
        return super().token_bytes(token)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = [4 + LETTERS.index(c) if c in LETTERS else 30 + ord(c) % (self.n_tokens - 30) for c in text]
        return ([self.bos] if add_special else []) + ids


def letter(c: str) -> int:
    return 4 + LETTERS.index(c)


def forcing_grammar() -> str:
    """Any of the letters e-z, or 'a', after which 'bcd' is the only continuation; the text may end
    only between words."""
    free = {str(letter(c)): 0 for c in LETTERS[4:]}
    edges = {"0": {**free, str(letter("a")): 1}, "1": {str(letter("b")): 2}, "2": {str(letter("c")): 3},
             "3": {str(letter("d")): 0}}
    return json.dumps({"start": 0, "edges": edges, "final": [0]})


def _letter_toy(seed: int) -> ToyModel:
    toy = ToyModel(seed=seed, eos_bias=-8.0)
    toy.vocab = LetterVocab(toy.n_vocab)
    toy.a[:, letter("a")] += 6.0  # 'a' often: forced runs to draft
    return toy


def _engine(drafter: str, seed: int) -> Engine:
    return Engine(_letter_toy(seed), None, EngineOptions(drafter=drafter, learn_costs=False, history_drafts=False),
                  cost=CostModel({1: 1.0, 2: 1.05, 3: 1.08, 4: 1.1, 8: 1.2, 16: 1.4}))


def test_the_forced_text_is_what_the_grammar_allows_alone():
    vocab = LetterVocab(48)
    chars, ids = single_characters(vocab)
    assert chars == LETTERS and list(ids) == [letter(c) for c in LETTERS]
    state = vocab.grammar(forcing_grammar())
    assert forced_text(state, chars, ids, [vocab.eos]) == ""  # a choice of letters (and the end) here
    state.accept(letter("a"))
    assert forced_text(state, chars, ids, [vocab.eos]) == "bcd"
    assert forced_text(state, chars, ids, [vocab.eos], limit=2) == "bc"
    assert state.state == 1 and not state.closed  # asked on a fork: the request's state did not move


def test_the_draft_leaves_the_last_forced_piece_to_the_model_and_needs_a_grammar():
    vocab = LetterVocab(48)
    drafter = GrammarDrafter(vocab)
    state = vocab.grammar(forcing_grammar())
    state.accept(letter("a"))
    plan = Plan(cost=CostModel({1: 1.0, 2: 1.05, 3: 1.08}), grammar=state)
    offer = drafter.offer([0, letter("a")], room=8, plan=plan)
    assert offer is not None and offer.draft is not None
    assert offer.draft.tokens == [letter("b"), letter("c")] and offer.length == 2 and offer.draft.source == "grammar"
    assert drafter.offer([0, letter("a")], room=1, plan=plan).draft.tokens == [letter("b")]  # the room caps it
    assert drafter.offer([0, letter("a")], room=8, plan=Plan(cost=plan.cost)) is None  # free text: nothing forced


def test_forced_drafts_are_kept_and_greedy_output_is_unchanged():
    settings = SamplingSettings(grammar=forcing_grammar())
    runs = 0
    for seed in (1, 2, 3):
        prompt = [0, letter("e"), letter("f")]
        plain = list(_engine("none", seed).generate(prompt, max_tokens=40, sampling=settings))
        spec = list(_engine("grammar", seed).generate(prompt, max_tokens=40, sampling=settings))
        assert answer_tokens(spec) == answer_tokens(plain)
        runs += answer_tokens(plain).count(letter("a"))
        summary = spec[-1]
        assert summary.drafted == summary.accepted == summary.drafted_by_drafter.get("grammar", 0)
        assert summary.accepted >= 2 * answer_tokens(plain).count(letter("a")) - 2  # 'b', 'c' after every 'a'
    assert runs >= 10


def test_auto_prices_the_grammar_drafter_with_the_others():
    settings = SamplingSettings(grammar=forcing_grammar())
    summary = list(_engine("auto", 2).generate([0, letter("e")], max_tokens=40, sampling=settings))[-1]
    assert summary.drafted_by_drafter.get("grammar", 0) > 0
    free = list(_engine("grammar", 2).generate([0, letter("e")], max_tokens=20))[-1]
    assert free.drafted == 0  # no grammar: nothing is forced

"""The "history" drafter: the suffix index of earlier requests, its pricing through the planner, its
file, and exactness on the toy model (greedy equals plain, sampling keeps the target's distribution)."""

from collections import Counter

import numpy as np
import pytest

from localspec.engine.adaptive import CostModel
from localspec.engine.api import Engine, EngineOptions
from localspec.engine.drafters import REGISTRY, HistoryDrafter
from localspec.engine.drafters.suffix_index import SuffixIndex, load_index, model_key, save_index
from localspec.engine.events import Round, Summary
from localspec.engine.events import answer_tokens as _tokens
from localspec.engine.sampling import REPLAY_TOLERANCE, SamplingSettings
from toy import TWO_TOKEN_TOY, ToyModel, exact_two_tokens

COST = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}


def _engine(drafter="history", seed=3, **toy):
    return Engine(ToyModel(seed=seed, **toy), None, EngineOptions(drafter=drafter, learn_costs=False),
                  cost=CostModel(dict(COST)))


# ----------------------------------------------------------------------------- the index


def test_the_latest_longest_occurrence_is_proposed_and_documents_do_not_run_into_each_other():
    index = SuffixIndex()
    index.add([1, 2, 3, 4, 5, 6, 7, 8])
    index.add([9, 9, 3, 4, 5, 40, 41])
    tokens, chances, age = index.propose([50, 2, 3, 4, 5], 10)
    assert tokens == [6, 7, 8]                      # 2 3 4 5 agrees longer with the first document
    assert age == 4 and chances[0] > 0.5
    tokens, _, _ = index.propose([9, 9, 3, 4, 5, 40], 10)
    assert tokens == [41]                           # and stops at its document's end
    assert index.propose([70, 71, 72], 5) == ([], [], 0)


def _occurrences(docs, tail):
    """Brute force: where each document holds `tail`, as positions of its last token in the index."""
    found, start = [], 0
    for doc in docs:
        for end in range(len(tail) - 1, len(doc) - 1):  # (something follows within the document)
            if doc[end - len(tail) + 1:end + 1] == tail:
                found.append(start + end)
        start += len(doc)
    return sorted(found, reverse=True)


def test_hashes_shared_by_other_ngrams_are_not_matches_in_the_sorted_part_or_the_recent_tail(monkeypatch):
    import localspec.engine.drafters.suffix_index as si

    # every n-gram's hash one of four: nearly every hash found belongs to other tokens
    monkeypatch.setattr(si, "_ngram_hashes", lambda tokens, n: np.array(
        [sum(int(t) for t in tokens[i:i + n]) % 4 for i in range(len(tokens) - n + 1)], dtype=np.uint64))
    monkeypatch.setattr(si, "_hash_of", lambda tokens: np.uint64(sum(int(t) for t in tokens) % 4))
    rng = np.random.default_rng(0)
    docs = [[int(t) for t in rng.integers(0, 6, 40)] for _ in range(6)]
    index = SuffixIndex()
    for doc in docs[:3]:
        index.append(np.array(doc))
    index._rebuild()  # the first three sorted, the rest in the tail
    for doc in docs[3:]:
        index.append(np.array(doc))
    assert index._sorted_upto == 120 and len(index._tail_keys[3]) == 3 * 38
    for context in ([1, 2, 3], [0, 0, 5, 4], [5, 5, 5, 5, 5, 5, 1]):
        n, positions = index.matches(context, most=1000)
        assert n and positions.tolist() == _occurrences(docs, context[-n:])
        longer = [level for level in index.levels if n < level <= len(context)]
        assert all(not _occurrences(docs, context[-level:]) for level in longer)


def test_continuations_are_voted_by_how_many_earlier_requests_went_that_way():
    index = SuffixIndex()
    for tail in ([10, 11], [10, 11], [10, 12]):
        index.add([5, 6, 7, 8, *tail, 99])
        index.add([1] * 20)  # another document between them: no document repeats the last one's start
    tokens, chances, _age = index.propose([0, 5, 6, 7, 8], 4)
    assert tokens[:2] == [10, 11]
    assert chances[0] == pytest.approx(1.0) and 0.5 < chances[1] < 1.0


def _voted_token_by_token(index, context, max_len, p_min=0.3):
    """`SuffixIndex.propose` as its rule reads: each next token the weighted vote of the occurrences
    still going, one token at a time."""
    n, positions = index.matches(context)
    if not n:
        return [], [], 0
    agree = index.agreeing(context, positions)
    docs = np.searchsorted(index.starts, positions, side="right")
    weight = agree * 0.98 ** (index.n_documents - docs).astype(float)
    ends = index._doc_end(positions)
    alive, tokens, chances = np.ones(len(positions), dtype=bool), [], []
    for i in range(max_len):
        going = [a and p + 1 + i < e for a, p, e in zip(alive, positions, ends)]
        total = sum(w for w, a in zip(weight, alive) if a)
        votes = Counter()
        for g, p, w in zip(going, positions, weight):
            if g:
                votes[int(index.tokens[p + 1 + i])] += w
        if not votes or total <= 0:
            break
        token, vote = max(sorted(votes.items()), key=lambda kv: kv[1])
        if vote / total < p_min:
            break
        tokens.append(token)
        chances.append(vote / total)
        alive = [g and int(index.tokens[p + 1 + i]) == token for g, p in zip(going, positions)]
    kept = [a for a, alive_here in zip(agree, alive) if alive_here]
    return tokens, chances, int(max(kept)) if tokens and kept else 0


def test_a_proposal_is_the_token_by_token_vote_of_the_occurrences_going_on():
    rng = np.random.default_rng(7)
    index = SuffixIndex()
    phrase = [int(t) for t in rng.integers(0, 40, 24)]
    for _ in range(30):  # documents sharing a phrase, parting from it at random, some ending inside it
        cut = int(rng.integers(4, len(phrase) + 1))
        index.add([int(t) for t in rng.integers(100, 140, 5)] + phrase[:cut]
                  + [int(t) for t in rng.integers(0, 40, int(rng.integers(0, 30)))])
    asked = 0
    for start in range(0, 12):
        for max_len in (1, 5, 63):
            context = [int(t) for t in rng.integers(100, 140, 3)] + phrase[start:start + 6]
            got, want = index.propose(context, max_len), _voted_token_by_token(index, context, max_len)
            assert got[0] == want[0] and got[2] == want[2]
            assert got[1] == pytest.approx(want[1])
            asked += bool(got[0])
    assert asked > 20  # (most contexts found the phrase)


def test_a_chat_growing_by_turns_is_stored_once():
    index = SuffixIndex()
    turn1 = list(range(100, 160))
    index.add(turn1)
    turn2 = turn1 + list(range(200, 230))
    stored = index.add(turn2)
    assert stored == 30 + SuffixIndex.overlap        # the new turn, with a little context before it
    assert index.add(turn2) == 0                     # the same request again adds nothing


def test_the_index_stays_within_its_bound():
    index = SuffixIndex(max_tokens=1000)
    rng = np.random.default_rng(0)
    for _ in range(40):
        index.add(rng.integers(0, 500, size=100).tolist())
    assert 0 < index.n_tokens <= 1000
    latest = index.tokens[-100:].tolist()
    assert index.propose(latest[:20], 5)[0] == latest[20:25]  # the latest request is still there


# ----------------------------------------------------------------------------- through the engine


def test_a_regenerated_answer_is_drafted_from_history_and_output_is_unchanged():
    engine = _engine()
    prompt = [0, 5, 9, 11]
    first = list(engine.generate(prompt, max_tokens=60))
    assert first[-1].drafted_by_drafter.get("history", 0) == 0  # nothing to draft from yet
    again = list(engine.generate(prompt, max_tokens=60))
    assert _tokens(again) == _tokens(first)
    summary = again[-1]
    assert isinstance(summary, Summary)
    assert summary.accepted_by_drafter["history"] >= len(_tokens(first)) // 2
    assert summary.rounds < len(_tokens(first)) // 2


def test_a_greedy_regeneration_replays_the_answer_where_a_batch_would_flip_a_near_tie():
    """The toy's verify batches move logits a little, as llama.cpp's batched kernels do: the first
    answer, decoded one token at a time, drafted back from the index and verified strictly parts from
    itself at a near tie; replayed as the recorded greedy answer to the same context, it is kept whole."""
    engine = Engine(ToyModel(seed=3, batch_noise=0.15), None, EngineOptions(drafter="auto", learn_costs=False),
                    cost=CostModel(dict(COST)))
    prompt = [0, 5, 9, 11]
    first = _tokens(engine.generate(prompt, max_tokens=60, drafter="none"))
    again = list(engine.generate(prompt, max_tokens=60))
    assert _tokens(again) == first
    summary = again[-1]
    assert summary.accepted_by_drafter["history"] >= len(first) - 5 and summary.rounds <= 5
    engine.drafter("history").answers.clear()   # the index alone: the same text, verified strictly
    assert _tokens(engine.generate(prompt, max_tokens=60)) != first


def test_a_replay_is_for_the_same_context_only_and_the_target_overrules_a_clear_mistake():
    engine = _engine(drafter="auto")
    prompt = [0, 5, 9, 11]
    first = _tokens(engine.generate(prompt, max_tokens=40))
    history = engine.drafter("history")
    (digest, recorded), = history.answers.items()
    wrong = recorded.copy()
    row = engine.target.logits_at(prompt + first[:10])
    wrong[10] = int(np.argmin(row))               # far below the target's choice there
    assert row.max() - row[wrong[10]] > REPLAY_TOLERANCE
    history.answers[digest] = wrong
    again = list(engine.generate(prompt, max_tokens=40))
    assert _tokens(again) == first
    assert any(isinstance(e, Round) and wrong[10] in e.rejected for e in again)
    corrected = history.answers[digest]            # the answer just given replaced the wrong record
    assert corrected[:len(first)].tolist() == first
    # Another context (one token more) is its own record; a sampled answer is none.
    list(engine.generate([*prompt, 7], max_tokens=10))
    list(engine.generate(prompt, max_tokens=10, sampling=SamplingSettings(temperature=1.0, seed=1)))
    assert len(history.answers) == 2 and history.answers[digest] is corrected


@pytest.mark.parametrize("drafter", ["auto", "history"])
def test_greedy_with_history_equals_plain_for_unrelated_and_related_prompts(drafter):
    engine, plain = _engine(drafter), _engine("none")
    for prompt in ([0, 5, 9, 11], [0, 7], [0, 5, 9, 12], [0, 20, 21, 22, 23, 20, 21, 22], [0, 7, 3]):
        assert _tokens(engine.generate(prompt, max_tokens=40)) == _tokens(plain.generate(prompt, max_tokens=40))


def test_sampling_with_history_drafts_reproduces_the_target_distribution():
    """Two-token continuations at temperature 1, drafted from a history that is right only sometimes."""
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    prompt = [0, 5, 6]
    toy = TWO_TOKEN_TOY
    exact = exact_two_tokens(prompt, **toy)
    engine = Engine(ToyModel(**toy), None, EngineOptions(drafter="history", learn_costs=False, draft_len=2),
                    cost=CostModel(dict(COST)))
    history = engine.drafter("history")
    history.recording = False
    history.index.add([0, 5, 6, 3, 2, 7])   # one earlier answer: a proposal for every request
    trials, counts, drafted, accepted = 8000, Counter(), 0, 0
    for seed in range(trials):
        events = list(engine.generate(prompt, max_tokens=2, sampling=settings.with_(seed=seed)))
        counts[tuple(_tokens(events)[:2])] += 1
        drafted += events[-1].drafted
        accepted += events[-1].accepted
    assert 0 < accepted < drafted  # the history is both right and wrong
    tv = 0.5 * sum(abs(counts.get(k, 0) / trials - v) for k, v in exact.items())
    assert tv < 0.06, tv


def test_history_off_means_no_history_drafter():
    engine = Engine(ToyModel(), None, EngineOptions(history_drafts=False, learn_costs=False), cost=CostModel(dict(COST)))
    assert "history" not in engine.drafters and engine.drafter("history") is None
    assert "history" in _engine().drafters


def test_every_registered_drafter_is_a_drafter_setting():
    from localspec.engine.contract import DRAFTER_HELP
    from localspec.engine.params import DRAFTER_SETTINGS

    assert [r.name for r in REGISTRY] == list(DRAFTER_SETTINGS[1:-1])
    assert all(r.name in DRAFTER_HELP for r in REGISTRY)


# ----------------------------------------------------------------------------- the file


def _drafter_with(tmp_path, docs):
    index = SuffixIndex()
    for d in docs:
        index.add(d)
    file = tmp_path / "history" / "model.npz"
    return HistoryDrafter(index, file, "model|1|256"), file


def test_the_index_survives_a_restart(tmp_path):
    drafter, file = _drafter_with(tmp_path, [list(range(10, 40))])
    drafter._dirty = True
    drafter.close()
    assert file.exists() and (file.stat().st_mode & 0o777) == 0o600
    index, warning = load_index(file, "model|1|256", 256)
    assert warning is None and index.propose(list(range(10, 20)), 5)[0] == [20, 21, 22, 23, 24]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign", "bad-ids"])
def test_a_corrupt_or_foreign_index_is_ignored_with_a_warning_and_rebuilt(tmp_path, damage):
    drafter, file = _drafter_with(tmp_path, [list(range(10, 40))])
    drafter._dirty = True
    drafter.save()
    if damage == "garbage":
        file.write_bytes(b"not an index at all")
    elif damage == "truncated":
        file.write_bytes(file.read_bytes()[:200])
    elif damage == "foreign":
        save_index(drafter.index, file, "another-model.gguf|5|256")
    else:
        save_index(drafter.index, file, "model|1|20")  # token ids beyond a 20-token vocabulary
    index, warning = load_index(file, "model|1|256" if damage != "bad-ids" else "model|1|20", 256 if damage != "bad-ids" else 20)
    assert index.n_tokens == 0 and warning and str(file) in warning
    rebuilt = HistoryDrafter(index, file, "model|1|256")
    rebuilt.record([1, 2, 3], list(range(50, 80)))
    rebuilt.close()
    again, warning = load_index(file, "model|1|256", 256)
    assert warning is None and again.n_tokens > 0


def test_an_engine_with_a_stored_history_warns_once_and_keeps_working(tmp_path):
    file = tmp_path / "h.npz"
    file.write_bytes(b"\x00" * 64)
    engine = Engine(ToyModel(), None, EngineOptions(learn_costs=False), cost=CostModel(dict(COST)), history_file=file)
    assert len(engine.warnings) == 1 and "Ignored the drafting history" in engine.warnings[0]
    events = list(engine.generate([0, 5, 9, 11], max_tokens=10))
    assert isinstance(events[-1], Summary) and any(isinstance(e, Round) for e in events)
    engine.close()
    assert load_index(file, model_key(None, ToyModel().n_vocab), ToyModel().n_vocab)[1] is None


def test_a_full_disk_is_a_warning_not_a_crash(tmp_path, monkeypatch):
    drafter, file = _drafter_with(tmp_path, [list(range(10, 40))])
    drafter._dirty = True

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    drafter.close()
    assert "No space left on device" in drafter.warning and not file.exists()
    assert not list(file.parent.glob("*.tmp"))


SAVER = """
import sys, time
from pathlib import Path
from localspec.engine.drafters.history import HistoryDrafter, load_index
file, start, go = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
index, warning = load_index(file, "model|1|256", 256)
drafter = HistoryDrafter(index, file, "model|1|256", warning, n_vocab=256)
drafter.record([1, 2, 3], list(range(start, start + 30)))
print("ready", flush=True)
while not go.exists():
    time.sleep(0.01)
drafter.close()
"""


def test_two_processes_saving_one_history_keep_both_requests(tmp_path):
    """A chat and a server on one target each keep the history index in memory: the one that saves
    last must not drop what the other saved (it merges the file's new requests in, under a lock)."""
    import subprocess
    import sys

    file, go = tmp_path / "history" / "model.npz", tmp_path / "go"
    early, _ = _drafter_with(tmp_path, [list(range(150, 180))])  # a request stored before both started
    early._dirty = True
    early.save()
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(file), str(start), str(go)], stdout=subprocess.PIPE,
                              text=True) for start in (10, 100)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"  # both read the file before either saved
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    index, warning = load_index(file, "model|1|256", 256)
    assert warning is None
    for start in (10, 100, 150):
        assert index.propose(list(range(start, start + 10)), 5)[0] == list(range(start + 10, start + 15)), start


def test_clearing_the_history_is_not_undone_by_the_stored_file(tmp_path):
    drafter, file = _drafter_with(tmp_path, [list(range(10, 40))])
    drafter._dirty = True
    drafter.save()
    other = HistoryDrafter(load_index(file, "model|1|256", 256)[0], file, "model|1|256", n_vocab=256)
    other.clear()
    other.record([1, 2, 3], list(range(100, 130)))
    other.save()
    index, _ = load_index(file, "model|1|256", 256)
    assert index.propose(list(range(10, 20)), 5)[0] == [] and index.propose(list(range(100, 110)), 3)[0] == [110, 111, 112]

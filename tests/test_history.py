import sqlite3

import pytest

from localspec.errors import LocalspecError
from localspec.history import MIGRATIONS, History


def test_fresh_database_runs_every_migration(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    assert history.version == len(MIGRATIONS)
    conv = history.create("First", model="pair-a", settings={"temperature": 0.5})
    history.add(conv.id, "user", "hi")
    history.add(conv.id, "assistant", "hello", status="cancelled", stats={"speedup": 1.5}, spans=[["accepted", "hel"]])
    msgs = history.messages(conv.id)
    assert [(m.role, m.content, m.status) for m in msgs] == [("user", "hi", "complete"), ("assistant", "hello", "cancelled")]
    assert msgs[1].stats == {"speedup": 1.5} and msgs[1].spans == [["accepted", "hel"]]
    assert history.get(conv.id).settings == {"temperature": 0.5}


def test_old_database_is_migrated_in_order_keeping_its_data(tmp_path):
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0] + "\nPRAGMA user_version = 1;")
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'user', 'kept', 1)")
    db.commit()
    db.close()
    history = History(path)
    assert history.version == len(MIGRATIONS)
    [msg] = history.messages(1)
    assert (msg.content, msg.status, msg.stats, msg.spans) == ("kept", "complete", None, None)


def test_newer_or_corrupt_database_is_a_clear_error(tmp_path):
    newer = tmp_path / "newer.sqlite3"
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    db.commit()
    db.close()
    with pytest.raises(LocalspecError, match="newer localspec"):
        History(newer)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LocalspecError, match="cannot be opened"):
        History(junk)
    assert junk.read_bytes().startswith(b"this is not")  # the user's file is left alone


def test_rename_delete_export_and_prompt_recall(tmp_path):
    history = History(tmp_path / "h.sqlite3")
    a = history.create("A")
    b = history.create("B")
    history.add(a.id, "user", "first question")
    history.add(a.id, "assistant", "first answer", stats={"one_line": "12 tokens, 1.5x"})
    history.add(b.id, "user", "second question")
    history.rename(a.id, "  Renamed\n title ")
    assert history.get(a.id).title == "Renamed title"
    md = history.to_markdown(a.id)
    assert md.startswith("# Renamed title") and "## You\n\nfirst question" in md and "> 12 tokens, 1.5x" in md
    assert history.prompts() == ["first question", "second question"]
    history.delete(a.id)
    assert [c.title for c in history.conversations()] == ["B"]
    assert history.db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (a.id,)).fetchone()[0] == 0


def test_images_are_kept_by_hash_and_go_with_the_last_conversation_that_shows_them(tmp_path):
    """An image's bytes live beside the history (by sha256), never in a row; deleting a conversation deletes
    the files only it referred to."""
    from localspec import paths
    from localspec.history import read_image, save_image

    history = History(tmp_path / "h.sqlite3")
    shared, own = save_image(b"shared image bytes"), save_image(b"own image bytes")
    assert save_image(b"shared image bytes") == shared  # (one file per content)
    a, b = history.create("A"), history.create("B")
    history.add(a.id, "user", "look", images=[{"sha256": shared, "name": "s.png"}, {"sha256": own, "name": "o.png"}])
    history.add(b.id, "user", "again", images=[{"sha256": shared, "name": "s.png"}])
    assert history.messages(a.id)[0].images == [{"sha256": shared, "name": "s.png"}, {"sha256": own, "name": "o.png"}]
    assert b"own image bytes" not in b"".join(row[0].encode() for row in history.db.execute("SELECT images FROM messages"))
    history.delete(a.id)
    assert read_image(own) is None and read_image(shared) == b"shared image bytes"
    history.delete(b.id)
    assert read_image(shared) is None and not any(paths.images_dir().iterdir())


def test_an_answers_summary_comes_back_typed_from_the_history(tmp_path):
    """The TUI reads stored answers as the engine's Summary (no dictionaries of statistics past the
    history): what `Summary.stored` keeps comes back equal, an older row missing fields gets their
    defaults, and a failed answer has its error and no summary."""
    from localspec.engine.events import Summary

    summary = Summary(text="hi", stop_reason="eog", prompt_tokens=9, prompt_evaluated=4, prompt_s=0.2,
                      generated_tokens=2, wall_s=0.1, tokens_per_s=20.0, rounds=1, drafted=3, accepted=1,
                      acceptance_rate=1 / 3, mean_accepted_per_round=1.0, acceptance_by_position=(1.0, 0.0),
                      drafted_by_position=(1, 1), draft_s=0.01, verify_s=0.05, baseline_tokens_per_s=15.0,
                      speedup=1.3, drafter="auto", rounds_by_drafter={"ngram": 1}, kept_by_position=(1, 0),
                      baseline_measured=True)
    history = History(tmp_path / "h.db")
    conv = history.create("t")
    history.add(conv.id, "user", "hello")
    history.add(conv.id, "assistant", "hi", stats=summary.stored())
    history.add(conv.id, "assistant", "old", stats={"generated_tokens": 5, "speedup": 1.5, "drafted_by_position": [2]})
    history.add(conv.id, "assistant", "", status="error", stats={"error": "The KV cache is full"})
    user, answer, old, failed = history.messages(conv.id)
    assert user.summary is None and answer.summary == summary and answer.error is None
    assert old.summary is not None and old.summary.generated_tokens == 5 and old.summary.drafted_by_position == (2,)
    assert old.summary.kept_by_position == () and old.summary.stop_reason == "" and old.summary.rounds_by_drafter == {}
    assert failed.summary is None and failed.error == "The KV cache is full"

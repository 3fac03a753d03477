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

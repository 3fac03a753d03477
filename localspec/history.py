"""Conversations in SQLite (stdlib sqlite3) under the user data dir, with ordered migrations.

Each migration runs once, in order, inside a transaction; `PRAGMA user_version` records how many ran.
Add new ones at the end of MIGRATIONS; never edit one that has shipped.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from localspec import paths
from localspec.engine.events import Summary
from localspec.errors import LocalspecError

MIGRATIONS: list[str] = [
    # 1: conversations and their messages
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        model TEXT,
        settings TEXT NOT NULL DEFAULT '{}',
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        created REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    # 2: how an answer ended, its speculative statistics, and its accepted/rejected spans
    """
    ALTER TABLE messages ADD COLUMN status TEXT NOT NULL DEFAULT 'complete';
    ALTER TABLE messages ADD COLUMN stats TEXT;
    ALTER TABLE messages ADD COLUMN spans TEXT;
    """,
    # 3: the images a prompt carries, by content hash ([{"sha256", "name"}]; the bytes under images_dir)
    """
    ALTER TABLE messages ADD COLUMN images TEXT;
    """,
]

# An answer is saved as "streaming" while it is written (about once a second); one still "streaming" when
# the history is opened again was cut off (the app killed, the terminal closed) and becomes "interrupted".
STATUSES = ("complete", "cancelled", "error", "streaming", "interrupted")


@dataclass(frozen=True)
class ConversationRow:
    id: int
    title: str
    model: str | None
    settings: dict
    created: float
    updated: float


@dataclass(frozen=True)
class MessageRow:
    id: int
    conversation_id: int
    role: str
    content: str
    status: str
    stats: dict | None
    spans: list | None      # [[kind, text], ...] with kind in accepted | rejected | target
    created: float
    images: list | None = None  # [{"sha256": ..., "name": ...}, ...]: a prompt's images (read_image)

    @property
    def summary(self) -> Summary | None:
        """An answer's statistics as the engine reported them (None: a prompt, or an answer that failed)."""
        return Summary.from_stored(self.stats, self.content) if self.role == "assistant" else None

    @property
    def error(self) -> str | None:
        """Why an answer failed, if it did."""
        if self.status != "error" or not self.stats or not self.stats.get("error"):
            return None
        return str(self.stats["error"])


class History:
    def __init__(self, path: Path | None = None):
        self.path = path or paths.history_db()
        paths.ensure(self.path.parent)
        try:
            self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA foreign_keys = ON")
            self.db.execute("PRAGMA journal_mode = WAL")
            self.migrate()
        except sqlite3.DatabaseError as exc:
            raise LocalspecError(f"The chat history {self.path} cannot be opened: {exc}. "
                                 "Move it aside to start a fresh one.") from None

    # ------------------------------------------------------------------ schema

    @property
    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        current = self.version
        if current > len(MIGRATIONS):
            raise LocalspecError(f"{self.path} was written by a newer localspec (schema {current}); upgrade localspec.")
        for number, script in enumerate(MIGRATIONS[current:], current + 1):
            # executescript commits first; wrap each migration so a failure leaves the previous version.
            self.db.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ conversations

    def create(self, title: str = "New chat", model: str | None = None, settings: dict | None = None) -> ConversationRow:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO conversations (title, model, settings, created, updated) VALUES (?, ?, ?, ?, ?)",
            (title, model, json.dumps(settings or {}), now, now),
        )
        assert cur.lastrowid is not None
        return self.get(cur.lastrowid)

    def get(self, conversation_id: int) -> ConversationRow:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise LocalspecError(f"No conversation {conversation_id}.")
        return _conversation(row)

    def conversations(self) -> list[ConversationRow]:
        rows = self.db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [_conversation(r) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        title = " ".join(title.split())[:120] or "Untitled"
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def update(self, conversation_id: int, *, model: str | None = None, settings: dict | None = None) -> None:
        if model is not None:
            self.db.execute("UPDATE conversations SET model = ? WHERE id = ?", (model, conversation_id))
        if settings is not None:
            self.db.execute("UPDATE conversations SET settings = ? WHERE id = ?", (json.dumps(settings), conversation_id))

    def delete(self, conversation_id: int) -> None:
        """The conversation and its messages; its images' files too, where no other message refers to them."""
        held = self._images(conversation_id)
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        for digest in held - self._images():
            (paths.images_dir() / digest).unlink(missing_ok=True)

    def _images(self, conversation_id: int | None = None) -> set[str]:
        """The hashes of the images messages refer to (one conversation's, or all)."""
        where = "" if conversation_id is None else " AND conversation_id = ?"
        rows = self.db.execute(f"SELECT images FROM messages WHERE images IS NOT NULL{where}",
                               () if conversation_id is None else (conversation_id,)).fetchall()
        return {ref["sha256"] for (text,) in rows for ref in _load(text) or () if isinstance(ref, dict) and "sha256" in ref}

    # ------------------------------------------------------------------ messages

    def add(self, conversation_id: int, role: str, content: str, *, status: str = "complete",
            stats: dict | None = None, spans: list | None = None, images: list | None = None) -> MessageRow:
        if status not in STATUSES:
            raise ValueError(status)
        now = time.time()
        self.db.execute("BEGIN")  # autocommit connection: make the message and the timestamp one change
        try:
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, stats, spans, created, images) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, status, _dump(stats), _dump(spans), now, _dump(images or None)),
            )
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        row = self.db.execute("SELECT * FROM messages WHERE id = ?", (cur.lastrowid,)).fetchone()
        return _message(row)

    def update_message(self, message_id: int, content: str, *, status: str, stats: dict | None = None,
                       spans: list | None = None) -> None:
        """Write a message again: an answer as it streams, then as it ended."""
        if status not in STATUSES:
            raise ValueError(status)
        self.db.execute("UPDATE messages SET content = ?, status = ?, stats = ?, spans = ? WHERE id = ?",
                        (content, status, _dump(stats), _dump(spans), message_id))

    def mark_interrupted(self) -> int:
        """Answers left "streaming" by a process that ended mid-answer become "interrupted"; how many."""
        return self.db.execute("UPDATE messages SET status = 'interrupted' WHERE status = 'streaming'").rowcount

    def messages(self, conversation_id: int) -> list[MessageRow]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
        return [_message(r) for r in rows]

    def prompts(self, limit: int = 200) -> list[str]:
        """The user's earlier prompts, oldest first, across conversations (for recall with ↑)."""
        rows = self.db.execute(
            "SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [r[0] for r in reversed(rows)]

    # ------------------------------------------------------------------ export

    def to_markdown(self, conversation_id: int) -> str:
        conv = self.get(conversation_id)
        lines = [f"# {conv.title}", ""]
        if conv.model:
            lines += [f"*Model: {conv.model}*", ""]
        for m in self.messages(conversation_id):
            heading = {"user": "You", "assistant": "Assistant", "system": "System"}[m.role]
            note = {"cancelled": " (cancelled)", "error": " (failed)", "interrupted": " (interrupted)"}.get(m.status, "")
            lines += [f"## {heading}{note}", "", m.content.rstrip(), ""]
            if m.stats and m.stats.get("one_line"):
                lines += [f"> {m.stats['one_line']}", ""]
        return "\n".join(lines).rstrip() + "\n"


def _dump(value) -> str | None:
    return None if value is None else json.dumps(value)


def _load(text: str | None):
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _conversation(row) -> ConversationRow:
    settings = _load(row[3])
    return ConversationRow(id=row[0], title=row[1], model=row[2], settings=settings if isinstance(settings, dict) else {},
                           created=row[4], updated=row[5])


def _message(row) -> MessageRow:
    # Column order: the table's, then columns added by later migrations.
    return MessageRow(id=row[0], conversation_id=row[1], role=row[2], content=row[3], created=row[4],
                      status=row[5], stats=_load(row[6]), spans=_load(row[7]), images=_load(row[8]))


def save_image(data: bytes) -> str:
    """Keep an attached image under images_dir by its sha256 (written once, atomically); its hash."""
    digest = hashlib.sha256(data).hexdigest()
    path = paths.ensure(paths.images_dir()) / digest
    if not path.exists():
        partial = path.with_name(digest + ".partial")
        partial.write_bytes(data)
        partial.replace(path)
    return digest


def read_image(digest: str) -> bytes | None:
    """An attached image by its hash; None once its file is gone."""
    try:
        return (paths.images_dir() / digest).read_bytes()
    except OSError:
        return None

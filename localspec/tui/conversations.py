"""The chat's conversations, their settings and their turns: everything the chat app does that is
not drawing. Works on the history (SQLite) and the user's config only; tests drive it without a screen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from localspec.config import ChatSettings, UserConfig
from localspec.engine.contract import ChatEngine
from localspec.engine.session import with_images, with_system
from localspec.history import ConversationRow, History, MessageRow, read_image, save_image

NEW_TITLE = "New chat"


@dataclass
class LoadedModel:
    """The model the chat talks to: the app loads and sets it, the chat screen reads it."""
    engine: ChatEngine | None = None
    entry_id: str | None = None
    loading: str | None = None  # the id being loaded, until it is ready or fails


class Conversations:
    def __init__(self, history: History, config: UserConfig, drafter_override: str | None = None):
        self.history = history
        self.config = config
        self.drafter_override = drafter_override
        self.current: ConversationRow | None = None
        self.settings = ChatSettings()
        self.answer_id: int | None = None  # the answer being written, saved as it streams
        history.mark_interrupted()

    # ------------------------------------------------------------------ which conversation

    def new_settings(self) -> ChatSettings:
        """What a new conversation starts with: the user's settings, and `--drafter` if given."""
        settings = self.config.chat
        if self.drafter_override:
            settings = ChatSettings.from_dict({"drafter": self.drafter_override}, base=settings)
        return settings

    def most_recent(self, model: str | None = None) -> ConversationRow:
        """The latest conversation, or a new one when there is none."""
        rows = self.history.conversations()
        return rows[0] if rows else self.create(model)

    def create(self, model: str | None = None) -> ConversationRow:
        return self.history.create(NEW_TITLE, model=model, settings=self.new_settings().to_dict())

    def open(self, conversation_id: int, apply_override: bool = False) -> list[MessageRow]:
        """Make it current (with its own settings; `--drafter` overrides them on start) and return its turns."""
        self.current = self.history.get(conversation_id)
        self.settings = ChatSettings.from_dict(self.current.settings, base=self.config.chat)
        if apply_override and self.drafter_override:
            self.save_settings(ChatSettings.from_dict({"drafter": self.drafter_override}, base=self.settings))
        return self.history.messages(conversation_id)

    def _reload(self) -> None:
        assert self.current is not None
        self.current = self.history.get(self.current.id)

    # ------------------------------------------------------------------ changes

    def rename(self, title: str) -> None:
        assert self.current is not None
        self.history.rename(self.current.id, title)
        self._reload()

    def delete_current(self, model: str | None) -> ConversationRow:
        """Delete the current conversation; returns the one to show next (a new one if none is left)."""
        assert self.current is not None
        self.history.delete(self.current.id)
        self.current = None
        return self.most_recent(model)

    def save_settings(self, settings: ChatSettings) -> None:
        assert self.current is not None
        self.settings = settings
        self.history.update(self.current.id, settings=settings.to_dict())

    def set_model(self, model: str) -> None:
        if self.current is not None:
            self.history.update(self.current.id, model=model)

    def add_prompt(self, text: str, images: Sequence[tuple[str, bytes]] = ()) -> None:
        """The user's turn, with its images as (name, bytes) (kept by content hash beside the history); a new
        conversation takes its title from the prompt's first line."""
        assert self.current is not None
        refs = [{"sha256": save_image(data), "name": name} for name, data in images]
        self.history.add(self.current.id, "user", text, images=refs)
        if self.current.title == NEW_TITLE:
            self.history.rename(self.current.id, text.splitlines()[0][:48])
        self._reload()

    def start_answer(self) -> None:
        """An empty answer, saved as "streaming" until `finish_answer`: a crash leaves what was saved."""
        assert self.current is not None
        self.answer_id = self.history.add(self.current.id, "assistant", "", status="streaming", spans=[]).id

    def save_partial(self, text: str, spans: list) -> None:
        """The answer so far (called about once a second while it streams)."""
        if self.answer_id is not None:
            self.history.update_message(self.answer_id, text, status="streaming", spans=[list(s) for s in spans])

    def finish_answer(self, text: str, status: str, stats: dict, spans: list) -> None:
        """The answer as it ended (complete, cancelled or error), in place of what was saved as it streamed."""
        assert self.answer_id is not None, "finish_answer without start_answer"
        self.history.update_message(self.answer_id, text, status=status, stats=stats, spans=[list(s) for s in spans])
        self.answer_id = None

    # ------------------------------------------------------------------ reading

    def context_messages(self) -> list[dict]:
        """System prompt and the turns so far; a prompt whose answer failed is left out with it."""
        assert self.current is not None
        rows = self.history.messages(self.current.id)
        turns = []
        for i, row in enumerate(rows):
            failed_answer = i + 1 < len(rows) and rows[i + 1].role == "assistant" and rows[i + 1].status == "error"
            if (row.role == "user" and failed_answer) or (row.role == "assistant" and row.status == "error"):
                continue
            pictures = [data for ref in row.images or () if (data := read_image(ref["sha256"])) is not None]
            turns.append(with_images({"role": row.role, "content": row.content}, pictures))
        return with_system(self.settings.system, turns)

    def settings_label(self) -> str:
        s = self.settings
        length = "adaptive" if s.draft_len is None else f"fixed {s.draft_len}"
        temp = "greedy" if s.temperature == 0 else f"T={s.temperature:g}"
        return f"{s.drafter}, {length}, {temp}" + (", JSON" if s.output == "json" else "")

    def export(self, folder: Path) -> Path:
        """The conversation as Markdown in `folder`, under a name no earlier export has (never overwrites).
        Raises OSError when it cannot be written."""
        assert self.current is not None
        text = self.history.to_markdown(self.current.id)
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.current.title).strip("-").lower()[:40] or "conversation"
        path = folder / f"localspec-{slug}.md"
        n = 2
        while path.exists():
            path = folder / f"localspec-{slug}-{n}.md"
            n += 1
        path.write_text(text)
        return path

"""The chat screen: the conversation list, the answer log with the prompt, and the statistics panel.

It draws and routes the keys of a conversation; the conversations themselves live in
`Conversations`, the engine (and loading it) in the app.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from localspec.config import ChatSettings
from localspec.engine.contract import unavailable_drafter
from localspec.engine.events import Summary
from localspec.engine.params import DRAFTER_SETTINGS
from localspec.engine.session import MAX_IMAGE_BYTES
from localspec.tui.compositor import DrawnRowsCompositor
from localspec.tui.conversations import Conversations, LoadedModel
from localspec.tui.panel import StatsPanel
from localspec.tui.screens import AttachScreen, ConfirmScreen, DetailsScreen, RenameScreen, SettingsScreen
from localspec.tui.widgets import (FRAME_S, AssistantMessage, ChatLog, ConversationList, PromptInput, SummaryLine,
                                   image_chips)

CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)
SAVE_EVERY_S = 1.0  # a streaming answer is saved this often: what a crash can lose


class ChatScreen(Screen):
    """Reads the conversations and the loaded model it is given; asks the app for the rest by message."""

    # Priority: the prompt (a TextArea) has focus nearly always and would take these keys. A dialog on
    # top is another screen, so these never stack dialogs on dialogs.
    BINDINGS = [
        Binding("escape", "cancel", "Stop answer"),
        Binding("ctrl+s", "settings", "Settings", priority=True),
        Binding("ctrl+n", "new_conversation", "New chat", priority=True),
        Binding("ctrl+b", "toggle_sidebar", "Chats", priority=True),
        Binding("ctrl+t", "toggle_rejected", "Rejected", priority=True),
        Binding("f2", "attach_image", "Image", priority=True, show=False),
        Binding("ctrl+y", "copy_answer", "Copy answer", priority=True, show=False),
        Binding("ctrl+g", "copy_code", "Copy code", priority=True, show=False),
    ]

    @dataclass
    class OpenModel(Message):
        """Load this model (None: the first pulled pair, or the default)."""
        entry_id: str | None

    @dataclass
    class AnswerFinished(Message):
        """An answer ended (complete, stopped or failed) and is in the history."""

    def __init__(self, chats: Conversations, model: LoadedModel, requested: str | None = None,
                 run_engine: Callable[..., None] = lambda fn, *args: fn(*args)) -> None:
        """`requested`: the model to open first (`chat MODEL`); else the conversation's, else the user's.
        `run_engine(fn, *args)` runs an answer's engine calls where the app keeps its engine."""
        super().__init__()
        if DrawnRowsCompositor.fits():  # a streaming frame draws a few rows; Textual's renders whole widgets
            self._compositor = DrawnRowsCompositor()
        self.chats, self.model, self._requested = chats, model, requested
        self.run_engine = run_engine
        self.generating = False
        self.pending: str | None = None  # a message sent while the model loads, sent once it is ready
        self.attached: list[tuple[str, bytes]] = []  # images (name, bytes) for the next message
        self.cancel = threading.Event()
        self.worker_done = threading.Event()
        self.worker_done.set()
        self._saved_at = 0.0

    def stop_answer(self) -> None:
        """Ask the worker to end the answer after its round (the partial answer is kept)."""
        self.cancel.set()

    def wait_for_worker(self, timeout: float) -> bool:
        """True once no decode runs in the worker thread (the models may then be freed)."""
        return self.worker_done.wait(timeout)

    def compose(self):
        yield Header()
        with Horizontal(id="body"):
            yield ConversationList(id="sidebar")
            with Vertical(id="main"):
                yield ChatLog(id="log")
                yield Static("", id="attachments")
                yield PromptInput(id="prompt", placeholder="Message (Enter sends, Shift+Enter/Ctrl+J new line, ? keys)")
            yield StatsPanel(id="stats")
        yield Footer()

    @property
    def log_view(self) -> ChatLog:
        return self.query_one("#log", ChatLog)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def stats(self) -> StatsPanel:
        return self.query_one("#stats", StatsPanel)

    async def on_mount(self) -> None:
        self._frames = self.set_interval(FRAME_S, self._frame, pause=True)
        self.prompt.recall = self.chats.history.prompts()
        conversation = self.chats.most_recent()
        await self.open_conversation(conversation.id, apply_override=True)
        self.prompt.focus()
        self.post_message(self.OpenModel(self._requested or conversation.model or self.chats.config.model))

    def _busy(self) -> bool:
        if self.generating:
            self.notify("Stop the answer first (Esc).", severity="warning")
        return self.generating

    # ------------------------------------------------------------------ conversations

    async def open_conversation(self, conversation_id: int, apply_override: bool = False) -> None:
        if self.pending is not None:  # a message waiting for the model stays in the prompt, unsent
            self.prompt.load_text(self.pending)
            self.pending = None
        rows = self.chats.open(conversation_id, apply_override)
        self._show_settings()
        await self.log_view.show_conversation(rows)
        answered = [summary for row in rows if (summary := row.summary) is not None]
        if answered:
            self.stats.show_stored(answered[-1])
        self.refresh_sidebar()

    def refresh_sidebar(self) -> None:
        current = self.chats.current.id if self.chats.current else None
        self.query_one("#sidebar", ConversationList).set_items(self.chats.history.conversations(), current)

    def _show_settings(self) -> None:
        self.stats.drafter_label = self.chats.settings_label()
        self.stats.refresh_numbers()

    @on(ConversationList.Picked)
    async def _switch(self, message: ConversationList.Picked) -> None:
        if self.chats.current and message.conversation_id == self.chats.current.id:
            return
        if self._busy():
            self.refresh_sidebar()
            return
        await self.open_conversation(message.conversation_id)

    async def action_new_conversation(self) -> None:
        if not self._busy():
            await self.open_conversation(self.chats.create(self.model.entry_id).id)
            self.prompt.focus()

    def action_rename_conversation(self) -> None:
        def done(title: str | None) -> None:
            if title:
                self.chats.rename(title)
                self.refresh_sidebar()

        if self.chats.current is not None:
            self.app.push_screen(RenameScreen(self.chats.current.title), done)

    def action_delete_conversation(self) -> None:
        if self.chats.current is None or self.generating:
            return
        title = self.chats.current.title

        async def done(yes: bool | None) -> None:
            if yes:
                await self.open_conversation(self.chats.delete_current(self.model.entry_id).id)
                self.notify(f"Deleted “{title}”.", timeout=3)

        self.app.push_screen(ConfirmScreen(f"Delete the conversation “{title}” and all its messages?"), done)

    def action_export_conversation(self) -> None:
        if self.chats.current is None:
            return
        try:
            path = self.chats.export(Path.cwd())
        except OSError as exc:
            self.notify(f"Could not write the export: {exc.strerror or exc}", title="Export failed", severity="error")
            return
        self.notify(f"Exported to {path}", title="Exported", timeout=6)

    def action_toggle_sidebar(self) -> None:
        self.toggle_class("-flip")

    def action_settings(self) -> None:
        def done(settings: ChatSettings | None) -> None:
            if settings is not None and self.chats.current is not None:
                self.chats.save_settings(settings)
                self._show_settings()
                self.notify("Settings saved for this conversation.", timeout=3)

        engine = self.model.engine
        self.app.push_screen(SettingsScreen(self.chats.settings, engine.drafters if engine else DRAFTER_SETTINGS), done)

    # ------------------------------------------------------------------ generation

    def action_attach_image(self) -> None:
        def done(path: str | None) -> None:
            if path is not None:
                self.attach(path)

        self.app.push_screen(AttachScreen(), done)

    def attach(self, path: str) -> None:
        """An image for the next message, read now (an empty path drops the attached ones)."""
        if not path:
            self.attached = []
        else:
            file = Path(path).expanduser()
            try:
                if file.stat().st_size > MAX_IMAGE_BYTES:
                    raise OSError(f"larger than {MAX_IMAGE_BYTES >> 20} MB")
                self.attached.append((file.name, file.read_bytes()))
            except OSError as exc:
                self.notify(f"Cannot attach {file}: {exc.strerror or exc}", severity="error")
                return
        chips = self.query_one("#attachments", Static)
        names = [name for name, _data in self.attached]
        chips.update(image_chips(names) + "  (F2 with an empty path drops them)" if names else "")
        chips.display = bool(self.attached)

    def _blind(self) -> bool:
        """Images are attached but the model cannot see them: say so, send nothing."""
        engine = self.model.engine
        if not self.attached or engine is None or engine.sees_images:
            return False
        self.notify(f"{self.model.entry_id} cannot see images: load it with its projector (chat --mmproj PATH), "
                    "or drop them (F2, empty path).", severity="error", title="Images not sent")
        return True

    @on(PromptInput.Submitted)
    async def _send(self, message: PromptInput.Submitted) -> None:
        command, _, path = message.text.partition(" ")
        if command == "/image":  # /image PATH: attach, as F2 does
            self.prompt.clear()
            self.attach(path.strip())
            return
        if self.generating or self.pending is not None:
            self.notify("An answer is still streaming; Esc stops it." if self.generating else
                        "A message is already waiting for the model.", severity="warning")
            return
        if self.model.engine is None:
            if not self.model.loading:
                self.notify("No model is loaded: Ctrl+O picks one.", severity="warning")
                return
            self.pending = message.text
            self.prompt.clear()
            self.prompt.remember(message.text)
            await self.log_view.show_waiting(message.text, [name for name, _data in self.attached])
            self.notify(f"Sent once {self.model.loading} is loaded.", timeout=3)
            return
        await self._ask(message.text)

    async def model_ready(self) -> None:
        """The app loaded a model: a message that waited for it goes now."""
        if (text := await self._take_pending()) is not None:
            await self._ask(text, remembered=True)

    async def model_failed(self) -> None:
        """The model did not load: a message that waited for it goes back into the prompt, unsent."""
        if (text := await self._take_pending()) is not None:
            self.prompt.load_text(text)

    async def _take_pending(self) -> str | None:
        text, self.pending = self.pending, None
        if text is not None:
            await self.log_view.drop_waiting()
        return text

    async def _ask(self, text: str, remembered: bool = False) -> None:
        engine = self.model.engine
        assert engine is not None
        problem = unavailable_drafter(self.chats.settings.drafter, engine.drafters)
        if self._blind():
            if remembered:
                self.prompt.load_text(text)
            return
        if problem:
            self.notify(f"{self.model.entry_id}: {problem} Ctrl+S changes the drafter.", severity="error",
                        title="Drafter not available")
            if remembered:
                self.prompt.load_text(text)
            return
        self.generating = True  # from here on: a second Enter must not send while this one is set up
        if not remembered:
            self.prompt.clear()
            self.prompt.remember(text)
        images, self.attached = self.attached, []
        self.attach("")  # (the chips go: the message carries them now)
        self.chats.add_prompt(text, images)
        messages = self.chats.context_messages()
        self.chats.start_answer()
        self._saved_at = time.monotonic()
        self.refresh_sidebar()
        await self.log_view.start_answer(text, [name for name, _data in images])
        s = self.chats.settings
        options = {"max_tokens": s.max_tokens, "sampling": s.sampling(), "drafter": s.drafter, "draft_len": s.draft_len}
        self.log_view.inbox.clear()
        self.cancel.set()  # what the engine put off after the last answer (on its one thread) stops for this one
        self.cancel, self.worker_done = threading.Event(), threading.Event()
        self.stats.start(engine.baseline_tokens_per_s or self.stats.baseline)
        self.prompt.cursor_blink = False  # a blink is a repaint of its own, between the frames
        self._frames.resume()
        self.log_view.generate(engine, messages, options, self.cancel, self.worker_done, run_on=self.run_engine)

    @on(ChatLog.Streamed)
    async def _streamed(self) -> None:
        await self._take_events()

    async def _take_events(self) -> None:
        """The events the engine left since the last look, in order; the answer ends with its summary."""
        inbox = self.log_view.inbox
        while inbox and self.generating:
            event = inbox.popleft()
            self.log_view.add(event)
            self.stats.add(event)
            if isinstance(event, Summary):
                status = "cancelled" if event.stop_reason == "cancelled" else "complete"
                await self._finish(event.text, status, event)

    async def _frame(self) -> None:
        """Every FRAME_S while an answer streams: what the rounds since the last frame changed, drawn at
        once; the answer saved now and then."""
        await self._take_events()
        if not self.generating:
            return
        self._draw()
        answer, now = self.log_view.current, time.monotonic()
        if answer is not None and now - self._saved_at >= SAVE_EVERY_S:
            self._saved_at = now
            self.chats.save_partial(answer.text, answer.spans)

    def _draw(self) -> None:
        self.log_view.draw()
        self.stats.draw()

    @on(ChatLog.Maintained)
    def _maintained(self, message: ChatLog.Maintained) -> None:
        self.notify(message.what[0].upper() + message.what[1:] + ".", timeout=6)

    @on(ChatLog.Failed)
    async def _failed(self, message: ChatLog.Failed) -> None:
        await self._take_events()  # the rounds before the failure belong to the partial answer
        answer = self.log_view.current
        await self._finish(answer.text if answer else "", "error", None, message.error)
        self.notify(message.error, title="The answer failed", severity="error", timeout=15)

    async def _finish(self, text: str, status: str, summary: Summary | None, error: str | None = None) -> None:
        self._frames.pause()
        self.prompt.cursor_blink = True
        self._draw()
        answer, following = self.log_view.current, self.log_view.following
        stored = summary.stored() if summary is not None else {"error": error} if error else {}
        self.chats.finish_answer(text, status, stored, answer.spans if answer else [])
        if answer is not None:
            answer.content = text
            await answer.finish(summary, status, error)
        self.log_view.current = None
        self.log_view.answer_shown(following)
        self.generating = False
        self.post_message(self.AnswerFinished())

    def action_cancel(self) -> None:
        if self.generating and not self.cancel.is_set():
            self.cancel.set()
            self.notify("Stopping after this round…", timeout=2)

    # ------------------------------------------------------------------ the rest

    def action_toggle_rejected(self) -> None:
        shown = self.log_view.toggle_rejected()
        self.notify("Rejected draft tokens " + ("shown" if shown else "hidden"), timeout=2)

    def action_copy_answer(self) -> None:
        text = self.log_view.last_answer()
        if not text:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied the last answer ({len(text)} characters).", timeout=3)

    def action_copy_code(self) -> None:
        blocks = CODE_BLOCK.findall(self.log_view.last_answer() or "")
        if not blocks:
            self.notify("The last answer has no code block.", severity="warning")
            return
        self.app.copy_to_clipboard(blocks[-1])
        self.notify(f"Copied the last code block ({len(blocks[-1].splitlines())} lines).", timeout=3)

    @on(PromptInput.HelpRequested)
    async def _help(self) -> None:
        await self.app.run_action("help")

    @on(SummaryLine.Opened)
    def _details(self, message: SummaryLine.Opened) -> None:
        answer = message.line.parent
        if isinstance(answer, AssistantMessage):
            self.app.push_screen(DetailsScreen(answer.summary, answer.error, answer.spans, answer.text))

    def commands(self):
        """(title, help, action) for the command palette."""
        return (
            ("New conversation", "Start an empty conversation", self.action_new_conversation),
            ("Rename conversation", "Give this conversation a title", self.action_rename_conversation),
            ("Delete conversation", "Delete this conversation and its messages", self.action_delete_conversation),
            ("Export conversation", "Write it to a Markdown file in the current folder",
             self.action_export_conversation),
            ("Settings", "Drafter, draft length, sampling, system prompt", self.action_settings),
            ("Toggle rejected tokens", "Show or hide rejected draft tokens", self.action_toggle_rejected),
            ("Attach image", "An image for the next message (the model needs its projector); also /image PATH",
             self.action_attach_image),
            ("Copy last answer", "To the clipboard", self.action_copy_answer),
            ("Copy last code block", "To the clipboard", self.action_copy_code),
        )


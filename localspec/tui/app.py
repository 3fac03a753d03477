"""`localspec chat`: talk to a local model and watch speculative decoding work.

`create_app` is the one way to build the app, for the CLI and the tests alike.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Header, Static

from localspec.config import ChatSettings, UserConfig, load_user_config
from localspec.errors import LocalspecError
from localspec.history import History, MessageRow
from localspec.tui.provider import LocalProvider
from localspec.tui.screens import (ConfirmScreen, DetailsScreen, HelpScreen, ModelPicker, RenameScreen,
                                   SettingsScreen)
from localspec.tui.widgets import (AssistantMessage, ChatLog, ConversationList, PromptInput, StatsPanel,
                                   SummaryLine, UserMessage)

NEW_TITLE = "New chat"
WELCOME = (
    "Ask anything. While the answer streams, [$text-success]green[/] text is draft tokens the target model "
    "accepted (nearly free), plain text is what the target produced itself, and "
    "[$text-error strike dim]struck-through[/] text is draft the target rejected. "
    "The panel on the right shows what that bought over plain decoding. Press [b]?[/b] for keys."
)
CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)


class ChatApp(App):
    CSS_PATH = "chat.tcss"
    TITLE = "localspec"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    BINDINGS = [
        Binding("ctrl+c", "quit", "Quit", priority=True),
        Binding("escape", "cancel", "Stop answer"),
        Binding("f1", "help", "Keys"),
        Binding("ctrl+s", "settings", "Settings", priority=True),
        Binding("ctrl+o", "pick_model", "Model", priority=True),
        Binding("ctrl+n", "new_conversation", "New chat", priority=True),
        Binding("ctrl+b", "toggle_sidebar", "Chats", priority=True),
        Binding("ctrl+t", "toggle_rejected", "Rejected", priority=True),
        Binding("ctrl+y", "copy_answer", "Copy answer", priority=True, show=False),
        Binding("ctrl+g", "copy_code", "Copy code", priority=True, show=False),
    ]

    @dataclass
    class EngineReady(Message):
        entry_id: str
        engine: object

    @dataclass
    class EngineFailed(Message):
        entry_id: str
        error: str

    def __init__(self, provider, *, entry_id: str | None = None, drafter: str | None = None,
                 history: History | None = None, config: UserConfig | None = None):
        super().__init__()
        self.provider = provider
        self.requested = entry_id
        self.drafter_override = drafter
        self._history = history
        self.config = config or UserConfig()
        self.engine = None
        self.engine_id: str | None = None
        self.loading: str | None = None
        self.conversation = None
        self.settings = ChatSettings()
        self.generating = False
        self.cancel = threading.Event()
        self.worker_done = threading.Event()
        self.worker_done.set()
        self.show_rejected = True
        self.baseline = 0.0
        self._quitting = False

    # ------------------------------------------------------------------ layout

    def compose(self):
        yield Header()
        with Horizontal(id="body"):
            yield ConversationList(id="sidebar")
            with Vertical(id="main"):
                yield ChatLog(id="log")
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
        self.history = self._history or History()
        self.prompt.recall = self.history.prompts()
        rows = self.history.conversations()
        conversation = rows[0] if rows else self.history.create(NEW_TITLE, settings=self.new_settings().to_dict())
        await self.open_conversation(conversation.id, apply_override=True)
        self.prompt.focus()
        self.open_engine(self.requested or conversation.model or self.config.model)

    def on_unmount(self) -> None:
        self.cancel.set()
        # Never free the models under a decode still running in the worker thread.
        if self.worker_done.wait(timeout=30) and self.engine is not None:
            self.engine.close()
        if getattr(self, "history", None) is not None:
            self.history.close()

    # ------------------------------------------------------------------ models

    def open_engine(self, entry_id: str | None) -> None:
        """Load `entry_id` (or the first ready pair, or the default pair, pulling it first)."""
        try:
            if entry_id is None:
                ready = [c for c in self.provider.choices() if c.ready]
                entry_id = ready[0].id if ready else None
            if entry_id is None:
                default = self.provider.default_id()
                self.push_screen(
                    ModelPicker(self.provider, None, pull_now=default,
                                intro=f"Nothing is pulled yet. Pulling the default pair, {default}; "
                                      "Esc to choose another."),
                    self._picked_model)
                return
            if not self.provider.is_ready(entry_id):
                self.push_screen(
                    ModelPicker(self.provider, self.engine_id, pull_now=entry_id,
                                intro=f"{entry_id} is not pulled yet. Pulling it now."),
                    self._picked_model)
                return
        except LocalspecError as exc:
            self.notify(str(exc), title="Cannot open that model", severity="error", timeout=10)
            self.push_screen(ModelPicker(self.provider, self.engine_id), self._picked_model)
            return
        self.loading = entry_id
        self.sub_title = f"{entry_id} · loading…"
        self.load_engine(entry_id)

    @work(thread=True, exclusive=True, group="load")
    def load_engine(self, entry_id: str) -> None:
        try:
            engine = self.provider.load(entry_id)
        except LocalspecError as exc:
            self.post_message(self.EngineFailed(entry_id, str(exc)))
        except Exception as exc:
            self.post_message(self.EngineFailed(entry_id, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.EngineReady(entry_id, engine))

    @on(EngineReady)
    def _engine_ready(self, message: EngineReady) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine, self.engine_id, self.loading = message.engine, message.entry_id, None
        self._show_model()
        if self.conversation is not None:
            self.history.update(self.conversation.id, model=message.entry_id)
        cost = getattr(self.engine, "cost", None)
        self.baseline = getattr(cost, "plain_tokens_per_s", 0.0)
        if not self.stats.showing_stored:
            self.stats.baseline = self.baseline
            self.stats.refresh_numbers()
        self.notify(f"{message.entry_id} is ready.", timeout=3)

    @on(EngineFailed)
    def _engine_failed(self, message: EngineFailed) -> None:
        self.loading = None
        self._show_model()
        self.notify(f"{message.entry_id}: {message.error}", title="Could not load the model", severity="error",
                    timeout=15)

    def _show_model(self) -> None:
        if self.engine_id is None:
            self.sub_title = "no model · Ctrl+O to choose one"
            return
        draft = "draft model + n-gram" if getattr(self.engine, "draft", None) is not None else "n-gram lookup"
        self.sub_title = f"{self.engine_id} · {draft}"

    def _picked_model(self, entry_id: str | None) -> None:
        if entry_id and entry_id != self.engine_id:
            self.open_engine(entry_id)
        elif self.engine is None and not self.loading:
            self._show_model()

    def action_pick_model(self) -> None:
        if self._modal_open():
            return
        if self.generating:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.push_screen(ModelPicker(self.provider, self.engine_id), self._picked_model)

    # ------------------------------------------------------------------ conversations

    def new_settings(self) -> ChatSettings:
        settings = self.config.chat
        if self.drafter_override:
            settings = ChatSettings.from_dict({"drafter": self.drafter_override}, base=settings)
        return settings

    async def open_conversation(self, conversation_id: int, apply_override: bool = False) -> None:
        self.conversation = self.history.get(conversation_id)
        self.settings = ChatSettings.from_dict(self.conversation.settings, base=self.config.chat)
        if apply_override and self.drafter_override:
            self.settings = ChatSettings.from_dict({"drafter": self.drafter_override}, base=self.settings)
            self.history.update(conversation_id, settings=self.settings.to_dict())
        self._show_settings()
        log = self.log_view
        await log.remove_children()
        log.current = None
        rows = self.history.messages(conversation_id)
        widgets = [self._message_widget(row) for row in rows if row.role != "system"]
        if not widgets:
            widgets = [Static(WELCOME, id="welcome")]
        await log.mount_all(widgets)
        answered = [row for row in rows if row.role == "assistant" and row.stats and "drafted" in row.stats]
        if answered:
            self.stats.show_stored(answered[-1].stats)
        log.scroll_end(animate=False, immediate=False)
        self.refresh_sidebar()

    def _message_widget(self, row: MessageRow):
        if row.role == "user":
            return UserMessage(row.content)
        error = (row.stats or {}).get("error") if row.status == "error" else None
        spans = [tuple(s) for s in (row.spans or [])]
        return AssistantMessage(spans, finished=True, stats=row.stats, status=row.status, error=error,
                                content=row.content)

    def refresh_sidebar(self) -> None:
        current = self.conversation.id if self.conversation else None
        self.query_one("#sidebar", ConversationList).set_items(self.history.conversations(), current)

    @on(ConversationList.Picked)
    async def _switch(self, message: ConversationList.Picked) -> None:
        if self.conversation and message.conversation_id == self.conversation.id:
            return
        if self.generating:
            self.notify("Stop the answer first (Esc).", severity="warning")
            self.refresh_sidebar()
            return
        await self.open_conversation(message.conversation_id)

    async def action_new_conversation(self) -> None:
        if self._modal_open():
            return
        if self.generating:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        row = self.history.create(NEW_TITLE, model=self.engine_id, settings=self.new_settings().to_dict())
        await self.open_conversation(row.id)
        self.prompt.focus()

    def action_rename_conversation(self) -> None:
        if self.conversation is None:
            return

        def done(title: str | None) -> None:
            if title:
                self.history.rename(self.conversation.id, title)
                self.conversation = self.history.get(self.conversation.id)
                self.refresh_sidebar()

        self.push_screen(RenameScreen(self.conversation.title), done)

    def action_delete_conversation(self) -> None:
        if self.conversation is None or self.generating:
            return
        doomed = self.conversation

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            self.history.delete(doomed.id)
            rows = self.history.conversations()
            row = rows[0] if rows else self.history.create(NEW_TITLE, model=self.engine_id,
                                                             settings=self.new_settings().to_dict())
            await self.open_conversation(row.id)
            self.notify(f"Deleted “{doomed.title}”.", timeout=3)

        self.push_screen(ConfirmScreen(f"Delete the conversation “{doomed.title}” and all its messages?"), done)

    def action_export_conversation(self) -> None:
        if self.conversation is None:
            return
        text = self.history.to_markdown(self.conversation.id)
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.conversation.title).strip("-").lower()[:40] or "conversation"
        path = Path.cwd() / f"localspec-{slug}.md"
        n = 2
        while path.exists():  # never overwrite an earlier export
            path = Path.cwd() / f"localspec-{slug}-{n}.md"
            n += 1
        try:
            path.write_text(text)
        except OSError as exc:
            self.notify(f"Could not write {path}: {exc.strerror or exc}", title="Export failed", severity="error")
            return
        self.notify(f"Exported to {path}", title="Exported", timeout=6)

    def _modal_open(self) -> bool:
        """App keys with priority must not stack dialogs on dialogs."""
        return isinstance(self.screen, ModalScreen)

    def action_toggle_sidebar(self) -> None:
        self.screen.toggle_class("-flip")

    # ------------------------------------------------------------------ settings

    def _show_settings(self) -> None:
        length = "adaptive" if self.settings.draft_len is None else f"fixed {self.settings.draft_len}"
        temp = "greedy" if self.settings.temperature == 0 else f"T={self.settings.temperature:g}"
        self.stats.drafter_label = f"{self.settings.drafter}, {length}, {temp}"
        self.stats.refresh_numbers()

    def action_settings(self) -> None:
        if isinstance(self.screen, SettingsScreen):
            self.screen.action_save()  # Ctrl+S inside the dialog saves it
            return
        if self._modal_open():
            return

        def done(settings: ChatSettings | None) -> None:
            if settings is None or self.conversation is None:
                return
            self.settings = settings
            self.history.update(self.conversation.id, settings=settings.to_dict())
            self._show_settings()
            self.notify("Settings saved for this conversation.", timeout=3)

        has_draft = getattr(self.engine, "draft", None) is not None
        self.push_screen(SettingsScreen(self.settings, has_draft), done)

    # ------------------------------------------------------------------ generation

    def context_messages(self) -> list[dict]:
        """System prompt and the turns so far; a prompt whose answer failed is left out with it."""
        assert self.conversation is not None
        rows = self.history.messages(self.conversation.id)
        out = [{"role": "system", "content": self.settings.system}] if self.settings.system else []
        for i, row in enumerate(rows):
            failed_answer = i + 1 < len(rows) and rows[i + 1].role == "assistant" and rows[i + 1].status == "error"
            if row.role == "user" and failed_answer:
                continue
            if row.role == "assistant" and row.status == "error":
                continue
            out.append({"role": row.role, "content": row.content})
        return out

    @on(PromptInput.Submitted)
    async def _send(self, message: PromptInput.Submitted) -> None:
        if self.generating:
            self.notify("An answer is still streaming; Esc stops it.", severity="warning")
            return
        if self.engine is None:
            text = f"{self.loading} is still loading…" if self.loading else "No model is loaded: Ctrl+O picks one."
            self.notify(text, severity="warning")
            return
        if self.settings.drafter == "model" and getattr(self.engine, "draft", None) is None:
            self.notify(f"{self.engine_id} has no draft model; choose the drafter auto, ngram or none (Ctrl+S).",
                        severity="error", title="No draft model")
            return
        if self.settings.drafter == "self" and getattr(self.engine, "self_drafter", None) is None:
            self.notify(f"{self.engine_id} has no self-draft; build one with `localspec draft make {self.engine_id}` "
                        "or choose another drafter (Ctrl+S).", severity="error", title="No self-draft")
            return
        assert self.conversation is not None
        text = message.text
        self.prompt.clear()
        self.prompt.remember(text)
        self.history.add(self.conversation.id, "user", text)
        if self.conversation.title == NEW_TITLE:
            self.history.rename(self.conversation.id, text.splitlines()[0][:48])
            self.conversation = self.history.get(self.conversation.id)
        self.refresh_sidebar()

        log = self.log_view
        for welcome in log.query("#welcome"):
            await welcome.remove()
        answer = AssistantMessage()
        answer.show_rejected = self.show_rejected
        await log.mount_all([UserMessage(text), answer])
        log.current = answer
        log.scroll_end(animate=False)

        s = self.settings
        options = {"max_tokens": s.max_tokens, "sampling": s.sampling(), "drafter": s.drafter, "draft_len": s.draft_len}
        self.generating = True
        self.cancel = threading.Event()
        self.worker_done = threading.Event()
        self.stats.start(self.baseline or self.stats.baseline)
        log.generate(self.engine, self.context_messages(), options, self.cancel, self.worker_done)

    @on(ChatLog.Streamed)
    async def _streamed(self, message: ChatLog.Streamed) -> None:
        from localspec.engine.events import Summary

        event = message.event
        self.stats.add(event)
        if isinstance(event, Summary):
            status = "cancelled" if event.stop_reason == "cancelled" else "complete"
            stats = {k: v for k, v in event.to_dict().items() if k != "text"} | {"one_line": event.one_line()}
            await self._finish(event.text, status, stats)

    @on(ChatLog.Failed)
    async def _failed(self, message: ChatLog.Failed) -> None:
        answer = self.log_view.current
        await self._finish(answer.text if answer else "", "error", {"error": message.error})
        self.notify(message.error, title="The answer failed", severity="error", timeout=15)

    async def _finish(self, text: str, status: str, stats: dict) -> None:
        answer = self.log_view.current
        spans = answer.spans if answer else []
        if self.conversation is not None:
            self.history.add(self.conversation.id, "assistant", text, status=status, stats=stats,
                             spans=[list(s) for s in spans])
        if answer is not None:
            answer.content = text
            await answer.finish(stats, status, stats.get("error"))
        self.log_view.current = None
        self.generating = False
        self.log_view.follow()
        if self._quitting:
            self.exit()

    def action_cancel(self) -> None:
        if self.generating and not self.cancel.is_set():
            self.cancel.set()
            self.notify("Stopping after this round…", timeout=2)

    async def action_quit(self) -> None:
        if self.generating:
            # Let the worker end its round and the partial answer reach the history, then exit.
            self._quitting = True
            self.cancel.set()
            self.set_timer(30, self.exit)
            return
        self.exit()

    # ------------------------------------------------------------------ the rest

    def action_toggle_rejected(self) -> None:
        self.show_rejected = not self.show_rejected
        for answer in self.log_view.query(AssistantMessage):
            answer.set_show_rejected(self.show_rejected)
        self.notify("Rejected draft tokens " + ("shown" if self.show_rejected else "hidden"), timeout=2)

    def _last_answer(self) -> str | None:
        answers = [a for a in self.log_view.query(AssistantMessage) if a.text]
        return answers[-1].text if answers else None

    def action_copy_answer(self) -> None:
        text = self._last_answer()
        if not text:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(text)
        self.notify(f"Copied the last answer ({len(text)} characters).", timeout=3)

    def action_copy_code(self) -> None:
        blocks = CODE_BLOCK.findall(self._last_answer() or "")
        if not blocks:
            self.notify("The last answer has no code block.", severity="warning")
            return
        self.copy_to_clipboard(blocks[-1])
        self.notify(f"Copied the last code block ({len(blocks[-1].splitlines())} lines).", timeout=3)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    @on(PromptInput.HelpRequested)
    def _help(self) -> None:
        self.action_help()

    @on(SummaryLine.Opened)
    def _details(self, message: SummaryLine.Opened) -> None:
        answer = message.line.parent
        if isinstance(answer, AssistantMessage):
            self.push_screen(DetailsScreen(answer.stats, answer.spans, answer.text))

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("New conversation", "Start an empty conversation", self.action_new_conversation)
        yield SystemCommand("Rename conversation", "Give this conversation a title", self.action_rename_conversation)
        yield SystemCommand("Delete conversation", "Delete this conversation and its messages",
                            self.action_delete_conversation)
        yield SystemCommand("Export conversation", "Write it to a Markdown file in the current folder",
                            self.action_export_conversation)
        yield SystemCommand("Choose model", "Pick or pull a model pair", self.action_pick_model)
        yield SystemCommand("Settings", "Drafter, draft length, sampling, system prompt", self.action_settings)
        yield SystemCommand("Toggle rejected tokens", "Show or hide rejected draft tokens", self.action_toggle_rejected)
        yield SystemCommand("Copy last answer", "To the clipboard", self.action_copy_answer)
        yield SystemCommand("Copy last code block", "To the clipboard", self.action_copy_code)
        yield SystemCommand("Keys", "Every key binding", self.action_help)


def create_app(entry_id: str | None = None, *, drafter: str | None = None, provider=None,
               history: History | None = None, config: UserConfig | None = None, n_ctx: int = 4096,
               n_gpu_layers: int | None = None) -> ChatApp:
    """The chat app, wired to local models unless a provider is given (tests script one)."""
    return ChatApp(
        provider or LocalProvider(n_ctx=n_ctx, n_gpu_layers=n_gpu_layers),
        entry_id=entry_id,
        drafter=drafter,
        history=history,
        config=config or load_user_config(),
    )

"""`localspec chat`: talk to a local model and watch speculative decoding work.

`create_app` is the one way to build the app, for the CLI and the tests alike. The app owns the
engine (loading it off the event loop, through a provider) and the keys that work everywhere; the
chat screen (`tui/chat.py`) draws a conversation, and `Conversations` keeps them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import ModalScreen

from localspec.config import UserConfig, load_user_config
from localspec.engine.contract import ChatEngine, describe_drafters
from localspec.errors import LocalspecError
from localspec.history import History
from localspec.tui.chat import ChatScreen
from localspec.tui.conversations import Conversations, LoadedModel
from localspec.tui.engine_thread import EngineThread, lower_priority, prefer_the_engine
from localspec.tui.provider import LocalProvider, Provider
from localspec.tui.screens import HelpScreen, ModelPicker


class ChatApp(App):
    CSS_PATH = "chat.tcss"
    TITLE = "localspec"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    BINDINGS = [
        Binding("ctrl+c", "quit", "Quit", priority=True),
        Binding("f1", "help", "Keys"),
        Binding("ctrl+o", "pick_model", "Model", priority=True),
    ]

    @dataclass
    class EngineReady(Message):
        entry_id: str
        engine: ChatEngine

    @dataclass
    class EngineFailed(Message):
        entry_id: str
        error: str

    def __init__(self, provider: Provider, *, entry_id: str | None = None, drafter: str | None = None,
                 history: History | None = None, config: UserConfig | None = None, yield_cpu: bool = False):
        """`yield_cpu`: the app's thread draws at a lower priority than the engine (tui/engine_thread.py),
        as settings.yaml's `chat_draws: sparingly` asks; an app inside another program (the tests) leaves
        that program's priority be."""
        super().__init__()
        self.engine_thread = EngineThread()
        self.yield_cpu = yield_cpu
        self.provider = provider
        self.config = config or UserConfig()
        self.chats = Conversations(history or History(), self.config, drafter)
        self.model = LoadedModel()
        self.chat = ChatScreen(self.chats, self.model, requested=entry_id, run_engine=self.engine_thread.run)
        self._quitting = False
        self._switch_interval: float | None = None  # Python's own, while the engine's is set (on_mount)

    def get_default_screen(self) -> ChatScreen:
        return self.chat

    # What the tests (and the command palette) reach through the app.
    engine = property(lambda self: self.model.engine)
    engine_id = property(lambda self: self.model.entry_id)
    loading = property(lambda self: self.model.loading)
    history = property(lambda self: self.chats.history)
    conversation = property(lambda self: self.chats.current)
    settings = property(lambda self: self.chats.settings)
    log_view = property(lambda self: self.chat.log_view)
    prompt = property(lambda self: self.chat.prompt)
    stats = property(lambda self: self.chat.stats)
    generating = property(lambda self: self.chat.generating)

    def action_rename_conversation(self) -> None:
        self.chat.action_rename_conversation()

    def action_delete_conversation(self) -> None:
        self.chat.action_delete_conversation()

    def action_export_conversation(self) -> None:
        self.chat.action_export_conversation()

    def on_mount(self) -> None:
        if isinstance(self.provider, LocalProvider):  # the engine decodes in this process
            self._switch_interval = prefer_the_engine()
        if self.yield_cpu:
            lower_priority()
            if not isinstance(self.provider, LocalProvider):  # the engine is a server's: all of the app yields
                self.engine_thread.run(lower_priority)

    def on_unmount(self) -> None:
        self.chat.stop_answer()
        # Never free the models under a decode still running in the worker thread.
        if self.chat.wait_for_worker(timeout=30) and self.engine is not None:
            self.engine.close()
        self.engine_thread.close()
        self.history.close()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)

    # ------------------------------------------------------------------ models

    @work(thread=True, exclusive=True, group="open")
    def open_engine(self, entry_id: str | None) -> None:
        """Load `entry_id` (or the first ready pair, or the default pair, pulling it first). The provider
        reads the catalog and the disk, or asks a server: off the event loop."""
        self.chat.stop_answer()  # the engine's work between answers gives way: the load runs on its thread
        try:
            if entry_id is None:
                ready = [c for c in self.provider.choices() if c.ready]
                entry_id = ready[0].id if ready else None
            if entry_id is None:
                default = self.provider.default_id()
                intro = f"Nothing is pulled yet. Pulling the default pair, {default}; Esc to choose another."
                self.call_from_thread(self._pick, None, default, intro)
                return
            if not self.provider.is_ready(entry_id):
                self.call_from_thread(self._pick, self.engine_id, entry_id,
                                      f"{entry_id} is not pulled yet. Pulling it now.")
                return
        except LocalspecError as exc:
            self.call_from_thread(self.notify, str(exc), title="Cannot open that model", severity="error", timeout=10)
            self.call_from_thread(self._pick, self.engine_id)
            return
        self.call_from_thread(self._loading, entry_id)
        try:
            engine = self.engine_thread.run(self.provider.load, entry_id)
        except Exception as exc:  # a failed load must leave the app (and the conversations) running
            error = str(exc) if isinstance(exc, LocalspecError) else f"{type(exc).__name__}: {exc}"
            self.post_message(self.EngineFailed(entry_id, error))
        else:
            self.post_message(self.EngineReady(entry_id, engine))

    @on(ChatScreen.OpenModel)
    def _open_model(self, message: ChatScreen.OpenModel) -> None:
        self.open_engine(message.entry_id)

    def _loading(self, entry_id: str) -> None:
        self.model.loading = entry_id
        self.sub_title = f"{entry_id} · loading…"

    def _pick(self, current: str | None, pull_now: str | None = None, intro: str = "") -> None:
        self.push_screen(ModelPicker(self.provider, current, pull_now=pull_now, intro=intro), self._picked_model)

    @on(EngineReady)
    async def _engine_ready(self, message: EngineReady) -> None:
        if self.engine is not None:
            self.engine.close()
        self.model.engine, self.model.entry_id, self.model.loading = message.engine, message.entry_id, None
        self._show_model()
        self.chats.set_model(message.entry_id)
        if not self.stats.showing_stored:
            self.stats.baseline = message.engine.baseline_tokens_per_s
            self.stats.refresh_numbers()
        self.notify(f"{message.entry_id} is ready.", timeout=3)
        for warning in message.engine.warnings:
            self.notify(warning, severity="warning", timeout=10)
        await self.chat.model_ready()

    @on(EngineFailed)
    async def _engine_failed(self, message: EngineFailed) -> None:
        self.model.loading = None
        self._show_model()
        self.notify(f"{message.entry_id}: {message.error}", title="Could not load the model", severity="error",
                    timeout=15)
        await self.chat.model_failed()

    def _show_model(self) -> None:
        if self.engine is None:
            self.sub_title = "no model · Ctrl+O to choose one"
        else:
            self.sub_title = f"{self.engine_id} · {describe_drafters(self.engine.drafters)}"

    def _picked_model(self, entry_id: str | None) -> None:
        if entry_id and entry_id != self.engine_id:
            self.open_engine(entry_id)
        elif self.engine is None and not self.loading:
            self._show_model()

    def action_pick_model(self) -> None:
        if isinstance(self.screen, ModalScreen):
            return  # never a dialog on a dialog
        if self.generating:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self._pick(self.engine_id)

    # ------------------------------------------------------------------ the rest

    @on(ChatScreen.AnswerFinished)
    def _answer_finished(self) -> None:
        if self._quitting:
            self.exit()

    async def action_quit(self) -> None:
        if self.generating:
            # Let the worker end its round and the partial answer reach the history, then exit.
            self._quitting = True
            self.chat.stop_answer()
            self.set_timer(30, self.exit)
            return
        self.exit()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for title, help_, action in self.chat.commands():
            yield SystemCommand(title, help_, action)
        yield SystemCommand("Choose model", "Pick or pull a model pair", self.action_pick_model)
        yield SystemCommand("Keys", "Every key binding", self.action_help)


def create_app(entry_id: str | None = None, *, drafter: str | None = None, provider: Provider | None = None,
               history: History | None = None, config: UserConfig | None = None, n_ctx: int = 4096,
               n_gpu_layers: int | None = None, no_history_drafts: bool = False,
               placement: dict | None = None, yield_cpu: bool | None = False, mmproj: str | None = None) -> ChatApp:
    """The chat app, wired to local models unless a provider is given (tests script one). `yield_cpu`
    None: as the user's settings say (`chat_draws`); a client of a server (`chat --connect`) always yields,
    as its drawing does not wait on the engine's thread."""
    from localspec.tui.remote import RemoteProvider

    config = config or load_user_config()
    if yield_cpu is None:
        yield_cpu = config.chat_draws == "sparingly" or isinstance(provider, RemoteProvider)
    return ChatApp(
        provider or LocalProvider(n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, history=config.history(no_history_drafts),
                                  placement=placement, flash_attn=config.flash_attn(),
                                  mmproj=(entry_id, mmproj) if entry_id and mmproj else None),
        entry_id=entry_id,
        drafter=drafter,
        history=history,
        config=config,
        yield_cpu=yield_cpu,
    )

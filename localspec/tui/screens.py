"""Modal screens: keys, settings, the model picker (with pulling), answer details, rename, attach, confirm."""

from __future__ import annotations

from dataclasses import dataclass, replace

from textual import on, work
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, ProgressBar, Select, Static, TextArea
from textual.widgets.option_list import Option

from localspec.config import ChatSettings
from localspec.engine.events import Summary
from localspec.engine.params import DRAFTER_SETTINGS
from localspec.errors import LocalspecError
from localspec.tui import spans as sp
from localspec.tui.panel import kept_by_drafter, position_bars
from localspec.units import human_bytes

KEYS = [
    ("Enter", "send the prompt"),
    ("Shift+Enter, Ctrl+J", "new line in the prompt"),
    ("↑ / ↓", "recall earlier prompts (in an empty prompt)"),
    ("Esc", "stop the answer (the partial answer is kept, marked cancelled)"),
    ("Ctrl+T", "show / hide rejected draft tokens"),
    ("F2, /image PATH", "attach an image to the next message (a model loaded with its projector)"),
    ("Ctrl+Y", "copy the last answer"),
    ("Ctrl+G", "copy the last code block of the last answer"),
    ("Ctrl+N", "new conversation"),
    ("Ctrl+B", "show / hide the conversation list (there: n new, r rename, d delete, e export)"),
    ("Ctrl+O", "choose or pull a model pair"),
    ("Ctrl+S", "settings of this conversation"),
    ("Ctrl+P", "command palette (every action, by name)"),
    ("Tab", "move between prompt, conversation and list; Enter on a summary line opens details"),
    ("? or F1", "this help"),
    ("Ctrl+C", "quit (stops the answer, frees the models)"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def compose(self):
        with VerticalScroll(classes="dialog", id="help"):
            yield Label("Keys", classes="title")
            for key, what in KEYS:
                yield Static(Content.assemble((f"{key:>20}  ", "bold $accent"), what))
            yield Label("Colours", classes="title")
            yield Static(Content.assemble(
                ("accepted", sp.STYLES[sp.ACCEPTED]), ": draft tokens the target kept (nearly free)\n",
                "plain text: tokens the target produced itself\n",
                ("rejected", sp.STYLES[sp.REJECTED]), ": draft tokens the target threw away",
            ))
            yield Button("Close", id="close")

    @on(Button.Pressed, "#close")
    def _close(self) -> None:
        self.dismiss(None)


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """The settings of one conversation. Returns new settings, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save", priority=True)]

    def __init__(self, settings: ChatSettings, drafters: tuple[str, ...]):
        super().__init__()
        self.settings = settings
        self.drafters = drafters

    def compose(self):
        s = self.settings
        with Vertical(classes="dialog", id="settings"):
            yield Label("Settings of this conversation", classes="title")
            with Grid(id="settings-grid"):
                yield Label("drafter")
                options = [(d + ("" if d in self.drafters else " (not loaded)"), d) for d in DRAFTER_SETTINGS]
                yield Select(options, value=s.drafter, allow_blank=False, id="drafter")
                yield Label("draft length")
                yield Input("auto" if s.draft_len is None else str(s.draft_len), id="draft_len",
                            placeholder="auto or a number")
                yield Label("temperature")
                yield Input(str(s.temperature), id="temperature", placeholder="0 = greedy")
                yield Label("top-k")
                yield Input(str(s.top_k), id="top_k", type="integer")
                yield Label("top-p")
                yield Input(str(s.top_p), id="top_p", type="number")
                yield Label("min-p")
                yield Input(str(s.min_p), id="min_p", type="number")
                yield Label("repeat penalty")
                yield Input(str(s.repeat_penalty), id="repeat_penalty", type="number")
                yield Label("seed")
                yield Input("" if s.seed is None else str(s.seed), id="seed", placeholder="random")
                yield Label("max tokens")
                yield Input(str(s.max_tokens), id="max_tokens", type="integer")
                yield Label("output")
                yield Select([("text", "text"), ("JSON (every answer a JSON value)", "json")], value=s.output,
                             allow_blank=False, id="output")
            yield Label("system prompt")
            yield TextArea(s.system, id="system", soft_wrap=True, compact=True)
            yield Static("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def read(self) -> ChatSettings:
        def text(name: str) -> str:
            return self.query_one(f"#{name}", Input).value.strip()

        def number(name: str, kind):
            value = text(name)
            try:
                return kind(value)
            except ValueError:
                raise LocalspecError(f"{name.replace('_', ' ')} must be a number, not '{value}'") from None

        draft_len = text("draft_len").lower()
        settings = replace(
            self.settings,
            drafter=str(self.query_one("#drafter", Select).value),
            draft_len=None if draft_len in ("", "auto") else number("draft_len", int),
            temperature=number("temperature", float),
            top_k=number("top_k", int),
            top_p=number("top_p", float),
            min_p=number("min_p", float),
            repeat_penalty=number("repeat_penalty", float),
            seed=None if not text("seed") else number("seed", int),
            max_tokens=number("max_tokens", int),
            output=str(self.query_one("#output", Select).value),
            system=self.query_one("#system", TextArea).text.strip(),
        )
        return settings.validated()

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        try:
            settings = self.read()
        except LocalspecError as exc:
            self.query_one("#settings-error", Static).update(Content.styled(str(exc), "$text-error"))
            return
        self.dismiss(settings)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class ModelPicker(ModalScreen[str | None]):
    """Pulled pairs and models first; choosing one that is not pulled pulls it here, with progress."""

    BINDINGS = [Binding("escape", "cancel", "Close")]

    @dataclass
    class PullFinished(Message):
        entry_id: str
        error: str | None

    @dataclass
    class PullNote(Message):
        text: str

    @dataclass
    class Listed(Message):
        choices: list

    @dataclass
    class Progress(Message):
        done: int
        total: int | None

    def __init__(self, provider, current: str | None, pull_now: str | None = None, intro: str | None = None):
        super().__init__()
        self.provider = provider
        self.current = current
        self.pull_now = pull_now
        self.intro = intro
        self.pulling: str | None = None
        self.ready: dict[str, bool] = {}

    def compose(self):
        with Vertical(classes="dialog", id="picker"):
            yield Label("Choose a model pair", classes="title")
            if self.intro:
                yield Static(self.intro, id="picker-intro")
            yield OptionList(id="choices")
            yield Static("", id="pull-note")
            yield ProgressBar(id="pull-progress", show_eta=True)
            yield Static(Content.styled("Enter: open (pulls it first if needed) · Esc: close", "dim"))

    def on_mount(self) -> None:
        self.query_one("#pull-progress").display = False
        self.query_one("#choices", OptionList).focus()
        self._list()
        if self.pull_now:
            self.start_pull(self.pull_now)

    @work(thread=True, exclusive=True, group="list")
    def _list(self) -> None:
        """The provider reads the catalog and the registry (or asks a server): off the event loop."""
        try:
            choices = self.provider.choices()
        except LocalspecError as exc:
            self.post_message(self.PullNote(f"Cannot list the models: {exc}"))
            choices = []
        self.post_message(self.Listed(choices))

    @on(Listed)
    def _listed(self, message: Listed) -> None:
        options = []
        self.ready = {c.id: c.ready for c in message.choices}
        for c in message.choices:
            state = "ready" if c.ready else f"pull {human_bytes(c.size, '')}"
            mark = "●" if c.id == self.current else ("✓" if c.ready else " ")
            text = Content.assemble((f"{mark} ", "$text-success"), (f"{c.id:24}", "bold"), f" {c.kind:5} ",
                                    (f"{state:12}", "$text-success" if c.ready else "$text-warning"),
                                    (f" {c.label}" + (" (default)" if c.default else ""), "dim"))
            options.append(Option(text, id=c.id))
        chooser = self.query_one("#choices", OptionList)
        chooser.add_options(options)
        chooser.highlighted = 0 if options else None

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        entry_id = event.option.id
        if entry_id is None or self.pulling:
            return
        if self.ready.get(entry_id):
            self.dismiss(entry_id)
        else:
            self.start_pull(entry_id)

    def start_pull(self, entry_id: str) -> None:
        self.pulling = entry_id
        bar = self.query_one("#pull-progress", ProgressBar)
        bar.display = True
        bar.update(total=None, progress=0)
        self.query_one("#pull-note", Static).update(f"Pulling {entry_id}…")
        self.set_interval(0.5, self._poll)
        self._pull(entry_id)

    @work(thread=True, exclusive=True, group="poll")
    def _poll(self) -> None:
        """Bytes on disk so far (a directory scan): off the event loop."""
        entry_id = self.pulling
        if not entry_id:
            return
        try:
            done, total = self.provider.pull_progress(entry_id)
        except Exception:
            return
        self.post_message(self.Progress(done, total))

    @on(Progress)
    def _progress(self, message: Progress) -> None:
        if self.pulling:
            self.query_one("#pull-progress", ProgressBar).update(total=message.total, progress=message.done)

    @work(thread=True, exclusive=True, group="pull")
    def _pull(self, entry_id: str) -> None:
        try:
            self.provider.pull(entry_id, say=lambda text: self.post_message(self.PullNote(text)))
        except LocalspecError as exc:
            self.post_message(self.PullFinished(entry_id, str(exc)))
        except Exception as exc:  # an unexpected failure must not take the app down
            self.post_message(self.PullFinished(entry_id, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.PullFinished(entry_id, None))

    @on(PullNote)
    def _note(self, message: PullNote) -> None:
        self.query_one("#pull-note", Static).update(Content(message.text.strip()))

    @on(PullFinished)
    def _finished(self, message: PullFinished) -> None:
        self.pulling = None
        if message.error:
            self.query_one("#pull-progress").display = False
            self.query_one("#pull-note", Static).update(
                Content.styled(f"Pull failed: {message.error}\nChoose again to retry (it resumes).", "$text-error"))
            return
        self.dismiss(message.entry_id)

    def action_cancel(self) -> None:
        if self.pulling:
            self.notify("The pull goes on in the background; reopen the picker (Ctrl+O) to see it.",
                        title="Still pulling")
        self.dismiss(None)


class DetailsScreen(ModalScreen[None]):
    """Everything about one answer: its statistics, and its text with the draft's work coloured in."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, summary: Summary | None, error: str | None, spans: list | None, text: str):
        super().__init__()
        self.summary = summary
        self.error = error
        self.spans = [tuple(s) for s in (spans or [])] or [(sp.TARGET, text)]

    def compose(self):
        s = self.summary
        with VerticalScroll(classes="dialog", id="details"):
            yield Label("Answer details", classes="title")
            if self.error:
                yield Static(Content.styled(f"Error: {self.error}", "$text-error"))
            if s is not None:
                rows = [
                    ("tokens", f"{s.generated_tokens} generated, prompt {s.prompt_tokens} "
                               f"({s.prompt_evaluated} evaluated, {s.prompt_s:.2f}s)"),
                    ("first token", f"after {s.first_token_s:.2f}s (prompt and first round)"),
                    ("throughput", f"{s.tokens_per_s:.1f} tok/s in {s.wall_s:.2f}s"),
                    ("plain decoding", f"{s.baseline_tokens_per_s:.1f} tok/s " + (
                        "(measured: this session's plain rounds at a similar context length)"
                        if s.baseline_measured else
                        "(estimate: no plain rounds measured yet at this context length; the one-token cost "
                        "timed at load)")),
                    ("speedup", f"{s.speedup:.2f}×"),
                    ("drafted", f"{s.drafted} tokens, {s.accepted} accepted "
                                f"({s.acceptance_rate:.0%}), {s.mean_accepted_per_round:.2f} per round"),
                    ("rounds", f"{s.rounds}: " + ", ".join(f"{k} {v}" for k, v in s.rounds_by_drafter.items())),
                    ("kept/drafted", kept_by_drafter(s.drafted_by_drafter, s.accepted_by_drafter)),
                    *([("trees", f"{s.tree_rounds} rounds verified a second candidate beside the draft's tokens; "
                                 f"the target kept one in {s.seconds_kept}")] if s.tree_rounds else []),
                    ("time", f"draft {s.draft_s:.2f}s, verify {s.verify_s:.2f}s"),
                    ("drafter", s.drafter),
                    ("stopped", s.stop_reason),
                ]
                for key, value in rows:
                    yield Static(Content.assemble((f"{key:>15}  ", "bold"), value))
                yield Label("acceptance by draft position", classes="caption")
                yield Static(position_bars(list(s.kept_by_position), list(s.drafted_by_position)))
            yield Label("the answer, as drafted and verified", classes="caption")
            yield Static(sp.render(self.spans), id="details-spans")
            yield Button("Close", id="close")

    @on(Button.Pressed, "#close")
    def _close(self) -> None:
        self.dismiss(None)


class RenameScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str):
        super().__init__()
        self.current = title

    def compose(self):
        with Vertical(classes="dialog small"):
            yield Label("Rename conversation", classes="title")
            yield Input(self.current, id="title")

    @on(Input.Submitted)
    def _done(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class AttachScreen(ModalScreen[str | None]):
    """The path of an image to attach to the next message (empty: drop the attached ones)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def compose(self):
        with Vertical(classes="dialog small"):
            yield Label("Attach an image (a path; empty clears the attached ones)", classes="title")
            yield Input(placeholder="~/Pictures/screenshot.png", id="path")

    @on(Input.Submitted)
    def _done(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("escape,n", "no", "No"), Binding("y", "yes", "Yes")]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self):
        with Vertical(classes="dialog small"):
            yield Static(self.question)
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", id="no")

    @on(Button.Pressed, "#yes")
    def action_yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#no")
    def action_no(self) -> None:
        self.dismiss(False)

"""The chat screen's widgets. Each posts its own messages; none of them decodes."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from textual import events, on, work
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widget import Widget
from textual.widgets import ListItem, ListView, Label, Markdown, Static, TextArea

from localspec.engine.events import Prefill, Round, Summary
from localspec.errors import LocalspecError
from localspec.history import MessageRow
from localspec.tui import spans as sp
from localspec.tui.rows import StreamingBlock

# While an answer streams, what it changes on screen is drawn at most this often, however many rounds
# arrive: every repaint takes CPU time from llama.cpp's threads, which wait for each other at every op.
FRAME_S = 1 / 10


class PromptInput(TextArea):
    """Multi-line prompt: Enter sends, Shift+Enter or Ctrl+J adds a line, ↑/↓ recall earlier prompts."""

    @dataclass
    class Submitted(Message):
        text: str

    @dataclass
    class HelpRequested(Message):
        pass

    def __init__(self, history: list[str] | None = None, **kwargs):
        super().__init__(soft_wrap=True, show_line_numbers=False, **kwargs)
        self.recall = list(history or [])
        self._recall_at: int | None = None

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text.strip()
            if text:
                self.post_message(self.Submitted(text))
            return
        if event.key in ("shift+enter", "ctrl+j"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "question_mark" and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.HelpRequested())
            return
        if event.key == "up" and self.cursor_location[0] == 0 and (not self.text or self._recall_at is not None):
            event.stop()
            event.prevent_default()
            self._step_recall(-1)
            return
        if event.key == "down" and self._recall_at is not None and self.cursor_location[0] == self.document.line_count - 1:
            event.stop()
            event.prevent_default()
            self._step_recall(+1)
            return
        await super()._on_key(event)

    def _step_recall(self, step: int) -> None:
        if not self.recall:
            return
        at = len(self.recall) if self._recall_at is None else self._recall_at
        at = max(0, min(len(self.recall), at + step))
        self._recall_at = None if at == len(self.recall) else at
        self.load_text("" if self._recall_at is None else self.recall[at])
        self.move_cursor(self.document.end)

    def remember(self, text: str) -> None:
        if not self.recall or self.recall[-1] != text:
            self.recall.append(text)
        self._recall_at = None


def image_chips(names: Sequence[str]) -> Content:
    """Attached images, one chip each, by name."""
    return Content.assemble(*[(f" ▣ {name} ", "reverse") for name in names])


class UserMessage(Static):
    """A prompt, its images (by name) as chips above its text."""

    def __init__(self, text: str, id: str | None = None, images: Sequence[str] = ()):
        chips = image_chips(images) + "\n" if images else Content("")
        super().__init__(chips + Content(text), classes="message user", id=id)
        self.images = tuple(images)


class SummaryLine(Static, can_focus=True):
    """One line under an answer: how it ended and what speculation bought. Enter or click for details."""

    BINDINGS = [Binding("enter", "open", "Details", show=False)]

    @dataclass
    class Opened(Message):
        line: "SummaryLine"

    def __init__(self, summary: Summary | None, status: str, error: str | None = None):
        self.summary = summary
        self.status = status
        self.error = error
        super().__init__(self._describe(), classes=f"summary {status}")

    def _describe(self) -> Content:
        parts: list = []
        if self.status in ("cancelled", "interrupted"):
            parts.append((f"■ {self.status}  ", "$text-warning bold"))
        elif self.status == "error":
            parts.append((f"✖ {self.error or 'failed'}  ", "$text-error bold"))
        s = self.summary
        if s is not None:
            parts.append(
                f"{s.generated_tokens} tok · {s.tokens_per_s:.1f} tok/s · "
                f"{s.speedup:.2f}× plain · {s.acceptance_rate:.0%} accepted"
            )
            parts.append(("  (details)", "dim"))
        return Content.assemble(*parts)

    def on_click(self) -> None:
        self.action_open()

    def action_open(self) -> None:
        self.post_message(self.Opened(self))


class AssistantMessage(Vertical):
    """An answer: coloured spans while it streams, Markdown once it is finished."""

    def __init__(self, spans: list[sp.Span] | None = None, *, finished: bool = False, summary: Summary | None = None,
                 status: str = "complete", error: str | None = None, content: str | None = None):
        super().__init__(classes="message assistant")
        self.spans: list[sp.Span] = list(spans or [])
        self.finished = finished
        self.summary = summary
        self.status = status
        self.error = error
        self.content = content
        self._unshown: list[sp.Span] = []
        self._live: StreamingBlock | None = None
        self.show_rejected = True

    def compose(self):
        if self.finished:
            yield Markdown(sp.as_markdown(self.text), classes="answer")
            yield SummaryLine(self.summary, self.status, self.error)
        else:
            self._live = StreamingBlock(self.show_rejected)
            yield self._live

    @property
    def text(self) -> str:
        return self.content if self.content is not None else sp.answer_text(self.spans)

    def add(self, new: list[sp.Span]) -> None:
        """A round's spans; shown at the next `draw`."""
        sp.merge(self.spans, list(new))
        self._unshown += new

    def draw(self) -> None:
        """Show what was added since the last draw."""
        if self._unshown and self._live is not None:
            self._live.append(self._unshown)
        self._unshown = []

    def set_show_rejected(self, show: bool) -> None:
        self.show_rejected = show
        if self._live is not None:
            self._live.set_show_rejected(show)

    async def finish(self, summary: Summary | None, status: str, error: str | None = None) -> None:
        self.finished, self.summary, self.status, self.error = True, summary, status, error
        await self.remove_children()
        self._live = None
        await self.mount(Markdown(sp.as_markdown(self.text), classes="answer"), SummaryLine(summary, status, error))


class ChatLog(VerticalScroll):
    """The messages of the open conversation, and the worker that streams an answer into it.

    The worker runs the engine in a thread and only posts messages; rounds are rendered here, and the
    messages bubble on to the app (statistics, history).
    """

    @dataclass
    class Streamed(Message):
        """The answer started or ended: its events wait in `inbox`, to be taken now."""

    @dataclass
    class Maintained(Message):
        """The engine did, between answers, what it had put off (measured its costs again)."""

        what: str

    @dataclass
    class Failed(Message):
        error: str

    WELCOME = (
        "Ask anything. While the answer streams, [$text-success]green[/] text is draft tokens the target model "
        "accepted (nearly free), plain text is what the target produced itself, and "
        "[$text-error strike dim]struck-through[/] text is draft the target rejected. "
        "The panel on the right shows what that bought over plain decoding. Press [b]?[/b] for keys."
    )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.current: AssistantMessage | None = None
        self.show_rejected = True
        # The answer's events, oldest first, as the engine's thread leaves them. Rounds wait for the
        # screen's next frame (a message per round would wake the event loop dozens of times a second);
        # the answer's start and end are announced with a message, to be shown at once.
        self.inbox: deque[Prefill | Round | Summary] = deque()

    async def show_conversation(self, rows: list[MessageRow]) -> None:
        """Replace what is shown with these turns (a welcome text when there are none)."""
        await self.remove_children()
        self.current = None
        widgets: list[Widget] = [self._message(row) for row in rows if row.role != "system"]
        await self.mount_all(widgets or [Static(self.WELCOME, id="welcome")])
        self.scroll_end(animate=False, immediate=False)

    def _message(self, row: MessageRow) -> Widget:
        if row.role == "user":
            return UserMessage(row.content, images=[str(ref.get("name", "image")) for ref in row.images or ()])
        message = AssistantMessage([tuple(s) for s in (row.spans or [])], finished=True, summary=row.summary,
                                   status=row.status, error=row.error, content=row.content)
        message.show_rejected = self.show_rejected
        return message

    async def start_answer(self, prompt: str, images: Sequence[str] = ()) -> AssistantMessage:
        """The user's prompt (its images by name) and an empty answer that the next rounds fill."""
        await self._drop_welcome()
        answer = AssistantMessage()
        answer.show_rejected = self.show_rejected
        await self.mount_all([UserMessage(prompt, images=images), answer])
        self.current = answer
        self.scroll_end(animate=False)
        return answer

    async def show_waiting(self, prompt: str, images: Sequence[str] = ()) -> None:
        """A message sent before the model is ready, shown as waiting for it."""
        await self._drop_welcome()
        await self.mount_all([UserMessage(prompt, id="waiting-prompt", images=images),
                              Static("waiting for the model to load…", id="waiting", classes="summary")])
        self.scroll_end(animate=False)

    async def _drop_welcome(self) -> None:
        for welcome in self.query("#welcome"):
            await welcome.remove()

    async def drop_waiting(self) -> None:
        for widget in self.query("#waiting-prompt, #waiting"):
            await widget.remove()

    def toggle_rejected(self) -> bool:
        self.show_rejected = not self.show_rejected
        for answer in self.query(AssistantMessage):
            answer.set_show_rejected(self.show_rejected)
        return self.show_rejected

    def last_answer(self) -> str | None:
        answers = [a for a in self.query(AssistantMessage) if a.text]
        return answers[-1].text if answers else None

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, engine, messages: list[dict], options: dict, cancel: threading.Event,
                 done: threading.Event, run_on: Callable[..., None]) -> None:
        """Streams the answer; `run_on` runs the engine's part where the engine's calls belong (its thread)."""
        try:
            run_on(self._stream, engine, messages, options, cancel)
        finally:
            done.set()

    def _stream(self, engine, messages: list[dict], options: dict, cancel: threading.Event) -> None:
        try:
            for event in engine.chat(messages, cancel=cancel, **options):
                self.inbox.append(event)
                if not isinstance(event, Round):
                    self.post_message(self.Streamed())
            # The answer is shown; the engine's put-off work runs now, until the next prompt or a model
            # switch (both set `cancel` or make the engine ask it to stop).
            if done_between := engine.maintain(interrupt=cancel.is_set):
                self.post_message(self.Maintained(done_between))
        except LocalspecError as exc:
            self.post_message(self.Failed(str(exc)))
        except Exception as exc:  # an engine failure mid-answer must not take the app (or the history) down
            self.post_message(self.Failed(f"The engine failed: {type(exc).__name__}: {exc}"))

    def add(self, event: Prefill | Round | Summary) -> None:
        """An event taken from the inbox: a round's spans join the answer (shown at the next `draw`)."""
        if isinstance(event, Round) and self.current is not None:
            self.current.add(sp.round_spans(event))

    def draw(self) -> None:
        """Show the rounds added since the last draw (the screen calls it at most every FRAME_S)."""
        if self.current is not None:
            self.current.draw()
            if not self.is_anchored and self.max_scroll_y > 0:
                # From the moment the answer fills the log, the log stays at its end (unless the user
                # scrolls up to read): the scroll is set in the layout pass that makes room for new rows.
                self.anchor()

    @property
    def following(self) -> bool:
        """Whether the log shows the end of what it holds (the user has not scrolled up to read)."""
        return self.max_scroll_y - self.scroll_y <= 3

    def answer_shown(self, following: bool) -> None:
        """The answer is finished: the log follows its last layout if it was `following` the stream (asked
        before the finished answer replaced it, whose height is not laid out yet), then stays where the
        user leaves it."""
        self.anchor(False)
        if following:
            self.scroll_end(animate=False, immediate=False)


class ConversationList(ListView):
    """The sidebar: one item per conversation, most recent first."""

    BINDINGS = [
        Binding("n", "screen.new_conversation", "New"),
        Binding("r", "screen.rename_conversation", "Rename"),
        Binding("delete,d", "screen.delete_conversation", "Delete"),
        Binding("e", "screen.export_conversation", "Export"),
    ]

    @dataclass
    class Picked(Message):
        conversation_id: int

    def set_items(self, rows, selected: int | None) -> None:
        self.clear()
        index = None
        for i, row in enumerate(rows):
            item = ListItem(Label(row.title, markup=False), name=str(row.id))
            self.append(item)
            if row.id == selected:
                index = i
        self.index = index

    @on(ListView.Selected)
    def _picked(self, event: ListView.Selected) -> None:
        event.stop()
        if event.item is not None and event.item.name:
            self.post_message(self.Picked(int(event.item.name)))

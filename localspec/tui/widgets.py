"""The chat screen's widgets. Each posts its own messages; none of them decodes."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from textual import events, on, work
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import ListItem, ListView, Label, Markdown, Static, TextArea

from localspec.engine.events import Prefill, Round, Summary, Tally
from localspec.errors import LocalspecError
from localspec.history import MessageRow
from localspec.tui import spans as sp
from localspec.tui.rows import RateSparkline, Rows, StreamingBlock

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

    def answer_shown(self) -> None:
        """The answer is finished: the log follows its last layout, then stays where the user leaves it."""
        following = self.max_scroll_y - self.scroll_y <= 3
        self.anchor(False)
        if following:
            self.scroll_end(animate=False, immediate=False)


class StatsPanel(Vertical):
    """Live statistics of the current answer: throughput against plain decoding, and acceptance."""

    drafter_label = reactive("")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.baseline = 0.0
        self._reset()

    def _reset(self) -> None:
        self.speedup = 0.0            # the engine's figure (engine/speedup.py); 0: none yet
        self.measured = False         # its baseline came from measured plain rounds
        self.tally = Tally()
        self.started = 0.0
        self.requested = time.perf_counter()
        self.first_token_s = 0.0
        self.tokens_per_s = 0.0
        self.recent: deque[tuple[int, float]] = deque(maxlen=4)
        self.last_draft = 0
        self.last_drafter = "—"
        self.shared = 0               # other requests in the latest round's decode (a server's)
        self.history: list[float] = []
        self.showing_stored = False
        self._changed = False
        self._positions_shown: tuple | None = None

    def compose(self):
        yield Rows(id="stats-numbers")
        yield Label("tokens/s over the answer", classes="caption")
        yield RateSparkline(id="stats-spark")
        yield Label("accepted by draft position", classes="caption")
        yield Rows(id="stats-positions")
        yield Static(self._legend(), id="stats-legend")

    def on_mount(self) -> None:
        self.query_one("#stats-numbers", Rows).tooltip = (
            "plain: what plain decoding of this target runs at on this answer's tokens - the rounds that "
            "drafted nothing, timed in this session at a similar context length ('plain est': not measured "
            "yet, the one-token cost timed at load). speedup: the time plain decoding would have taken over "
            "the time taken (`localspec bench` compares with llama-cpp-python's own Llama).\n"
            "1st token: from sending to the first answer token (prompt evaluation and the first round).\n"
            "decoded: with other requests when a server (chat --connect) decodes others' answers in the same "
            "steps; no drafts then.")
        self.refresh_numbers()

    @staticmethod
    def _legend() -> Content:
        return Content.assemble("legend: ", ("accepted", sp.STYLES[sp.ACCEPTED]), " · target · ",
                                ("rejected", sp.STYLES[sp.REJECTED]))

    def start(self, baseline: float) -> None:
        self._reset()
        self.baseline = baseline
        self.started = time.perf_counter()
        self.query_one("#stats-spark", RateSparkline).data = []
        self.refresh_numbers()

    def add(self, event: Prefill | Round | Summary) -> None:
        if isinstance(event, Prefill):
            self.started = time.perf_counter()
        elif isinstance(event, Round):
            if event.drafted == 0 and event.token is None:
                return  # text released at the end, not a decoding step
            self.tally.add(event)
            if event.speedup > 0:
                self.speedup, self.baseline, self.measured = (event.speedup, event.baseline_tokens_per_s,
                                                              event.baseline_measured)
            if not self.first_token_s and event.emitted:
                self.first_token_s = time.perf_counter() - self.requested
            elapsed = time.perf_counter() - self.started
            self.tokens_per_s = self.tally.generated / elapsed if elapsed > 0 else 0.0
            self.recent.append((event.emitted, event.draft_s + event.verify_s))
            spent = sum(s for _, s in self.recent)
            self.history.append(sum(n for n, _ in self.recent) / spent if spent > 0 else 0.0)
            self.last_draft = event.drafted
            self.last_drafter = event.drafter
            self.shared = event.shared
        elif isinstance(event, Summary):
            self.tokens_per_s = event.tokens_per_s
            self.first_token_s = event.first_token_s or self.first_token_s
            if event.baseline_tokens_per_s:
                self.baseline = event.baseline_tokens_per_s
            self.speedup, self.measured = event.speedup, event.baseline_measured
        self._changed = True

    def draw(self) -> None:
        """Show what `add` changed since the last draw (the screen calls it at most every FRAME_S)."""
        if self._changed:
            self._changed = False
            self.query_one("#stats-spark", RateSparkline).data = self.history[-120:]
            self.refresh_numbers()

    def show_stored(self, summary: Summary) -> None:
        """The statistics of a finished answer from the history (when a conversation is opened)."""
        self._reset()
        t = self.tally
        t.drafted, t.accepted = summary.drafted, summary.accepted
        mean = summary.mean_accepted_per_round
        t.drafting_rounds = round(t.accepted / mean) if mean else 0
        t.tried_at = list(summary.drafted_by_position)
        t.kept_at = list(summary.kept_by_position)
        t.drafted_by, t.accepted_by = dict(summary.drafted_by_drafter), dict(summary.accepted_by_drafter)
        self.tokens_per_s = summary.tokens_per_s
        self.first_token_s = summary.first_token_s
        self.baseline = summary.baseline_tokens_per_s or self.baseline
        self.speedup = summary.speedup
        self.measured = summary.baseline_measured
        self.last_drafter = summary.drafter or "—"
        self.showing_stored = True
        self.refresh_numbers()

    def refresh_numbers(self) -> None:
        t = self.tally
        speedup = self.speedup
        rate = t.accepted / t.drafted if t.drafted else 0.0
        per_round = t.accepted / t.drafting_rounds if t.drafting_rounds else 0.0
        self.query_one("#stats-numbers", Rows).show([
            (("now      ", "dim"), f"{self.tokens_per_s:6.1f} tok/s"),
            (("plain    " if self.measured else "plain est", "dim"), f"{self.baseline:6.1f} tok/s"),
            (("1st token", "dim"), f"{self.first_token_s:6.2f} s" if self.first_token_s else "     — "),
            (("speedup  ", "dim"), (f"{speedup:6.2f}×" if speedup else "     — ",
                                    "bold $text-success" if speedup >= 1 else "bold")),
            (("accepted ", "dim"), f"{rate:6.0%} of {t.drafted}"),
            (("per round", "dim"), f"{per_round:6.2f} tokens"),
            (("drafter  ", "dim"), f"{self.last_drafter} · {self.last_draft} drafted"),
            (("kept     ", "dim"), kept_by_drafter(t.drafted_by, t.accepted_by)),
            (("decoded  ", "dim"), f"with {self.shared} other request{'s' if self.shared > 1 else ''}"
                                   if self.shared else "alone"),
            (("setting  ", "dim"), self.drafter_label or "—"),
        ])
        positions = (tuple(t.kept_at), tuple(t.tried_at))
        if positions != self._positions_shown:  # they change only in rounds that drafted
            self._positions_shown = positions
            self.query_one("#stats-positions", Rows).show(position_lines(t.kept_at, t.tried_at))


def position_lines(kept: list[int], tried: list[int], width: int = 12, rows: int = 8) -> list[tuple]:
    """Each draft position's share kept, as a bar: one line's parts per position."""
    if not tried:
        return [(("(no drafts yet)", "dim"),)]
    lines = []
    for i, (k, n) in enumerate(zip(kept[:rows], tried[:rows]), 1):
        rate = k / n if n else 0.0
        full = round(rate * width)
        lines.append((f"{i:>2} ", ("█" * full, "$text-success"), ("░" * (width - full), "dim"), f" {rate:4.0%}"))
    return lines


def kept_by_drafter(drafted: dict[str, int], kept: dict[str, int]) -> str:
    """What each drafter proposed and the target kept, the busiest first: 'model 40/52 · ngram 20/20'."""
    shares = sorted(drafted.items(), key=lambda item: -item[1])
    return " · ".join(f"{name} {kept.get(name, 0)}/{n}" for name, n in shares) or "—"


def position_bars(kept: list[int], tried: list[int]) -> Content:
    return Content("\n").join(Content.assemble(*line) for line in position_lines(kept, tried))


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

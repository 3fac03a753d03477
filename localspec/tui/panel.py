"""The chat screen's statistics panel: the current answer's throughput against plain decoding, its
drafts' acceptance by position and by drafter, drawn at most once a frame."""

from __future__ import annotations

import time
from collections import deque

from textual.containers import Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Label, Static

from localspec.engine.events import Prefill, Round, Summary, Tally
from localspec.tui import spans as sp
from localspec.tui.rows import RateSparkline, Rows


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
            "steps.")
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

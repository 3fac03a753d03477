"""The widgets that draw their own rows show exactly what Textual's own widgets would, however the text
arrives: a streaming answer against a `Static` holding the whole answer, the panel's lines against the
same lines in one `Static`, the rate sparkline against Textual's `Sparkline`."""

import random

import pytest
from textual.app import App
from textual.containers import Vertical
from textual.geometry import Region
from textual.widgets import Sparkline, Static

from localspec.tui import spans as sp
from localspec.tui.rows import LIVE_ROWS_STEP, RateSparkline, Rows, StreamingBlock

pytestmark = pytest.mark.anyio

WORDS = ["def", "tally(items):", "\n", "    count", "=", "0", "\n\n", "for", "item", "in", "items:", "\n        ",
         "count", "+=", "1", "return", "a_rather_long_identifier_that_wraps_at_narrow_widths", "\n", "#", "é", "漢字"]


def rows_text(widget, height: int) -> list[list[tuple]]:
    """Each row as the cells it shows: (character, style), however the row is cut into segments (the
    positions a selection reads are left out: these widgets are not for selecting)."""
    rows = widget.render_lines(Region(0, 0, widget.size.width, height))
    return [[(ch, seg.style and seg.style.clear_meta_and_links()) for seg in strip for ch in seg.text]
            for strip in rows]


class Side(App):
    """A streaming block and a Static beside each other, at the same width."""

    CSS = "Vertical { width: 37; height: auto; } StreamingBlock, Static { padding: 0 1; }"

    def compose(self):
        with Vertical(id="a"):
            yield StreamingBlock()
        with Vertical(id="b"):
            yield Static("")


async def test_a_streaming_block_shows_what_a_static_with_the_whole_answer_shows():
    rng = random.Random(7)
    app = Side()
    async with app.run_test(size=(80, 200)) as pilot:
        block, static = app.query_one(StreamingBlock), app.query_one(Static)
        await pilot.pause()
        spans: list = []
        for frame in range(60):
            new = [(rng.choice([sp.ACCEPTED, sp.TARGET, sp.REJECTED]), rng.choice(WORDS) + " ")
                   for _ in range(rng.randint(1, 4))]
            sp.merge(spans, list(new))
            block.append(new)
            if frame == 40:
                block.set_show_rejected(False)
            static.update(sp.render(spans, block.show_rejected))
            await pilot.pause()
            shown = static.size.height
            assert block.size.height % LIVE_ROWS_STEP == 0 and block.size.height >= shown
            assert rows_text(block, shown) == rows_text(static, shown)
            assert block.content.plain == sp.render(spans, block.show_rejected).plain
        app.query_one("#a").styles.width = 23  # a narrower terminal: the rows are wrapped again
        app.query_one("#b").styles.width = 23
        await pilot.pause()
        await pilot.pause()
        assert rows_text(block, static.size.height) == rows_text(static, static.size.height)
        app.theme = "textual-light"  # another theme: other colours for the same spans
        await pilot.pause()
        await pilot.pause()
        assert rows_text(block, static.size.height) == rows_text(static, static.size.height)


def test_a_cut_at_the_last_line_keeps_the_text_and_skips_hidden_newlines():
    spans = [(sp.TARGET, "a\nb"), (sp.REJECTED, "x\ny"), (sp.ACCEPTED, "c")]
    assert sp.split_at_last_line(spans, True) == ([(sp.TARGET, "a\nb"), (sp.REJECTED, "x")],
                                                 [(sp.REJECTED, "y"), (sp.ACCEPTED, "c")])
    assert sp.split_at_last_line(spans, False) == ([(sp.TARGET, "a")], [(sp.TARGET, "b"), (sp.REJECTED, "x\ny"),
                                                                       (sp.ACCEPTED, "c")])
    assert sp.split_at_last_line([(sp.TARGET, "no line yet")]) == (None, [(sp.TARGET, "no line yet")])
    assert sp.split_at_last_line([(sp.TARGET, "\n")]) == ([], [])


class Panel(App):
    CSS = "Rows, Static { width: 20; height: auto; }"

    def compose(self):
        yield Rows()
        yield Static("")


async def test_panel_rows_repaint_what_changed_and_match_one_static():
    app = Panel()
    async with app.run_test(size=(40, 40)) as pilot:
        rows, static = app.query_one(Rows), app.query_one(Static)
        lines = [(("now ", "dim"), "1.0 tok/s"), ("short",), (("setting ", "dim"), "a long line that wraps here")]
        for step in range(4):
            lines[0] = (("now ", "dim"), f"{step * 3.3:.1f} tok/s")
            if step == 2:
                lines[1] = ("now two lines: one that wraps around",)
            if step == 3:
                lines.append(("one more",))
            rows.show(lines)
            static.update(rows.content)
            await pilot.pause()
            assert rows.size.height == static.size.height
            assert rows_text(rows, static.size.height) == rows_text(static, static.size.height)
        app.theme = "textual-light"
        await pilot.pause()
        await pilot.pause()
        assert rows_text(rows, static.size.height) == rows_text(static, static.size.height)


class Sparks(App):
    CSS = "Sparkline, RateSparkline { width: 30; height: 2; }"

    def compose(self):
        yield Sparkline([])
        yield RateSparkline()


async def test_the_rate_sparkline_draws_textual_sparklines_bars():
    app = Sparks()
    async with app.run_test(size=(40, 10)) as pilot:
        theirs, ours = app.query_one(Sparkline), app.query(RateSparkline).first()
        for data in ([], [5.0], [1.0, 2.0], [float(i % 17) for i in range(120)], [3.0] * 7):
            theirs.data, ours.data = data, data
            await pilot.pause()
            # the same bars; the colours blended into SHADES steps
            assert [[ch for ch, _ in row] for row in rows_text(ours, 2)] == \
                   [[ch for ch, _ in row] for row in rows_text(theirs, 2)]

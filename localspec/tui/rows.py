"""Widgets that draw their own rows, for what changes many times a second while an answer streams: a
frame renders and repaints only the rows that changed, and a change of height (which arranges the whole
screen again) is rare."""

from __future__ import annotations


from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.content import Content
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.visual import Visual
from textual.widget import Widget
from textual.widgets import Sparkline

from localspec.tui import spans as sp

# A streaming answer's height grows this many rows at a time: a new line inside the reserved rows is a
# repaint of that line, a change of height a layout pass.
LIVE_ROWS_STEP = 8


class WrappedRows(Widget):
    """Rows wrapped at the widget's width and kept, drawn by `render_line`: wrapped again when the width,
    the theme or the CSS changes (the rows hold the styles they were drawn with)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._width = 0

    def on_resize(self) -> None:
        if self._width != self.size.width:
            self._rebuild()

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.notify_style_update())

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._rebuild()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if width != self._width:
            self._rebuild(width)
        return self._content_rows()

    def _rebuild(self, width: int | None = None) -> None:
        """Wrap every row again at `width` (None: the widget's, and repaint)."""
        raise NotImplementedError

    def _content_rows(self) -> int:
        raise NotImplementedError


class StreamingBlock(WrappedRows):
    """An answer while it streams. Finished lines are wrapped once and kept; a frame wraps only the line
    being written and repaints only the rows that changed. The height grows LIVE_ROWS_STEP rows at a time."""

    DEFAULT_CSS = "StreamingBlock { height: auto; }"
    ALLOW_SELECT = False  # while it streams; the finished answer (Markdown) is selectable

    def __init__(self, show_rejected: bool = True):
        super().__init__(classes="block live")
        self.spans: list[sp.Span] = []
        self.show_rejected = show_rejected
        self._tail: list[sp.Span] = []      # the line being written
        self._rows: list[Strip] = []        # the finished lines, wrapped at `_width`
        self._tail_rows: list[Strip] = []
        self._height = 1

    @property
    def content(self) -> Content:
        """What the block shows."""
        return sp.render(self.spans, self.show_rejected)

    def append(self, new: list[sp.Span]) -> None:
        sp.merge(self.spans, list(new))
        sp.merge(self._tail, list(new))
        if self._width != self.size.width:
            self._rebuild()
        else:
            first = len(self._rows)
            finished, self._tail = sp.split_at_last_line(self._tail, self.show_rejected)
            if finished is not None:
                self._rows += self._wrap(finished)
            self._tail_rows = self._wrap(self._tail)
            self._repaint(first)

    def set_show_rejected(self, show: bool) -> None:
        self.show_rejected = show
        self._rebuild()

    def _rebuild(self, width: int | None = None) -> None:
        self._width = self.size.width if width is None else width
        finished, self._tail = sp.split_at_last_line(list(self.spans), self.show_rejected)
        self._rows = self._wrap(finished) if finished is not None else []
        self._tail_rows = self._wrap(self._tail)
        if width is None:
            self._repaint(0)
        else:
            self._height = self._rows_height(len(self._rows) + len(self._tail_rows))

    def _wrap(self, spans: list[sp.Span]) -> list[Strip]:
        if self._width <= 0:
            return []
        return Visual.to_strips(self, sp.render(spans, self.show_rejected), self._width, None, self.visual_style)

    def _repaint(self, first: int) -> None:
        """Repaint from row `first` on; arrange the screen again only when the rows outgrow the height."""
        rows = len(self._rows) + len(self._tail_rows)
        if rows > self._height or (first == 0 and rows <= self._height - LIVE_ROWS_STEP):
            self._height = self._rows_height(rows)
            self.refresh(layout=True)
        elif first == 0:
            self.refresh()
        else:
            self.refresh(Region(0, first, self._width, rows - first))

    @staticmethod
    def _rows_height(rows: int) -> int:
        return max(1, -(-rows // LIVE_ROWS_STEP) * LIVE_ROWS_STEP)

    def _content_rows(self) -> int:
        return self._height

    def render_line(self, y: int) -> Strip:
        if y < len(self._rows):
            return self._rows[y]
        if y - len(self._rows) < len(self._tail_rows):
            return self._tail_rows[y - len(self._rows)]
        return Strip.blank(self.size.width, self.visual_style.rich_style)


class Rows(WrappedRows):
    """Lines of text that change a few at a time (the panel's numbers): a frame renders and repaints only
    the lines that changed."""

    DEFAULT_CSS = "Rows { height: auto; }"
    ALLOW_SELECT = False  # figures, not text to copy

    def __init__(self, id: str | None = None):
        super().__init__(id=id)
        self._lines: list[tuple] = []          # each line's parts, as `Content.assemble` takes them
        self._rows: list[list[Strip]] = []     # each line wrapped at `_width`

    @property
    def content(self) -> Content:
        """What the widget shows."""
        return Content("\n").join(Content.assemble(*line) for line in self._lines)

    def show(self, lines: list[tuple]) -> None:
        if self._width != self.size.width or len(lines) != len(self._lines):
            self._lines = list(lines)
            self._rebuild()
            return
        top, moved = 0, False
        for i, line in enumerate(lines):
            height = len(self._rows[i])
            if line != self._lines[i]:
                self._lines[i], self._rows[i] = line, self._wrap(line)
                moved = moved or len(self._rows[i]) != height
                if not moved:
                    self.refresh(Region(0, top, self._width, height))
            top += len(self._rows[i])
        if moved:  # a line took another number of rows: the ones below it move
            self.refresh(layout=True)

    def _rebuild(self, width: int | None = None) -> None:
        self._width = self.size.width if width is None else width
        self._rows = [self._wrap(line) for line in self._lines]
        if width is None:
            self.refresh(layout=True)

    def _wrap(self, line: tuple) -> list[Strip]:
        if self._width <= 0:
            return []
        return Visual.to_strips(self, Content.assemble(*line), self._width, None, self.visual_style)

    def _content_rows(self) -> int:
        return sum(map(len, self._rows))

    def render_line(self, y: int) -> Strip:
        for rows in self._rows:
            if y < len(rows):
                return rows[y]
            y -= len(rows)
        return Strip.blank(self.size.width, self.visual_style.rich_style)


class RateSparkline(Sparkline):
    """Textual's sparkline, drawn from cached styles straight into rows: a frame redraws it whole."""

    BARS = "▁▂▃▄▅▆▇█"
    SHADES = 16  # colours between the lowest and the highest bar

    def __init__(self, id: str | None = None):
        super().__init__([], id=id)
        self._styles: list[RichStyle] = []
        self._rows: list[Strip] = []

    def watch_data(self) -> None:
        self._rows = []
        self.refresh()

    def _shades(self) -> list[RichStyle]:
        if not self._styles:
            _, base = self.background_colors
            low = base + self.get_component_styles("sparkline--min-color").color
            high = base + self.get_component_styles("sparkline--max-color").color
            self._styles = [self.visual_style.rich_style + RichStyle.from_color(
                low.blend(high, i / (self.SHADES - 1)).rich_color) for i in range(self.SHADES)]
        return self._styles

    def on_resize(self) -> None:
        self._rows = []

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.notify_style_update())

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles, self._rows = [], []
        self.refresh()

    def _draw(self) -> list[Strip]:
        width, height = self.size.width, max(1, self.size.height)
        data, shades, blank = list(self.data or []), self._shades(), self.visual_style.rich_style
        if not data:
            return [Strip.blank(width, blank)] * (height - 1) + [Strip([Segment("▁" * width, shades[0])], width)]
        low, high = min(data), max(data)
        extent = high - low or 1
        levels = [(max(part) - low) / extent for part in self._bars(data, width)] if len(data) > 1 else [1.0] * width
        top = len(self.BARS) * height - 1
        rows = []
        for row in reversed(range(height)):
            segments = []
            for level in levels:
                bar = int(level * top)
                cell = " " if bar < row * 8 else "█" if bar >= (row + 1) * 8 else self.BARS[bar % 8]
                segments.append(Segment(cell, blank if cell == " " else shades[round(level * (self.SHADES - 1))]))
            rows.append(Strip(Segment.simplify(segments), width))
        return rows

    @staticmethod
    def _bars(data: list[float], width: int) -> list[list[float]]:
        """Each bar's values: the data cut into `width` parts (fewer values than bars: a part spans several
        bars), as Textual's sparkline cuts it."""
        n = len(data)
        parts = [data[n * i // width:n * (i + 1) // width] for i in range(width)]
        parts = [part for part in parts if part]
        bars, at, step = [], 0.0, len(parts) / width
        for _ in range(width):
            bars.append(parts[int(at)])
            at += step
        return bars

    def render_line(self, y: int) -> Strip:
        if not self._rows:
            self._rows = self._draw()
        return self._rows[y] if y < len(self._rows) else Strip.blank(self.size.width, self.visual_style.rich_style)

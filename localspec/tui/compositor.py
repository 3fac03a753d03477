"""A compositor whose partial updates render only the widgets under the rows being drawn.

Textual's compositor renders, for a partial update, every widget whose clip overlaps the box around the
frame's changes, each whole. A streaming frame changes the answer's last line (low in the log) and the
panel's numbers (high on the right): the box covers most of the screen, and the header, the footer, the
prompt, the sidebar and every container render all their lines to draw a handful. This compositor renders
each widget that lies under at least one row being drawn, and only from the first such row to the last
(one call a widget: a call's fixed cost is that of tens of cached lines). What reaches the terminal is the
same: each drawn row is cut and layered exactly as Textual's own `_render_chops` does.

It overrides a private method of Textual's `Compositor`; `fits()` checks that method is still the one it
replaces, and a screen keeps Textual's compositor where it is not.
"""

from __future__ import annotations

import inspect
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence

from textual._compositor import Compositor
from textual.geometry import Region
from textual.strip import Strip


class DrawnRowsCompositor(Compositor):
    @staticmethod
    def fits() -> bool:
        """Whether this Textual's compositor has the method and the state this one builds on."""
        chops = getattr(Compositor, "_render_chops", None)
        return (chops is not None and list(inspect.signature(chops).parameters) == ["self", "crop", "is_rendered_line"]
                and isinstance(getattr(Compositor, "visible_widgets", None), property)
                and isinstance(getattr(Compositor, "cuts", None), property))

    def _render_chops(self, crop: Region, is_rendered_line: Callable[[int], bool]) -> Sequence[Mapping[int, Strip]]:
        """Each drawn row of `crop` cut at the compositor's cuts, the front-most widget's strip for each
        cut: rendered from the widgets under drawn rows only, each over its drawn rows' span."""
        cuts = self.cuts
        chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
        drawn = [y for y in crop.line_range if is_rendered_line(y)]
        for widget, (region, clip) in self.visible_widgets.items():  # front to back
            shown = region.intersection(clip)
            x, y, width, height = shown
            if not width or not crop.overlaps(shown):
                continue
            # Rows whose every cut under the widget a widget in front already filled need nothing of it.
            rows = [row for row in drawn[bisect_left(drawn, y):bisect_left(drawn, y + height)]
                    if any(chops[row].get(cut) is None for cut in cuts[row] if x <= cut < x + width)]
            if not rows:
                continue
            first, end = rows[0], rows[-1] + 1
            strips = widget.render_lines(Region(x - region.x, first - region.y, width, end - first))
            for row, strip in zip(range(first, end), strips):
                if not is_rendered_line(row):
                    continue
                line_chops = chops[row]
                row_cuts = [cut for cut in cuts[row] if x <= cut <= x + width]
                for cut, piece in zip(row_cuts, strip.divide([cut - x for cut in row_cuts[1:]])):
                    if line_chops.get(cut) is None:
                        line_chops[cut] = piece
        return chops  # type: ignore[return-value]

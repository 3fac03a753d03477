"""The chat screen's compositor sends the terminal exactly what Textual's own would, for the frames a
streaming answer makes and for any other set of changed regions, while rendering fewer widgets."""

import random

import pytest
from fakes import ScriptedEngine, ScriptedProvider
from test_tui import make_app, send, until
from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region

from localspec.tui.compositor import DrawnRowsCompositor
from localspec.tui.rows import StreamingBlock

pytestmark = pytest.mark.anyio

STEPS = [(f"line{i} = compute(", "wrong", f"{i})\n") for i in range(400)]  # streams for 8 s


def terminal_bytes(compositor, chops_of, regions: list[Region], console) -> str:
    """What a partial update of `regions` writes to the terminal, its rows cut by `chops_of`."""
    crop = Region.from_union(regions).intersection(compositor.size.region)
    spans = list(compositor._regions_to_spans(regions))
    drawn = {y for y, _, _ in spans}
    chops = chops_of(compositor, crop, drawn.__contains__)
    return ChopsUpdate(chops, spans, [cut_set[1:] for cut_set in compositor.cuts]).render_segments(console)


def rendered_widgets(monkeypatch, compositor, chops_of, regions, console) -> set[str]:
    """The widgets (class#id) a partial update of `regions` renders."""
    seen = set()

    def counted(widget):
        own = widget.render_lines  # the widget's class's, overridden or not

        def render_lines(crop):
            seen.add(type(widget).__name__ + (f"#{widget.id}" if widget.id else ""))
            return own(crop)
        return render_lines

    with monkeypatch.context() as patch:
        for widget in list(compositor.visible_widgets):
            patch.setattr(widget, "render_lines", counted(widget), raising=False)
        terminal_bytes(compositor, chops_of, regions, console)
    return seen


async def test_frames_reach_the_terminal_as_textuals_compositor_draws_them(monkeypatch):
    app = make_app(ScriptedProvider(ScriptedEngine(steps=STEPS, delay=0.02)))
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        compositor = app.chat._compositor
        assert isinstance(compositor, DrawnRowsCompositor)
        await send(pilot, "count")
        await until(pilot, lambda: app.log_view.current is not None and len(app.log_view.current.text) > 600)
        await pilot.pause(0.3)
        assert app.generating
        console, screen = app.console, compositor.size.region
        live = app.log_view.current.query_one(StreamingBlock)
        answer_line = Region(live.region.x, live.region.bottom - 3, live.region.width, 2)
        numbers = app.query_one("#stats-numbers").region
        frame = [answer_line, numbers, app.query_one("#stats-spark").region]
        rng = random.Random(7)
        scattered = [[Region(rng.randrange(150), rng.randrange(40), rng.randrange(1, 40), rng.randrange(1, 6))
                      .intersection(screen) for _ in range(rng.randrange(1, 5))] for _ in range(20)]
        for regions in [frame, [screen], [numbers], [answer_line]] + scattered:
            ours = terminal_bytes(compositor, DrawnRowsCompositor._render_chops, regions, console)
            textuals = terminal_bytes(compositor, Compositor._render_chops, regions, console)
            assert ours == textuals, regions
        assert app.generating  # all of it compared mid-answer
        # A streaming frame renders the widgets under its rows, not the header, footer, prompt or sidebar.
        ours = rendered_widgets(monkeypatch, compositor, DrawnRowsCompositor._render_chops, frame, console)
        textuals = rendered_widgets(monkeypatch, compositor, Compositor._render_chops, frame, console)
        assert {"StreamingBlock", "Rows#stats-numbers", "RateSparkline#stats-spark"} <= ours
        assert not ours & {"Header", "Footer", "PromptInput#prompt", "ConversationList#sidebar"}
        assert {"Header", "Footer", "PromptInput#prompt", "ConversationList#sidebar"} <= textuals
        assert len(ours) < len(textuals)


def test_a_textual_whose_compositor_changed_keeps_its_own(monkeypatch):
    assert DrawnRowsCompositor.fits()
    monkeypatch.setattr(Compositor, "_render_chops", lambda self, crop: [])
    assert not DrawnRowsCompositor.fits()
    app = make_app()
    assert type(app.chat._compositor) is Compositor

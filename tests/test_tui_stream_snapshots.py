"""Pictures of an answer while it streams: accepted draft, rejected draft where it was rejected, the
target's own tokens; and the same with rejected tokens hidden (Ctrl+T). The statistics panel is hidden
in these pictures: its rates depend on the moment. Update with: pytest --snapshot-update."""

import threading
import time

from fakes import ScriptedEngine, ScriptedProvider

from localspec.config import UserConfig
from localspec.tui.app import create_app

FIRST_ROUND = [("def tally(items):\n    count", " n", " = 0\n"), ("    for", "", " item")]


def streaming_app():
    hold = threading.Event()  # never set: the answer stays after its first round until the app exits
    return create_app(provider=ScriptedProvider(ScriptedEngine(steps=list(FIRST_ROUND), hold=hold)),
                      config=UserConfig())


async def first_round_shown(pilot):
    app = pilot.app
    deadline = time.monotonic() + 10
    while app.engine is None:
        assert time.monotonic() < deadline, "the scripted engine never loaded"
        await pilot.pause(0.02)
    for key in "rename":
        await pilot.press(key)
    await pilot.press("enter")
    while not (app.log_view.current and app.log_view.current.query(".live")
               and app.log_view.current.query_one(".live").visual.plain):
        assert time.monotonic() < deadline, "the first round was never shown"
        await pilot.pause(0.02)
    app.stats.display = False
    app.clear_notifications()
    for editor in app.query("Input, TextArea"):
        editor.cursor_blink = False
    await pilot.pause()


def test_a_streaming_answer_shows_accepted_rejected_and_target_spans(snap_compare):
    assert snap_compare(streaming_app(), terminal_size=(100, 24), run_before=first_round_shown)


def test_a_streaming_answer_with_rejected_tokens_hidden(snap_compare):
    async def hidden(pilot):
        await first_round_shown(pilot)
        await pilot.press("ctrl+t")
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(streaming_app(), terminal_size=(100, 24), run_before=hidden)

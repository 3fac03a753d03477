"""Pictures of the main screen (pytest-textual-snapshot). Update with: pytest --snapshot-update."""

import threading
import time

import pytest
from fakes import ScriptedEngine, ScriptedProvider

from localspec.config import UserConfig
from localspec.history import History
from localspec.tui.app import create_app

ANSWER_SPANS = [
    ["target", "Here is the function with "],
    ["accepted", "`count`"],
    ["target", " instead of `n`:\n\n```python\ndef "],
    ["accepted", "tally(items):\n    count = 0\n    for item in items:\n"],
    ["rejected", "        n +="],
    ["target", "        count"],
    ["accepted", " += 1\n    return count\n```"],
]
STATS = {
    "generated_tokens": 42, "tokens_per_s": 23.1, "baseline_tokens_per_s": 14.2, "speedup": 1.63,
    "acceptance_rate": 0.79, "drafted": 38, "accepted": 30, "mean_accepted_per_round": 3.3, "rounds": 12,
    "acceptance_by_position": [0.95, 0.9, 0.8, 0.6], "drafted_by_position": [12, 10, 9, 7],
    "kept_by_position": [11, 9, 7, 4], "rounds_by_drafter": {"model": 7, "ngram": 3, "none": 2},
    "drafted_by_drafter": {"model": 26, "ngram": 12}, "accepted_by_drafter": {"model": 19, "ngram": 11},
    "stop_reason": "eog", "drafter": "auto", "one_line": "42 tokens",
}


def stored_conversation():
    history = History()
    older = history.create("Sort a list")
    history.add(older.id, "user", "Sort a list in Python")
    conv = history.create("Rename n to count")
    history.add(conv.id, "user", "Rename n to count:\n\ndef tally(items):\n    n = 0\n    for item in items:\n        n += 1\n    return n")
    text = "".join(t for k, t in ANSWER_SPANS if k != "rejected")
    history.add(conv.id, "assistant", text, stats=STATS, spans=ANSWER_SPANS)
    history.close()


async def settle(pilot):
    app = pilot.app
    deadline = time.monotonic() + 10
    while app.engine is None:
        assert time.monotonic() < deadline, "the scripted engine never loaded"
        await pilot.pause(0.02)
    app.clear_notifications()
    for editor in app.query("Input, TextArea"):  # a blinking cursor made the picture depend on the moment
        editor.cursor_blink = False
    await pilot.pause()


@pytest.mark.parametrize("size", [(120, 36), (80, 24)])
def test_main_screen_with_a_finished_speculative_answer(snap_compare, size):
    stored_conversation()
    app = create_app(provider=ScriptedProvider(), config=UserConfig())
    assert snap_compare(app, terminal_size=size, run_before=settle)


def test_details_of_an_answer(snap_compare):
    stored_conversation()
    app = create_app(provider=ScriptedProvider(), config=UserConfig())

    async def open_details(pilot):
        await settle(pilot)
        pilot.app.log_view.query("SummaryLine").last().action_open()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 36), run_before=open_details)


# An answer while it streams: accepted draft, rejected draft where it was rejected, the target's own
# tokens; and the same with rejected tokens hidden (Ctrl+T). The statistics panel is hidden in these
# pictures: its rates depend on the moment.
FIRST_ROUND = [("def tally(items):\n    count", " n", " = 0\n"), ("    for", "", " item")]


def streaming_app():
    hold = threading.Event()  # never set: the answer stays after its first round until the app exits
    return create_app(provider=ScriptedProvider(ScriptedEngine(steps=list(FIRST_ROUND), hold=hold)),
                      config=UserConfig())


async def first_round_shown(pilot):
    await settle(pilot)
    app = pilot.app
    for key in "rename":
        await pilot.press(key)
    await pilot.press("enter")
    deadline = time.monotonic() + 10
    while not (app.log_view.current and app.log_view.current.query(".live")
               and app.log_view.current.query_one(".live").content.plain):
        assert time.monotonic() < deadline, "the first round was never shown"
        await pilot.pause(0.02)
    app.stats.display = False
    app.clear_notifications()
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

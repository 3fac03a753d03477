"""The chat app through Textual's pilot, driven by a scripted engine (see test_tui_real for the real one)."""

import threading
import time

import pytest
from fakes import ScriptedEngine, ScriptedProvider

from localspec.config import ChatSettings, UserConfig
from localspec.history import History
from localspec.tui import spans as sp
from localspec.tui.app import create_app
from localspec.tui.widgets import AssistantMessage, SummaryLine, UserMessage

pytestmark = pytest.mark.anyio


async def until(pilot, condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.02)


def make_app(provider=None, **kwargs):
    """The app, with every notification it shows recorded in `app.notes` (the messages, in order)."""
    app = create_app(provider=provider or ScriptedProvider(), config=UserConfig(), **kwargs)
    app.notes = []
    shown = app.notify

    def notify(message, *args, **kw):
        app.notes.append(str(message))
        return shown(message, *args, **kw)

    app.notify = notify
    return app


def live_text(app) -> str:
    """What the streaming answer's live block shows (drawn at the screen's frame rate)."""
    answer = app.log_view.current
    return answer.query_one(".live").content.plain if answer is not None and answer.query(".live") else ""


async def send(pilot, text):
    for ch in text:
        await pilot.press(ch if ch != " " else "space")
    await pilot.press("enter")


async def test_answer_streams_with_accepted_and_rejected_spans_styled():
    hold = threading.Event()
    provider = ScriptedProvider(ScriptedEngine(hold=hold))
    app = make_app(provider)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "write add")
        await until(pilot, lambda: live_text(app))
        answer = app.log_view.current
        # first round: "def " accepted, nothing rejected, "add" from the target
        assert answer.spans == [(sp.ACCEPTED, "def "), (sp.TARGET, "add")]
        live = answer.query_one(".live")
        content = live.content
        styles = {content.plain[s.start:s.end]: str(s.style) for s in content.spans}
        assert styles["def "] == sp.STYLES[sp.ACCEPTED]
        hold.set()
        await until(pilot, lambda: not app.generating)
        # the rejected ", c" sits where it was rejected, before the target's correction ")"
        assert (sp.REJECTED, ", c") in answer.spans
        kinds = [k for k, _ in answer.spans]
        assert kinds.index(sp.REJECTED) < len(kinds) - 1
        assert answer.text == "def add(a, b):\n    return a + b\n"
        rows = app.history.messages(app.conversation.id)
        assert [r.role for r in rows] == ["user", "assistant"]
        assert rows[1].content == answer.text and rows[1].status == "complete"
        assert [sp.REJECTED, ", c"] in rows[1].spans
        assert rows[1].stats["acceptance_rate"] == pytest.approx(7 / 10)
        # finished: Markdown plus a summary line, and the stats panel shows the summary
        assert answer.query("Markdown") and answer.query_one(SummaryLine).status == "complete"
        assert app.stats.tally.drafted == 10 and app.stats.tally.accepted == 7


@pytest.mark.parametrize("shared", [0, 2])
async def test_the_stats_panel_says_whether_the_answer_is_decoded_with_other_requests(shared):
    """Connected to a server (chat --connect) that decodes other requests' answers in the same steps,
    the live panel says so."""
    hold = threading.Event()
    app = make_app(ScriptedProvider(ScriptedEngine(hold=hold, shared=shared)))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "write add")
        await until(pilot, lambda: "model · " in app.stats.query_one("#stats-numbers").content.plain)
        shown = app.stats.query_one("#stats-numbers").content.plain
        hold.set()
        await until(pilot, lambda: not app.generating)
    assert ("decoded  with 2 other requests" if shared else "decoded  alone") in shown


async def test_the_stats_panel_says_what_each_drafter_proposed_and_the_target_kept():
    """The panel's `kept` row, live and for an answer opened from the history: kept/drafted by drafter."""
    app = make_app(ScriptedProvider(ScriptedEngine()))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "write add")
        await until(pilot, lambda: not app.generating)
        await pilot.pause(0.2)
        live = app.stats.query_one("#stats-numbers").content.plain
        summary = app.history.messages(app.conversation.id)[-1].summary
        app.stats.show_stored(summary)
        await pilot.pause()
        stored = app.stats.query_one("#stats-numbers").content.plain
    # (the scripted answer: 10 tokens drafted by the draft model, 7 of them kept)
    assert (summary.drafted_by_drafter, summary.accepted_by_drafter) == ({"model": 10}, {"model": 7})
    assert "kept     model 7/10" in live and "kept     model 7/10" in stored


async def test_the_log_follows_a_long_answer_until_the_user_scrolls_up():
    steps = [(f"line {i} ", "", "of the answer\n") for i in range(80)]
    app = make_app(ScriptedProvider(ScriptedEngine(steps=steps, delay=0.03)))
    async with app.run_test(size=(80, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "a long one")
        log = app.log_view
        await until(pilot, lambda: live_text(app).count("\n") >= 30)
        await pilot.pause(0.15)  # a frame and its layout
        assert 0 < log.max_scroll_y and log.scroll_y == log.max_scroll_y  # the latest lines are on screen
        log.scroll_to(y=0, animate=False)  # the user scrolls up to read
        await until(pilot, lambda: live_text(app).count("\n") >= 50)
        await pilot.pause(0.15)
        assert log.scroll_y == 0 < log.max_scroll_y
        await until(pilot, lambda: not app.generating, timeout=10)
        await pilot.pause(0.15)
        assert log.scroll_y == 0  # the finished answer leaves the user where they read


async def test_hiding_rejected_tokens_rerenders_the_stream():
    hold = threading.Event()
    app = make_app(ScriptedProvider(ScriptedEngine(steps=[("a", "WRONG", "b"), ("c", "", "d")], hold=hold)))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "x")
        await until(pilot, lambda: live_text(app))
        live = app.log_view.current.query_one(".live")
        assert "WRONG" in live.content.plain
        await pilot.press("ctrl+t")
        assert "WRONG" not in live.content.plain and live.content.plain == "ab"
        hold.set()
        await until(pilot, lambda: not app.generating)


async def test_escape_cancels_and_keeps_the_partial_answer_marked():
    hold = threading.Event()
    app = make_app(ScriptedProvider(ScriptedEngine(hold=hold)))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "go")
        await until(pilot, lambda: app.log_view.current is not None and app.log_view.current.spans)
        await pilot.press("escape")
        await until(pilot, lambda: not app.generating)
        rows = app.history.messages(app.conversation.id)
        assert rows[-1].status == "cancelled" and rows[-1].content == "def add"
        line = app.log_view.query(SummaryLine).last()
        assert line.status == "cancelled" and "cancelled" in line.visual.plain


async def test_conversations_survive_a_restart_and_switching_restores_them():
    provider = ScriptedProvider()
    app = make_app(provider)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "first chat")
        await until(pilot, lambda: not app.generating)
        first = app.conversation.id
        await pilot.press("ctrl+n")
        await send(pilot, "second chat")
        await until(pilot, lambda: not app.generating)
        second = app.conversation.id
        assert first != second
    assert provider.engine.closed  # quitting frees the models

    app = make_app(ScriptedProvider())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        assert app.conversation.id == second  # most recent first
        assert [w.visual.plain for w in app.log_view.query(UserMessage)] == ["second chat"]
        sidebar = app.query_one("#sidebar")
        assert [item.name for item in sidebar.children] == [str(second), str(first)]
        sidebar.index = 1
        sidebar.action_select_cursor()
        await until(pilot, lambda: app.conversation.id == first)
        assert [w.visual.plain for w in app.log_view.query(UserMessage)] == ["first chat"]
        answers = list(app.log_view.query(AssistantMessage))
        assert answers[0].finished and answers[0].text.startswith("def add")
        # the next prompt carries the restored history to the engine
        await send(pilot, "and again")
        await until(pilot, lambda: not app.generating)
        sent = app.provider.engine.calls[-1]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user"] and sent[0]["content"] == "first chat"


async def test_settings_change_what_the_engine_is_asked_for():
    provider = ScriptedProvider()
    app = make_app(provider)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await pilot.press("ctrl+s")
        screen = app.screen
        screen.query_one("#drafter").value = "ngram"
        screen.query_one("#draft_len").value = "3"
        screen.query_one("#temperature").value = "0.5"
        screen.query_one("#max_tokens").value = "64"
        screen.query_one("#system").load_text("Be terse.")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.screen is not screen)
        assert app.settings == ChatSettings(drafter="ngram", draft_len=3, temperature=0.5, max_tokens=64, system="Be terse.")
        await send(pilot, "hi")
        await until(pilot, lambda: not app.generating)
        call = provider.engine.calls[-1]
        assert (call["drafter"], call["draft_len"], call["max_tokens"]) == ("ngram", 3, 64)
        assert call["sampling"].temperature == 0.5
        assert call["messages"][0] == {"role": "system", "content": "Be terse."}
        assert app.history.get(app.conversation.id).settings["drafter"] == "ngram"


async def test_json_output_constrains_the_answer_and_shows_it_as_json():
    steps = [('{"name', "", '": "add",'), (' "args": ', "", "[1, 2]}")]
    provider = ScriptedProvider(ScriptedEngine(steps=steps))
    app = make_app(provider)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await pilot.press("ctrl+s")
        screen = app.screen
        screen.query_one("#output").value = "json"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.screen is not screen)
        assert app.settings.output == "json" and "JSON" in app.stats.drafter_label
        await send(pilot, "a call as JSON")
        await until(pilot, lambda: not app.generating)
        grammar = provider.engine.calls[-1]["sampling"].grammar
        assert grammar and "root" in grammar  # llama.cpp's JSON grammar, through llama-cpp-python
        answer = app.log_view.query(AssistantMessage).last()
        shown = answer.query_one(".answer").source
        assert shown.startswith("```json\n{\n  \"name\": \"add\"") and app.history.messages(
            app.conversation.id)[-1].content == '{"name": "add", "args": [1, 2]}'  # stored as answered


async def test_invalid_settings_are_explained_and_not_saved():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await pilot.press("ctrl+s")
        screen = app.screen
        screen.query_one("#temperature").value = "hot"
        await pilot.press("ctrl+s")
        assert app.screen is screen
        assert "temperature must be a number" in screen.query_one("#settings-error").visual.plain
        await pilot.press("escape")
        assert app.settings == ChatSettings()


async def test_prompt_longer_than_the_context_is_reported_and_nothing_is_lost():
    app = make_app(ScriptedProvider(ScriptedEngine(n_ctx=20)))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "this prompt is far too long for the tiny context")
        await until(pilot, lambda: not app.generating)
        notes = list(app.notes)
        assert any("longer than the context" in n for n in notes)
        rows = app.history.messages(app.conversation.id)
        assert rows[0].content.startswith("this prompt") and rows[1].status == "error"
        # the failed turn is not sent again with the next prompt
        app.engine.n_ctx = 4096
        await send(pilot, "short")
        await until(pilot, lambda: not app.generating)
        assert [m["content"] for m in app.engine.calls[-1]["messages"]] == ["short"]


async def test_engine_error_mid_answer_keeps_the_partial_answer():
    app = make_app(ScriptedProvider(ScriptedEngine(fail_after=2)))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "go")
        await until(pilot, lambda: not app.generating)
        rows = app.history.messages(app.conversation.id)
        assert rows[-1].status == "error" and rows[-1].content == "def add(a, b)"
        assert "llama_decode returned -3" in rows[-1].stats["error"]
        assert app.is_running


async def test_nothing_pulled_pulls_the_default_pair_then_chats():
    provider = ScriptedProvider(ready=False)
    app = make_app(provider)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        assert provider.pulled == ["pair-a"] and provider.loaded == ["pair-a"]


async def test_unknown_model_is_a_notification_and_the_picker_opens():
    app = make_app(entry_id="no-such-model")
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: type(app.screen).__name__ == "ModelPicker")
        assert any("Unknown model" in n for n in app.notes)
        # listed off the loop (and the picker's widgets may not be mounted yet when it is the screen)
        await until(pilot, lambda: any(c.option_count == 2 for c in app.screen.query("#choices")))
        await pilot.press("enter")  # the first, ready choice
        await until(pilot, lambda: app.engine is not None)
        assert app.engine_id == "pair-a"


async def test_drafter_model_without_a_draft_model_is_refused_before_sending():
    app = make_app(ScriptedProvider(ScriptedEngine(draft=False)), drafter="model")
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "hi")
        assert any("needs a draft model" in n for n in app.notes)
        assert app.prompt.text == "hi"  # the prompt stays for the user to send again
        assert app.history.messages(app.conversation.id) == []


async def test_up_recalls_earlier_prompts_and_export_writes_markdown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "one")
        await until(pilot, lambda: not app.generating)
        await send(pilot, "two")
        await until(pilot, lambda: not app.generating)
        await pilot.press("up")
        assert app.prompt.text == "two"
        await pilot.press("up")
        assert app.prompt.text == "one"
        await pilot.press("down")
        assert app.prompt.text == "two"
        app.action_export_conversation()
        app.action_export_conversation()
        files = sorted(p.name for p in tmp_path.glob("localspec-*.md"))
        assert files == ["localspec-one-2.md", "localspec-one.md"]
        text = (tmp_path / "localspec-one.md").read_text()
        assert "## You\n\none" in text and "def add(a, b)" in text


async def test_rename_and_delete_from_the_sidebar():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "keep me")
        await until(pilot, lambda: not app.generating)
        app.action_rename_conversation()
        await until(pilot, lambda: type(app.screen).__name__ == "RenameScreen" and app.screen.query("#title"))
        app.screen.query_one("#title").value = "Renamed"
        await pilot.press("enter")
        await until(pilot, lambda: app.conversation.title == "Renamed")
        app.action_delete_conversation()
        await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen" and app.screen.query("Button"))
        await pilot.press("y")
        await until(pilot, lambda: app.conversation.title != "Renamed")
        assert [c.title for c in app.history.conversations()] == ["New chat"]
        assert app.history.messages(app.conversation.id) == [] and not app.log_view.query(UserMessage)


async def test_quit_while_answering_saves_the_partial_answer_then_frees_the_engine():
    hold = threading.Event()
    provider = ScriptedProvider(ScriptedEngine(hold=hold))
    app = make_app(provider)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "go")
        await until(pilot, lambda: app.log_view.current is not None and app.log_view.current.spans)
        conv = app.conversation.id
        await pilot.press("ctrl+c")
        await until(pilot, lambda: not app.is_running, timeout=5)
    assert provider.engine.closed
    rows = History().messages(conv)
    assert rows[-1].status == "cancelled" and rows[-1].content == "def add"


async def test_help_and_details_screens():
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await pilot.press("question_mark")
        await until(pilot, lambda: type(app.screen).__name__ == "HelpScreen")
        await pilot.press("escape")
        await send(pilot, "hi")
        await until(pilot, lambda: not app.generating)
        app.log_view.query(SummaryLine).last().action_open()
        await until(pilot, lambda: type(app.screen).__name__ == "DetailsScreen" and app.screen.query("#details-spans"))
        assert "def add" in app.screen.query_one("#details-spans").visual.plain


async def test_details_say_how_many_rounds_verified_trees_and_kept_a_second_candidate():
    from localspec.engine.events import Prefill, Round, Tally
    from localspec.tui.screens import DetailsScreen

    tally = Tally()
    for i, (candidates, second) in enumerate([(0, False), (6, True), (6, False)]):
        tally.add(Round(index=i, drafter="model", accepted=(1, 2), rejected=(3,), token=4, token_kind="correction",
                        accepted_text="ab", rejected_text="c", token_text="d", text="abd", draft_s=0.01,
                        verify_s=0.02, candidates=candidates, took_second=second))
    summary = tally.summary(text="abdabdabd", stop_reason="length", prefill=Prefill(4, 4, 0, 0.1), wall_s=1.0,
                            baseline_tokens_per_s=5.0, drafter="model")
    assert (summary.tree_rounds, summary.seconds_kept) == (2, 1)
    assert "trees in 2 rounds (a second candidate kept in 1)" in summary.one_line()
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        app.push_screen(DetailsScreen(summary, None, None, summary.text))
        await until(pilot, lambda: type(app.screen).__name__ == "DetailsScreen" and app.screen.query("#details-spans"))
        shown = " ".join(w.visual.plain for w in app.screen.query("Static"))
        assert "2 rounds verified a second candidate" in shown and "kept one in 1" in shown


class GatedProvider(ScriptedProvider):
    """Loading waits for `gate`; `fail` makes it raise instead."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.gate, self.fail = threading.Event(), fail

    def load(self, entry_id):
        self.gate.wait(10)
        if self.fail:
            from localspec.errors import LocalspecError

            raise LocalspecError("the file is truncated")
        return super().load(entry_id)


async def test_a_message_sent_while_the_model_loads_is_sent_once_it_is_ready():
    provider = GatedProvider()
    app = make_app(provider)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.loading is not None)
        await send(pilot, "are you there")
        assert app.prompt.text == "" and not app.generating  # taken, shown, waiting
        assert [w.visual.plain for w in app.log_view.query(UserMessage)] == ["are you there"]
        assert any("Sent once pair-a is loaded" in note for note in app.notes)
        provider.gate.set()
        await until(pilot, lambda: app.engine is not None)
        answered = lambda: [r.status for r in app.history.messages(app.conversation.id)][-1:] == ["complete"]
        await until(pilot, lambda: len(app.history.messages(app.conversation.id)) == 2 and answered())
        await until(pilot, lambda: not app.generating)
        rows = app.history.messages(app.conversation.id)
        assert [(r.role, r.status) for r in rows] == [("user", "complete"), ("assistant", "complete")]
        assert rows[0].content == "are you there" and rows[1].content.startswith("def add")
        assert provider.engine.calls[-1]["messages"][-1] == {"role": "user", "content": "are you there"}
        assert [w.visual.plain for w in app.log_view.query(UserMessage)] == ["are you there"]  # shown once


async def test_a_message_waiting_for_a_model_that_fails_to_load_goes_back_into_the_prompt():
    provider = GatedProvider(fail=True)
    app = make_app(provider)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.loading is not None)
        await send(pilot, "hello")
        provider.gate.set()
        await until(pilot, lambda: app.loading is None)
        await until(pilot, lambda: app.prompt.text == "hello")
        assert not app.log_view.query(UserMessage) and not app.history.messages(app.conversation.id)


async def test_the_answer_is_saved_as_it_streams_and_shown_interrupted_after_a_crash():
    """The history holds the answer while it streams; a process that dies mid-answer leaves it there,
    and the next start shows it marked interrupted (here the first app is abandoned, not closed)."""
    hold = threading.Event()
    app = make_app(ScriptedProvider(ScriptedEngine(hold=hold)))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "write add")
        await until(pilot, lambda: live_text(app))
        conversation = app.conversation.id
        await until(pilot, lambda: History().messages(conversation)[-1].content == "def add", timeout=5)
        saved = History().messages(conversation)[-1]
        assert saved.status == "streaming" and [sp.ACCEPTED, "def "] in saved.spans
        crashed = History()  # what a second process sees while the first is mid-answer
        hold.set()
        await until(pilot, lambda: not app.generating)
    crashed.update_message(saved.id, "def add", status="streaming", spans=saved.spans)  # as the crash left it
    app = make_app(ScriptedProvider())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        answer = app.log_view.query(AssistantMessage).last()
        assert answer.finished and answer.status == "interrupted" and answer.text == "def add"
        assert "interrupted" in answer.query_one(SummaryLine).visual.plain
        assert History().messages(conversation)[-1].status == "interrupted"


def test_chat_draws_in_the_settings_chooses_whether_the_app_yields_the_cpu():
    from localspec import paths
    from localspec.config import load_user_config
    from localspec.errors import LocalspecError
    from localspec.tui.remote import RemoteProvider

    settings = paths.ensure(paths.config_dir()) / "settings.yaml"
    try:
        assert create_app(provider=ScriptedProvider(), yield_cpu=None).yield_cpu is False  # smooth by default
        # a client of a server always yields: its drawing never waits on the engine's thread
        assert create_app(provider=RemoteProvider(paths.server_socket()), yield_cpu=None).yield_cpu is True
        settings.write_text("chat_draws: sparingly\n")
        assert create_app(provider=ScriptedProvider(), yield_cpu=None).yield_cpu is True
        settings.write_text("chat_draws: sometimes\n")
        with pytest.raises(LocalspecError, match="chat_draws must be smooth or sparingly"):
            load_user_config()
    finally:
        settings.unlink(missing_ok=True)


class SlowMaintenance(ScriptedEngine):
    """Between answers the engine measures its costs until interrupted (as the real one may)."""

    def maintain(self, interrupt=lambda: False) -> str:
        deadline = time.monotonic() + 30
        while not interrupt() and time.monotonic() < deadline:
            time.sleep(0.01)
        return ""


async def test_the_next_prompt_interrupts_the_engines_work_between_answers():
    """The engine's calls share one thread, so the work it does after an answer must give way to the
    next prompt instead of holding it."""
    app = make_app(ScriptedProvider(SlowMaintenance()))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.engine is not None)
        await send(pilot, "one")
        await until(pilot, lambda: not app.generating)
        await pilot.pause(0.2)  # the engine's thread is in maintain() now
        started = time.monotonic()
        await send(pilot, "two")
        await until(pilot, lambda: len(app.history.messages(app.conversation.id)) == 4 and not app.generating)
        assert time.monotonic() - started < 5

"""The chat's conversation logic without a screen: titles, settings, context, export, deletion."""

from localspec.config import ChatSettings, UserConfig
from localspec.history import History
from localspec.tui.conversations import NEW_TITLE, Conversations


def chats(drafter=None, **chat) -> Conversations:
    return Conversations(History(), UserConfig(chat=ChatSettings(**chat)), drafter)


def test_a_first_prompt_titles_the_conversation_and_the_context_skips_failed_turns():
    c = chats(system="Be terse.")
    c.open(c.most_recent().id)
    assert c.current.title == NEW_TITLE
    c.add_prompt("Sort a list\nin Python")
    assert c.current.title == "Sort a list"
    c.start_answer()
    c.finish_answer("sorted(xs)", "complete", {"drafted": 3}, [["target", "sorted(xs)"]])
    c.add_prompt("and reversed?")
    c.start_answer()
    c.finish_answer("", "error", {"error": "llama_decode returned -3"}, [])
    c.add_prompt("and reversed, please?")
    assert c.context_messages() == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Sort a list\nin Python"},
        {"role": "assistant", "content": "sorted(xs)"},
        {"role": "user", "content": "and reversed, please?"},
    ]


def test_an_answer_saved_as_it_streams_survives_a_crash_marked_interrupted(tmp_path):
    """The app killed mid-answer: the next start finds what was saved, marked interrupted, and it counts
    as the assistant's turn in the context (as a cancelled answer does)."""
    path = tmp_path / "history.sqlite3"
    c = Conversations(History(path), UserConfig(), None)
    c.open(c.most_recent().id)
    c.add_prompt("Count to five")
    c.start_answer()
    c.save_partial("1, 2, 3", [("target", "1, 2"), ("accepted", ", 3")])
    streaming = c.history.messages(c.current.id)[-1]
    assert (streaming.status, streaming.content) == ("streaming", "1, 2, 3")
    # (no finish_answer: the process dies here; a new one opens the same file)
    again = Conversations(History(path), UserConfig(), None)
    rows = again.open(c.current.id)
    assert (rows[-1].status, rows[-1].content, rows[-1].spans) == \
        ("interrupted", "1, 2, 3", [["target", "1, 2"], ["accepted", ", 3"]])
    assert again.context_messages()[-1] == {"role": "assistant", "content": "1, 2, 3"}
    assert "## Assistant (interrupted)" in again.history.to_markdown(c.current.id)


def test_a_finished_answer_replaces_what_was_saved_as_it_streamed(tmp_path):
    c = Conversations(History(tmp_path / "h.sqlite3"), UserConfig(), None)
    c.open(c.most_recent().id)
    c.add_prompt("Hi")
    c.start_answer()
    c.save_partial("Hel", [("target", "Hel")])
    c.finish_answer("Hello!", "complete", {"drafted": 0}, [("target", "Hello!")])
    rows = c.history.messages(c.current.id)
    assert [(r.role, r.status, r.content) for r in rows] == [("user", "complete", "Hi"),
                                                             ("assistant", "complete", "Hello!")]
    assert Conversations(History(tmp_path / "h.sqlite3"), UserConfig(), None).history.messages(c.current.id) == rows


def test_settings_per_conversation_and_the_drafter_override_on_start():
    c = chats(drafter="ngram", temperature=0.5)
    first = c.most_recent()
    c.open(first.id, apply_override=True)
    assert c.settings.drafter == "ngram" and c.settings.temperature == 0.5
    c.save_settings(ChatSettings(drafter="none", max_tokens=64))
    second = c.create()
    c.open(second.id)
    assert c.settings.drafter == "ngram"  # a new conversation starts from the user's settings and the override
    c.open(first.id)
    assert c.settings == ChatSettings(drafter="none", max_tokens=64)  # kept with its conversation
    assert c.settings_label() == "none, adaptive, greedy"


def test_export_never_overwrites_and_delete_leaves_a_conversation(tmp_path):
    c = chats()
    c.open(c.most_recent().id)
    c.add_prompt("Hello there")
    paths = [c.export(tmp_path), c.export(tmp_path)]
    assert [p.name for p in paths] == ["localspec-hello-there.md", "localspec-hello-there-2.md"]
    assert "Hello there" in paths[0].read_text()
    nxt = c.delete_current(model=None)  # the last one: a new, empty conversation takes its place
    assert [row.id for row in c.history.conversations()] == [nxt.id]
    assert nxt.title == NEW_TITLE and c.history.messages(nxt.id) == []

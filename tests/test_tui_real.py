"""The chat app end to end on the real engine: SmolLM2-135M through llama.cpp, no fakes."""

import sys
import time

import pytest

from localspec.config import ChatSettings, UserConfig
from localspec.tui import spans as sp
from localspec.tui.app import create_app
from localspec.tui.engine_thread import ENGINE_SWITCH_S
from localspec.tui.provider import LocalProvider

pytestmark = [pytest.mark.anyio, pytest.mark.model]


async def until(pilot, condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await pilot.pause(0.05)


async def test_real_engine_streams_through_the_ui(smollm2_path):
    # A fixed draft length: whether adaptive copies pay depends on this CPU's verify costs (on a steep
    # AVX2 cost shape the planner may draft nothing), and this test is about showing drafts.
    config = UserConfig(chat=ChatSettings(max_tokens=40, drafter="ngram", draft_len=4))
    app = create_app(str(smollm2_path), provider=LocalProvider(n_ctx=1024), config=config)
    pythons_own = sys.getswitchinterval()
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.engine is not None, 120)
        assert sys.getswitchinterval() == ENGINE_SWITCH_S < pythons_own  # the engine's thread waits less
        for ch in "List the days of the week, then list them again.":
            await pilot.press(ch if ch != " " else "space")
        await pilot.press("enter")
        await until(pilot, lambda: len(app.history.messages(app.conversation.id)) == 2 and not app.generating, 120)
        rows = app.history.messages(app.conversation.id)
        assert rows[-1].role == "assistant" and rows[-1].status == "complete", rows[-1]
        stats = rows[-1].stats
        assert stats["generated_tokens"] > 0 and stats["baseline_tokens_per_s"] > 0
        spans = [tuple(s) for s in rows[-1].spans]
        assert sp.answer_text(spans) == rows[-1].content
        # the engine's own counts agree with what the UI recorded
        assert stats["drafted"] == app.stats.tally.drafted and stats["accepted"] == app.stats.tally.accepted
        assert stats["generated_tokens"] == app.stats.tally.generated
        # a list said twice: the n-gram drafter gets accepted tokens, and they are coloured as such
        assert stats["accepted"] > 0
        assert "".join(t for k, t in spans if k == sp.ACCEPTED)
        engine = app.engine
    assert engine.target.closed  # quitting freed the model
    assert sys.getswitchinterval() == pythons_own

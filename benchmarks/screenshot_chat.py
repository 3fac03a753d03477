"""Render the chat screen after a real answer, for the README: assets/chat.svg.

    LOCALSPEC_HOME=... .venv/bin/python benchmarks/screenshot_chat.py [PAIR] [--out assets/chat.svg]

Uses the models already pulled in LOCALSPEC_HOME and a throwaway history.
"""

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

PROMPT = (
    "Rename the variable n to count everywhere. Reply with the code only.\n\n"
    "def tally(items):\n    n = 0\n    for item in items:\n        if item:\n            n += 1\n    return n\n\n"
    "def average(items):\n    n = tally(items)\n    total = sum(items)\n    return total / n if n else 0.0\n"
)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pair", nargs="?", default="qwen2.5-coder-1.5b")
    parser.add_argument("--out", default="assets/chat.svg")
    parser.add_argument("--chars", type=int, default=330, help="take the picture once the answer is this long")
    args = parser.parse_args()

    from localspec.config import ChatSettings, UserConfig
    from localspec.history import History
    from localspec.tui.app import create_app

    history = History(Path(tempfile.mkdtemp()) / "history.sqlite3")
    app = create_app(args.pair, history=history, config=UserConfig(chat=ChatSettings(max_tokens=160)))
    async with app.run_test(size=(120, 40)) as pilot:
        while app.engine is None:
            await pilot.pause(0.1)
        app.prompt.load_text(PROMPT)
        await pilot.press("enter")
        await pilot.pause(0.5)
        # Mid-answer, so the accepted and rejected draft tokens are still coloured in.
        while app.generating and len(app.log_view.current.text if app.log_view.current else "") < args.chars:
            await pilot.pause(0.05)
        app.clear_notifications()
        app.save_screenshot(os.path.basename(args.out), path=os.path.dirname(args.out) or ".")
        while app.generating:
            await pilot.pause(0.1)
        print(app.history.messages(app.conversation.id)[-1].stats["one_line"])


if __name__ == "__main__":
    asyncio.run(main())

"""The real llama.vim plugin (unmodified, ../shared/clients/llama.vim) in vim, driven in tmux, against
`localspec serve` on a real FIM model: ghost text appears, Tab inserts it, the buffer ends at a line
boundary and parses, and a completion after a save reuses the cache."""

from __future__ import annotations

import ast
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from localspec.loader import load
from localspec.server.run import served_for, start_in_thread

pytestmark = pytest.mark.model

PLUGIN = Path(__file__).resolve().parent.parent.parent / "shared" / "clients" / "llama.vim"
SOURCE = '''import math


def circle_area(r):
    return math.pi * r * r


def square_area(s):
    return


def main():
    print(circle_area(1.0), square_area(2.0))
'''
CURSOR_LINE = 9  # "    return": the completion goes on from "    return s"


def _require_tools() -> None:
    for tool in ("vim", "tmux", "curl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (setup.sh installs vim and tmux with apt where it can)")
    if not (PLUGIN / "autoload" / "llama.vim").exists():
        pytest.skip(f"the llama.vim client is not at {PLUGIN} (it comes with the project's shared folder)")


@pytest.fixture(scope="module")
def editor_server(qwen_coder_path):
    engine = load(str(qwen_coder_path), n_ctx=8192, calibrate=False, slots=2, history="memory",
                  cache_reuse=16)  # as `localspec serve`
    # Greedy (`serve --temp 0`): the plugin sets no temperature, and a sampled suggestion from a 0.5B model
    # would make what Tab inserts a matter of luck.
    running = start_in_thread(served_for(engine, "qwen2.5-coder-0.5b-instruct", temperature=0.0))
    yield running
    running.stop()
    running.served.scheduler.close()


class Vim:
    """vim in a detached tmux session on a private tmux server."""

    def __init__(self, folder: Path, vimrc: Path, file: Path):
        self.socket = f"localspec-test-{int(time.time() * 1000)}"
        self._tmux("new-session", "-d", "-s", "vim", "-x", "110", "-y", "32", "-c", str(folder),
                   f"vim -N -u {vimrc} -i NONE -n {file}")

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=20,
                              check=True).stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "vim", *keys)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "vim")

    def wait(self, condition, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if condition(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{what} did not happen within {timeout:.0f} s; the screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=20)


def _suggestion_after(typed: str):
    """A screen where the line being typed shows more than was typed: the suggestion, drawn inline."""
    def seen(screen: str) -> bool:
        return any(line.startswith(typed) and line[len(typed):].strip() for line in screen.splitlines())
    return seen


def test_llama_vim_completes_in_vim_and_tab_inserts_whole_lines(editor_server):
    _require_tools()
    folder = Path(tempfile.mkdtemp(prefix="lsvim"))
    file = folder / "shapes.py"
    file.write_text(SOURCE + "\n")
    vimrc = folder / "vimrc"
    url = editor_server.url
    vimrc.write_text(
        "set nocompatible noswapfile shortmess+=I\n"
        f"set runtimepath^={PLUGIN}\n"
        f"let g:llama_config = {{'endpoint_fim': '{url}/infill', 'endpoint_inst': '{url}/v1/chat/completions',"
        " 'ring_update_ms': 200, 'show_info': 0}\n"
    )
    vim = Vim(folder, vimrc, file)
    try:
        screen = vim.wait(lambda s: "def square_area(s):" in s or "Press ENTER" in s, 20, "vim starting")
        if "Press ENTER" in screen:  # vim 9.0: the plugin warns that it asks for 9.1, and works
            vim.keys("Enter")
            vim.wait(lambda s: "def square_area(s):" in s, 20, "vim showing the file")
        vim.keys(":" + str(CURSOR_LINE), "Enter", "A", " s")
        # The plugin samples (top-k, top-p) and drops suggestions that repeat the file: keep typing, as a
        # user would, until one shows. What is typed here is valid code on its own.
        typed = "    return s"
        for more in ("", " ", "*", " ", "s"):
            if more:
                vim.keys("Space" if more == " " else more)
                typed += more
            try:
                screen = vim.wait(_suggestion_after(typed), 15, f"a suggestion after {typed!r}")
                break
            except AssertionError:
                continue
        else:
            raise AssertionError(f"no suggestion was shown; the server saw {list(editor_server.served.scheduler.recent)}")
        vim.keys("Tab")
        vim.wait(lambda s: "-- INSERT --" in s, 10, "the suggestion accepted")
        time.sleep(0.3)
        vim.keys("Escape")
        vim.wait(lambda s: "-- INSERT --" not in s, 10, "normal mode")
        vim.keys(":w", "Enter")
        try:
            vim.wait(lambda s: "written" in s, 5, "vim writing the file")
        except AssertionError:  # a key lost in a mapping that was still running: Esc and write again
            vim.keys("Escape", "Escape", ":w", "Enter")
        deadline = time.monotonic() + 20
        text = SOURCE
        while time.monotonic() < deadline:  # until vim has written the whole buffer
            text = file.read_text()
            if text != SOURCE and text.endswith("\n") and "def main():" in text:
                break
            time.sleep(0.2)
        lines = text.splitlines()
        assert lines[:CURSOR_LINE - 1] == SOURCE.splitlines()[:CURSOR_LINE - 1]
        completed = lines[CURSOR_LINE - 1]
        assert completed.startswith(typed) and len(completed) > len(typed), (typed, screen, text, vim.screen())
        ast.parse(text)  # whole lines: the completion did not stop half-way through a statement
        assert text.endswith("\n") and "def main():" in text, text

        # After the save (llama.vim then sends a cache-warming request with the chunk it picked), the
        # next completion must not start from an empty cache.
        time.sleep(1.0)
        def completions() -> list:
            return [r for r in editor_server.served.scheduler.recent if r[0] == "infill" and r[1] > 1]
        seen = len(completions())
        vim.keys(":" + str(CURSOR_LINE), "Enter", "o", "    x")
        vim.wait(lambda _s: len(completions()) > seen, 60, "a completion request after the save")
        _endpoint, _budget, prompt_tokens, cached = completions()[-1]
        assert cached > 0, (prompt_tokens, cached)
    finally:
        vim.close()

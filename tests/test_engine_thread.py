"""The chat app's thread gives up its priority, and the engine's thread (and llama.cpp's threads, which
it starts) keep theirs. Run in a child process: priorities are inherited, and the test run's own must
stay as it is."""

import json
import subprocess
import sys

import pytest

PROBE = """
import json, os, threading
from localspec.tui.engine_thread import UI_NICE, EngineThread, lower_priority

def nice():
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

def child():
    out = []
    thread = threading.Thread(target=lambda: out.append(nice()))
    thread.start()
    thread.join()
    return out[0]

before = nice()
engine = EngineThread()
lowered = lower_priority()
print(json.dumps({"before": before, "lowered": lowered, "ui": nice(), "ui_child": child(),
                  "engine": engine.run(nice), "engine_child": engine.run(child), "ui_nice": UI_NICE}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="priorities are per thread on Linux only")
def test_the_app_lowers_its_own_priority_and_the_engine_keeps_its_own():
    got = json.loads(subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                                    timeout=60).stdout)
    assert got["lowered"] and got["ui"] == got["ui_child"] == max(got["ui_nice"], got["before"])
    assert got["engine"] == got["engine_child"] == got["before"] < got["ui"]

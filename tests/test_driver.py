"""The engine's one thread (engine/driver.py): calls run there between turns, a policy's turns run
while it has work, and an idle driver holds no thread."""

from __future__ import annotations

import threading
import time

import pytest

from localspec.engine import driver as driver_module
from localspec.engine.driver import Driver


class Countdown:
    """A policy with `left` turns of work; each turn notes the thread it ran on."""

    def __init__(self, left: int = 0) -> None:
        self.left = left
        self.threads: list[str] = []

    def wanted(self) -> bool:
        return self.left > 0

    def turn(self) -> None:
        self.threads.append(threading.current_thread().name)
        self.left -= 1


def test_a_call_runs_on_the_drivers_thread_and_hands_back_its_result_or_error():
    driver = Driver(name="the-driver")
    assert driver.run(lambda: threading.current_thread().name) == "the-driver"
    with pytest.raises(ZeroDivisionError):
        driver.run(lambda: 1 / 0)
    # Within the driver's own work a call runs at once (waiting for itself would never end).
    assert driver.run(lambda: driver.run(lambda: threading.current_thread().name)) == "the-driver"
    assert driver.close()


def test_a_policys_turns_run_on_the_drivers_thread_while_it_has_work():
    driver = Driver(name="the-driver")
    policy = Countdown()
    driver.drive(policy)
    with driver.changed:
        policy.left = 3
    driver.wake()
    deadline = time.monotonic() + 10
    while policy.left and time.monotonic() < deadline:
        time.sleep(0.01)
    assert policy.left == 0 and policy.threads == ["the-driver"] * 3
    assert driver.close()


def test_an_idle_driver_lets_its_thread_end_and_starts_one_for_the_next_call(monkeypatch):
    monkeypatch.setattr(driver_module, "LINGER_S", 0.05)
    driver = Driver()
    first = driver.run(threading.current_thread)
    deadline = time.monotonic() + 10
    while first.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not first.is_alive()  # nothing to do: no thread held (an unused engine can be freed)
    second = driver.run(threading.current_thread)
    assert second is not first and second is not threading.current_thread()
    assert driver.close()
    with pytest.raises(RuntimeError, match="closed"):
        driver.run(lambda: None)

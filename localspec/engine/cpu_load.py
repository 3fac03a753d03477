"""What the CPU was doing while something was measured: this process's share of the cores it asked for,
and the share of every core other programs used (engine/calibration.py trusts a measurement by them)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class CpuSample:
    wall: float
    process_s: float            # CPU time of this process, every thread
    system_busy_s: float | None  # CPU time of the whole machine, every core; None where unreadable


def read_system_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot (Linux's /proc/stat), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def cpu_sample() -> CpuSample:
    return CpuSample(time.perf_counter(), time.process_time(), read_system_busy_s())


def cpu_usage(a: CpuSample, b: CpuSample, threads: int, cores: int) -> tuple[float, float | None]:
    """(the share of `threads` cores this process used, the share of all `cores` others used) between samples."""
    wall = max(b.wall - a.wall, 1e-9)
    own = b.process_s - a.process_s
    share = own / (wall * max(threads, 1))
    if a.system_busy_s is None or b.system_busy_s is None:
        return share, None
    others = max(b.system_busy_s - a.system_busy_s - own, 0.0) / (wall * max(cores, 1))
    return share, min(others, 1.0)


def others_busy_now(seconds: float = 0.3, sample: Callable[[], CpuSample] = cpu_sample) -> float | None:
    """The share of every core other programs use now (this process idle meanwhile), or None."""
    a = sample()
    time.sleep(seconds)
    return cpu_usage(a, sample(), 1, os.cpu_count() or 1)[1]

"""Verify costs by batch size, measured on this machine, and whether a measurement deserves trust.

Drafts are priced by the shape of these costs (how much dearer n positions are than one), so a shape
measured while another program used the CPU is paid for in every later answer: llama.cpp's threads
spin at barriers, and a preempted thread costs an order of magnitude, not its share. The rules:

- A measurement is trusted only if its passes agree, llama.cpp's threads got their CPU time, and no
  other program used a large share of the CPU meanwhile (`assess`). Only trusted ones are cached.
- An untrusted one is used for the session it was taken in, and measured again between requests, at a
  quiet moment (`Calibrator.remeasure`, called through `Engine.maintain`); so is a cached one that live
  one-token rounds keep contradicting (`Calibrator.due`).
- A cached entry carries when and how it was measured (`Calibration`); `localspec doctor` lists them.

benchmarks/verify_costs.py prints the table; benchmarks/calibration_noise.py prints what the checks see
with and without another llama.cpp process decoding.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from time import perf_counter
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from localspec import paths
from localspec.engine.costs import WARM_VERIFIES, CostModel
from localspec.engine.cpu_load import CpuSample, cpu_sample, cpu_usage, others_busy_now
from localspec.engine.measuring import CALIBRATION_SIZES, Interrupted, costs_of, measure, spread_of
from localspec.engine.model import LanguageModel

# Trust thresholds.
# Each size's median pass over its fastest, the median over sizes: one slow pass in three (a spell of
# page faults at a first start, a stray timer) leaves the fastest pass corroborated; passes that mostly
# disagree do not. It does not tell a busy machine alone: the CPU readings below do.
MAX_SPREAD = 1.25
MIN_CPU_SHARE = 0.7      # CPU time the process got over wall time x threads, while it decoded on the CPU
MAX_OTHERS_BUSY = 0.3    # share of every core that other programs used meanwhile
QUIET_OTHERS_BUSY = 0.15  # a moment quiet enough to start measuring again
# Live one-token rounds contradict a calibration when their median is this far from its one-token cost
# either way, over at least CONTRADICTION_SAMPLES rounds at short contexts (the calibration's own is 48
# tokens; one-token decoding barely slows by 512). Another llama.cpp process beside it costs several
# times a token's price, while a quiet virtual machine's live rounds drift well below that around a
# calibration (memory bandwidth shared with other machines): the threshold tells the two apart, and a
# drift alone never makes a request wait for a measurement (docs/tuning.md, "Calibration").
CONTRADICTION = 2.0
CONTRADICTION_SAMPLES = 16
SHORT_CONTEXT = 512
# The learnt speed factor (CostModel.scale) away from the last checked value by this much, for this
# many rounds, also asks for a new measurement (a long chat's verify batches cost more than at 48
# tokens: after a measurement that agrees, the factor it sits at becomes the new reference).
SCALE_DRIFT = 1.5
SCALE_DRIFT_ROUNDS = 64
RETRY_AFTER_S = 60.0     # wait before measuring again after an untrusted remeasurement
# A change of batch shape is priced (CostModel.changed_s) where it costs at least this share of one
# position. On a GPU ggml-cuda captures a graph per shape; on a CPU llama.cpp reuses the graph it built
# while the shape holds, which matters for small models only (docs/gpu.md, "Steady shapes"), so there
# only the small sizes most verifies have are measured again.
SHAPE_NOISE = 0.25
STEADY_CPU_SIZES = (1, 2, 3, 4)
CPU_GRAPH_REBUILD_S = 0.002  # at most what building a graph again takes on a CPU: dearer positions skip the pass


@dataclass(frozen=True)
class Calibration:
    """One calibration: seconds per batch size, and when and how it was measured."""

    costs: dict[int, float]
    measured_at: float = 0.0          # Unix time
    passes: int = 0
    spread: float = 1.0               # median over fastest pass of a size, median over sizes (spread_of)
    cpu_share: float | None = None    # None: not decoded on this CPU (GPU, RPC), or not measured
    others_busy: float | None = None  # None: the system's CPU use cannot be read here
    problem: str = ""                 # why it is not trusted; "" when it is
    # Each size again after verifies of its own shape (`steady_sizes`; empty where none needed it):
    # `costs` are what a size costs right after the shape changed (`measure`'s sizes in turn). None:
    # cached before steady costs were measured.
    steady: dict[int, float] | None = None

    @property
    def trusted(self) -> bool:
        return not self.problem

    def tables(self) -> tuple[dict[int, float], dict[int, float] | None]:
        """(steady costs, costs after a change of shape), as CostModel takes them; (costs, None) where a
        change costs less than SHAPE_NOISE of a position at every size measured both ways."""
        if not self.steady:
            return dict(self.costs), None
        steady = {n: min(self.steady.get(n, c), c) for n, c in self.costs.items()}
        change = max((self.costs[n] - steady[n] for n in self.steady if n in self.costs), default=0.0)
        if change < SHAPE_NOISE * self.smallest[1]:
            return dict(self.costs), None
        return steady, dict(self.costs)

    @property
    def smallest(self) -> tuple[int, float]:
        """The smallest batch measured and its cost (one position, for verify costs)."""
        n = min(self.costs)
        return n, self.costs[n]

    def headline(self) -> str:
        """'1 position 29.6 ms', as `doctor` and `calibrate` print it."""
        n, seconds = self.smallest
        return f"{n} position{'s' if n > 1 else ''} {seconds * 1e3:.1f} ms"

    def to_json(self) -> dict:
        data = asdict(self)
        data["costs"] = {str(k): v for k, v in self.costs.items()}
        data["steady"] = None if self.steady is None else {str(k): v for k, v in self.steady.items()}
        return data

    @classmethod
    def from_json(cls, data: object) -> "Calibration | None":
        """A cached entry; None for one of the format before entries carried how they were measured
        (nothing says it was not taken under load) or a damaged one."""
        if not isinstance(data, dict) or not isinstance(data.get("costs"), dict):
            return None
        try:
            costs = {int(k): float(v) for k, v in data["costs"].items()}
            steady = data.get("steady")
            steady = {int(k): float(v) for k, v in steady.items()} if isinstance(steady, dict) else None
            return cls(costs=costs, measured_at=float(data.get("measured_at", 0.0)), passes=int(data.get("passes", 0)),
                       spread=float(data.get("spread", 1.0)), cpu_share=_opt_float(data.get("cpu_share")),
                       others_busy=_opt_float(data.get("others_busy")), problem=str(data.get("problem", "")),
                       steady=steady)
        except (TypeError, ValueError):
            return None

    def how(self) -> str:
        parts = [f"{self.passes} passes agreeing within {self.spread - 1:.0%}"]
        if self.cpu_share is not None:
            parts.append(f"llama.cpp's threads got {min(self.cpu_share, 1.0):.0%} of their CPU time")
        if self.others_busy is not None:
            parts.append(f"other programs used {self.others_busy:.0%} of the CPU")
        return ", ".join(parts)


def _opt_float(value) -> float | None:
    return None if value is None else float(value)


def assess(spread: float, cpu_share: float | None, others_busy: float | None, passes: int) -> str:
    """Why a measurement is not to be trusted, or "" when it is."""
    if passes > 1 and spread > MAX_SPREAD:
        return f"its passes disagreed by {spread - 1:.0%}"
    if cpu_share is not None and cpu_share < MIN_CPU_SHARE:
        return f"llama.cpp's threads got only {cpu_share:.0%} of their CPU time (another program was running)"
    if others_busy is not None and others_busy > MAX_OTHERS_BUSY:
        return f"other programs used {others_busy:.0%} of the CPU meanwhile"
    return ""


def on_this_cpu(model: LanguageModel) -> bool:
    """Whether the model decodes on this machine's CPU (its threads' CPU time then says whether they ran)."""
    opts = model.options
    return opts.gpu_layers() == 0 and not opts.placement


def steady_sizes(model: LanguageModel, sizes, costs: dict[int, float]) -> list[int]:
    """The sizes to measure again steady: every one off this CPU; on it the small ones, and none where a
    rebuilt graph (CPU_GRAPH_REBUILD_S) is under SHAPE_NOISE of the cheapest batch."""
    if not on_this_cpu(model):
        return list(sizes)
    if not costs or SHAPE_NOISE * min(costs.values()) > CPU_GRAPH_REBUILD_S:
        return []
    return [n for n in sizes if n in STEADY_CPU_SIZES]


def take(model, sizes=CALIBRATION_SIZES, repeats: int = 3, prefill: bool = False,
         interrupt: Callable[[], bool] = lambda: False, sample: Callable[[], CpuSample] | None = None,
         clock: Callable[[], float] | None = None, now: Callable[[], float] = time.time) -> Calibration:
    """Measure and assess one calibration (`sample`: how the CPU's use is read, `cpu_sample` by
    default; `clock`: `perf_counter` by default; both looked up when called, for tests)."""
    sample, clock = sample or cpu_sample, clock or perf_counter
    before = sample()
    passes = measure(model, sizes, repeats=repeats, prefill=prefill, interrupt=interrupt, clock=clock)
    after = sample()
    threads = model.options.threads()
    share, others = cpu_usage(before, after, threads, os.cpu_count() or 1)
    cpu_share = share if on_this_cpu(model) else None
    spread = spread_of(passes)
    costs, steady = costs_of(passes), None
    if not prefill:
        shapes = steady_sizes(model, sizes, costs)
        steady = costs_of(measure(model, shapes, repeats=1, interrupt=interrupt, clock=clock,
                                  steady=WARM_VERIFIES)) if shapes else {}
    return Calibration(costs=costs, measured_at=now(), passes=repeats, spread=spread,
                       cpu_share=cpu_share, others_busy=others,
                       problem=assess(spread, cpu_share, others, repeats), steady=steady)


# ----------------------------------------------------------------------------- the cache


def machine_key(model_path: Path, threads: int, gpu_layers: int) -> str:
    st = os.stat(model_path)
    return "|".join(str(x) for x in (
        Path(model_path).resolve(), st.st_size, int(st.st_mtime), platform.node(), os.cpu_count(), threads, gpu_layers,
    ))


def cache_key(model: LanguageModel, sizes=CALIBRATION_SIZES, prefill: bool = False) -> str | None:
    """Where this model's calibration is cached: its file, this machine, the build, the settings that
    change costs. None for a model without a file (tests' toys)."""
    path = model.path
    if path is None or not Path(path).exists():
        return None
    opts = model.options
    key = machine_key(Path(path), opts.threads(), opts.gpu_layers()) + f"|{model.n_ctx}|{','.join(map(str, sizes))}"
    key += f"|{model.build}"  # a rebuilt llama.cpp (other kernels) is measured again
    if opts.placement:
        key += f"|{opts.placement}"  # verify costs through RPC workers are theirs and the network's
    if opts.flash_attn is not None:
        key += f"|fa={opts.flash_attn}"  # a verify batch's cost grows with the context faster with it
    return key + ("|prefill" if prefill else "")


def read_cache() -> dict:
    try:
        data = json.loads(paths.calibration_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_cached(key: str) -> Calibration | None:
    """A trusted cached calibration, or None."""
    found = Calibration.from_json(read_cache().get(key))
    return found if found is not None and found.trusted else None


def store_cached(key: str, calibration: Calibration) -> None:
    """Cache a trusted calibration (untrusted ones are refused here, whoever asks)."""
    if not calibration.trusted:
        return
    file = paths.calibration_file()
    data = read_cache()
    data[key] = calibration.to_json()
    try:
        paths.ensure(file.parent)
        tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, file)
    except OSError:
        pass  # a full disk: measured again at the next load, nothing lost


def calibrated_costs(model, enabled: bool = True, sizes=CALIBRATION_SIZES, prefill: bool = False) -> dict[int, float]:
    """Costs by batch size (`prefill`: prefill costs, see `measure`): a trusted cached calibration of
    this model file on this machine, or a new measurement (cached when trusted)."""
    return Calibrator(model, enabled, sizes=sizes, prefill=prefill).current.costs


# ----------------------------------------------------------------------------- one model's calibration


class Calibrator:
    """One model's calibration for an engine's life: a trusted cached one (`force`: never), or measured
    at load; measured again between requests (`remeasure`) while `due` says why.

    `sample`, `clock`, `now` and `quiet` are injectable for tests."""

    def __init__(self, model: LanguageModel, enabled: bool = True, sizes=CALIBRATION_SIZES, prefill: bool = False, *,
                 force: bool = False, sample: Callable[[], CpuSample] | None = None,
                 clock: Callable[[], float] | None = None, now: Callable[[], float] = time.time,
                 quiet: Callable[[], float | None] | None = None):
        self.model, self.enabled, self.sizes, self.prefill = model, enabled, sizes, prefill
        self._sample, self._clock, self._now = sample, clock, now
        self._quiet = quiet or (lambda: others_busy_now())
        self.key = cache_key(model, sizes, prefill) if enabled else None
        cached = load_cached(self.key) if self.key and not force else None
        if cached is not None and cached.steady is None and not prefill:
            cached = None  # cached before the steady costs were measured: measured again, once
        self.from_cache = cached is not None
        self.current = cached or self._take(repeats=3 if enabled else 1)
        if self.key and not self.from_cache:
            store_cached(self.key, self.current)
        self.one_token: deque[float] = deque(maxlen=2 * CONTRADICTION_SAMPLES)  # live one-token decodes, short contexts
        self.reference_scale = 1.0   # the learnt speed factor the last check left
        self.measurements = 1        # calibrations taken (begun) on the model: each empties its cache
        self._drifting = 0           # rounds the speed factor has been away from it
        self._retry_at = 0.0

    def _take(self, repeats: int, interrupt: Callable[[], bool] = lambda: False) -> Calibration:
        return take(self.model, self.sizes, repeats=repeats, prefill=self.prefill, interrupt=interrupt,
                    sample=self._sample, clock=self._clock, now=self._now)

    # ------------------------------------------------------------------ live evidence

    def observe_plain(self, context_len: int, decode_s: float) -> None:
        """A live one-token decode (a plain round) at this context length."""
        if context_len < SHORT_CONTEXT:
            self.one_token.append(decode_s)

    def observe_scale(self, scale: float) -> None:
        """The learnt speed factor after a round."""
        ratio = scale / self.reference_scale
        self._drifting = self._drifting + 1 if not 1 / SCALE_DRIFT <= ratio <= SCALE_DRIFT else 0

    def contradicted(self) -> bool:
        if len(self.one_token) < CONTRADICTION_SAMPLES:
            return False
        ratio = statistics.median(self.one_token) / self.current.smallest[1]
        return not 1 / CONTRADICTION <= ratio <= CONTRADICTION

    @property
    def due(self) -> str:
        """Why this calibration should be measured again, or "" (only models whose costs are cached)."""
        if not self.enabled or self._now() < self._retry_at:
            return ""
        if not self.current.trusted:
            return f"it was not trusted ({self.current.problem})"
        if self.contradicted():
            live = statistics.median(self.one_token)
            return (f"live one-token rounds took {live * 1e3:.0f} ms against the "
                    f"{self.current.smallest[1] * 1e3:.0f} ms it measured")
        if self._drifting >= SCALE_DRIFT_ROUNDS:
            return f"live rounds have run {self._drifting} rounds away from its costs"
        return ""

    # ------------------------------------------------------------------ measuring again

    def remeasure(self, scale: float = 1.0, interrupt: Callable[[], bool] = lambda: False) -> Calibration | None:
        """Measure again if the machine is quiet: the new calibration when it is trusted (it is cached and
        becomes `current`), None when the machine was busy or the measurement untrusted (tried again
        later); Interrupted propagates. `scale`: the learnt speed factor now, kept as the reference when
        the new costs agree with the old (the shape held: what the factor learnt is the context's)."""
        busy = self._quiet()
        if busy is not None and busy > QUIET_OTHERS_BUSY:
            self._retry_at = self._now() + RETRY_AFTER_S / 4
            return None
        self.measurements += 1
        fresh = self._take(repeats=3, interrupt=interrupt)
        self.one_token.clear()
        self._drifting = 0
        if not fresh.trusted:
            self._retry_at = self._now() + RETRY_AFTER_S
            if not self.current.trusted:
                self.current = replace(self.current, problem=fresh.problem)
            return None
        if self.key:
            store_cached(self.key, fresh)
        held = self.current.trusted and agrees(self.current.costs, fresh.costs)
        self.reference_scale = scale if held else 1.0
        self.current = fresh
        return fresh


def agrees(a: dict[int, float], b: dict[int, float], within: float = 0.15) -> bool:
    """Two calibrations within `within` of each other at every size both measured."""
    common = [n for n in a if n in b and a[n] > 0]
    return bool(common) and all(abs(b[n] / a[n] - 1) <= within for n in common)


# ----------------------------------------------------------------------------- for `localspec doctor`


@dataclass(frozen=True)
class CacheEntry:
    model: str                       # the model file's name
    kind: str                        # "verify costs", "one-token cost" or "prefill cost"
    n_ctx: str
    calibration: Calibration | None  # None: an entry of the older format (how it was measured unknown)


def cached_entries() -> list[CacheEntry]:
    """Every cached calibration, for `localspec doctor`."""
    out = []
    for key, value in read_cache().items():
        fields = key.split("|")
        sizes = fields[8] if len(fields) > 8 else ""
        kind = "prefill cost" if fields[-1] == "prefill" else ("one-token cost" if sizes == "1" else "verify costs")
        out.append(CacheEntry(Path(fields[0]).name, kind, fields[7] if len(fields) > 7 else "?",
                              Calibration.from_json(value)))
    return out



def remeasure_if_due(calibrator: Calibrator | None, cost: CostModel, reset_measured: Callable[[], None],
                     interrupt: Callable[[], bool]) -> str:
    """Between requests: measure the target's verify costs again when its calibration is due (untrusted
    at load, or contradicted by live rounds); `interrupt` stops it between two batches. `reset_measured`
    empties the sequence measuring used. Returns what was done, "" for nothing."""
    if calibrator is None or not (why := calibrator.due):
        return ""
    measured = calibrator.measurements
    try:
        fresh = calibrator.remeasure(cost.scale, interrupt=interrupt)
    except Interrupted:
        fresh = None
    finally:
        if calibrator.measurements != measured:
            reset_measured()
    if fresh is None:
        return ""
    steady, changed = fresh.tables()
    cost.recalibrate(steady, calibrator.reference_scale, changed)
    return f"measured the target's verify costs again: {why}"

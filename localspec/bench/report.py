"""The bench's report: a pure function of the raw runs, so it can be rebuilt and tested. Every speedup
is a ratio of medians against the faster plain decoding of the same prompts in the same run."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable

from localspec.bench.peers import PEERS, Run
from localspec.bench.suites import FIRST_REQUEST, SESSION_KINDS, SUITES
from localspec.engine import adaptive


@dataclass
class Row:
    suite: str
    variant: str
    temperature: float
    plain_tokens_per_s: float      # the baseline: the faster of localspec plain and Llama plain on these prompts
    tokens_per_s: float
    speedup: float                 # against the baseline
    speedup_min: float
    speedup_max: float
    acceptance: float
    mean_accepted: float
    draft_length: float
    acceptance_by_position: list[float]
    bound: float | None
    identical: float | None        # greedy: share of plain's tokens the speculative answer reproduced in order
    baseline: str = "plain"        # which plain decoding was faster: "plain" (localspec) or "llama-cpp-python"
    first_token_s: float | None = None  # median time to first token from an empty cache (prompt included)
    history_share: float | None = None  # share of drafted tokens that came from the "history" drafter
    reported: float | None = None  # median of the speedups localspec showed (the one rule), against `speedup` measured
    noise: float | None = None     # the largest per-prompt gap between localspec's and Llama's plain decoding here
    slower: dict[str, float] = field(default_factory=dict)  # prompts slower than localspec plain beyond `noise`


# A prompt is reported slower than plain decoding when its ratio to localspec's plain decoding is below
# this and below the run's own noise: localspec's and Llama's plain decoding run at the same speed
# (docs/performance.md, "Plain parity"), so how far apart they came out on a prompt is what the machine
# alone moves a per-prompt ratio by in that run.
SLOWER = 0.97


BASELINES = ("plain", PEERS[0])


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def identical_prefix(plain: list[int], other: list[int]) -> float:
    n = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), min(len(plain), len(other)))
    return n / len(plain) if plain else 1.0


def _by_prompt(runs: list[Run]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in runs:
        out.setdefault(r.prompt, []).append(r.tokens_per_s)
    return out


def _baseline(group: dict[str, list[Run]], prompts: set[str]) -> tuple[str, dict[str, list[float]]]:
    """The faster plain decoding (median tok/s) over `prompts`, among those that ran on all of them."""
    best, best_tps, best_runs = "plain", -1.0, {}
    for name in BASELINES:
        per_prompt = _by_prompt([r for r in group.get(name, []) if r.prompt in prompts])
        if set(per_prompt) != prompts:
            continue
        tps = _median([t for ts in per_prompt.values() for t in ts])
        if tps > best_tps:
            best, best_tps, best_runs = name, tps, per_prompt
    return best, best_runs


def _row(suite: str, variant: str, temperature: float, sel: list[Run], group: dict[str, list[Run]],
         verify: Callable[[int], float] | None, draft_costs: dict[str, float]) -> Row | None:
    ran = {r.prompt for r in sel}
    baseline, base = _baseline(group, ran)
    if not base:
        return None
    mine = _by_prompt(sel)
    ratios = [_median(mine[p]) / _median(base[p]) for p in ran if _median(base[p]) > 0]
    noise, slower = _beyond_noise(mine, group) if variant not in PEERS and variant != "plain" else (None, {})
    base_tps = _median([t for ts in base.values() for t in ts])
    tps = _median([r.tokens_per_s for r in sel])
    drafted = sum(r.drafted for r in sel)
    accepted = sum(r.accepted for r in sel)
    drafting_rounds = sum(r.drafting_rounds for r in sel)
    width = max((len(r.tried_by_position) for r in sel), default=0)
    tried = [sum(r.tried_by_position[i] for r in sel if i < len(r.tried_by_position)) for i in range(width)]
    kept = [sum(r.kept_by_position[i] for r in sel if i < len(r.kept_by_position)) for i in range(width)]
    alpha = accepted / drafted if drafted else 0.0
    from_history = sum(r.drafted_by.get("history", 0) for r in sel)
    bound = (adaptive.speedup_bound(alpha, verify, draft_costs[variant])
             if verify is not None and variant in draft_costs and drafted else None)
    identical = None
    plain: dict[str, list[Run]] = {}
    for r in group.get("plain", []):
        plain.setdefault(r.prompt, []).append(r)
    if temperature == 0 and variant != "plain":
        shares = [identical_prefix(plain[r.prompt][min(r.repeat, len(plain[r.prompt]) - 1)].tokens, r.tokens)
                  for r in sel if r.tokens and r.prompt in plain]
        identical = statistics.fmean(shares) if shares else None
    cold = [r.first_token_s for r in sel if r.cold and r.first_token_s > 0]
    shown = [r.reported for r in sel if r.reported > 0]
    return Row(suite=suite, variant=variant, temperature=temperature, plain_tokens_per_s=base_tps,
               tokens_per_s=tps, speedup=tps / base_tps if base_tps else 0.0,
               speedup_min=min(ratios, default=0.0), speedup_max=max(ratios, default=0.0),
               acceptance=alpha, mean_accepted=accepted / drafting_rounds if drafting_rounds else 0.0,
               draft_length=drafted / drafting_rounds if drafting_rounds else 0.0,
               acceptance_by_position=[k / t if t else 0.0 for k, t in zip(kept, tried)],
               bound=bound, identical=identical, baseline=baseline,
               first_token_s=_median(cold) if cold else None,
               history_share=from_history / drafted if drafted else None,
               reported=_median(shown) if shown else None, noise=noise, slower=slower)


def _beyond_noise(mine: dict[str, list[float]], group: dict[str, list[Run]]) -> tuple[float | None, dict[str, float]]:
    """This run's noise (see SLOWER; None without Llama runs) and the prompts slower than localspec's
    plain decoding beyond it, with their ratio."""
    plain, llama = _by_prompt(group.get("plain", [])), _by_prompt(group.get(PEERS[0], []))
    gaps = [abs(math.log(_median(plain[p]) / _median(llama[p]))) for p in mine
            if p in plain and p in llama and _median(plain[p]) > 0 and _median(llama[p]) > 0]
    noise = math.exp(max(gaps)) - 1 if gaps else None
    floor = min(SLOWER, 1 / (1 + noise)) if noise is not None else SLOWER
    own = {p: _median(ts) / _median(plain[p]) for p, ts in mine.items() if p in plain and _median(plain[p]) > 0}
    return noise, {p: r for p, r in sorted(own.items()) if r < floor}


def summarize(runs: list[Run], verify: Callable[[int], float] | None = None,
              draft_costs: dict[str, float] | None = None) -> list[Row]:
    """One row per suite x variant x temperature, plus 'all' suites. Every speedup is against the faster
    of localspec's and llama-cpp-python's plain decoding over the same prompts (the row says which)."""
    rows: list[Row] = []
    order = (*SUITES, FIRST_REQUEST, *SESSION_KINDS)
    suites = sorted({r.suite for r in runs}, key=lambda s: order.index(s) if s in order else 99)
    variants = list(dict.fromkeys(r.variant for r in runs))
    for suite in [*suites, "all"]:
        for temperature in sorted({r.temperature for r in runs}):
            group: dict[str, list[Run]] = {}
            for r in runs:
                if r.temperature == temperature and (r.suite == suite or (suite == "all" and r.suite in SUITES)):
                    group.setdefault(r.variant, []).append(r)
            for variant in variants:
                if variant in group:
                    row = _row(suite, variant, temperature, group[variant], group, verify, draft_costs or {})
                    if row is not None:
                        rows.append(row)
    return rows


def markdown(rows: list[Row]) -> str:
    lines = [
        "| suite | T | variant | baseline (faster plain) | tok/s | speedup (min-max per prompt) | shown | first token "
        "| acceptance | accepted/round | draft len | from history | bound | greedy identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        spec = r.variant not in PEERS and r.variant != "plain"
        base = "localspec" if r.baseline == "plain" else "Llama"
        lines.append(
            f"| {r.suite} | {r.temperature:g} | {r.variant} | {base} {r.plain_tokens_per_s:.1f} | {r.tokens_per_s:.1f} | "
            f"{r.speedup:.2f}x ({r.speedup_min:.2f}-{r.speedup_max:.2f}) | "
            + (f"{r.reported:.2f}x | " if r.reported is not None and spec else "- | ")
            + (f"{r.first_token_s:.2f}s | " if r.first_token_s is not None else "- | ")
            + (f"{r.acceptance:.0%} | {r.mean_accepted:.2f} | {r.draft_length:.1f} | " if spec else "- | - | - | ")
            + (f"{r.history_share:.0%} | " if r.history_share is not None else "- | ")
            + (f"{r.bound:.2f}x" if r.bound is not None else "-") + " | "
            + (f"{r.identical:.0%}" if r.identical is not None else "-") + " |")
    return "\n".join(lines)


def slower_prompts(rows: list[Row]) -> str:
    """Below the table: per drafter row, the prompts that came out slower than localspec's plain decoding
    beyond this run's noise, or that none did."""
    lines = []
    for r in rows:
        if r.variant in PEERS or r.variant == "plain" or r.suite == "all":
            continue
        noise = (f"plain and Llama differed by up to {r.noise:.0%} on a prompt" if r.noise is not None
                 else "noise not measured: no Llama runs")
        found = ", ".join(f"{p} {x:.2f}x" for p, x in r.slower.items()) or "none"
        lines.append(f"- {r.suite} {r.variant} T={r.temperature:g}: slower than plain beyond the noise ({noise}): {found}")
    return "\n".join(lines)


def to_json(runs: list[Run], rows: list[Row], meta: dict) -> dict:
    return {"meta": meta, "rows": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]}


def draft_costs(engine) -> dict[str, float]:
    """Seconds per drafted token of each drafter setting (lookups are free)."""
    costs = {"auto": 0.0}
    for name in engine.drafters:
        drafter = engine.drafter(name)
        if drafter is not None:
            costs[name] = drafter.cost.per_token_s if hasattr(drafter, "cost") else 0.0
    return costs


def meta(engine, entry: str, **settings) -> dict:
    """What a run was: the files, the machine, the settings, the measured costs, the peers that did not run."""
    import platform

    return {"entry": entry, "target": engine.target.path.name,
            "draft": engine.draft.path.name if engine.draft is not None else None,
            "machine": platform.machine(), "threads": os.cpu_count(), **settings,
            "verify_ms": {n: round(engine.cost.verify(n) * 1000, 2) for n in sorted(engine.cost.verify_s)},
            "draft_ms_per_token": {k: round(v * 1000, 2) for k, v in draft_costs(engine).items()},
            "draft_files": describe(engine)}


def describe(engine) -> list[tuple[str, str, int, str]]:
    """(role, file name, size, note) of the drafts a bench ran with, for the report."""
    out = []
    if engine.draft is not None:
        out.append(("draft model", engine.draft.path.name, engine.draft.path.stat().st_size, ""))
    if engine.self_draft is not None:
        out.append(("self-draft", engine.self_draft.path.name, engine.self_draft.path.stat().st_size,
                    f", {engine.self_draft.n_layer} of {engine.target.n_layer} blocks"))
    return out

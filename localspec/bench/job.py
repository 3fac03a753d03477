"""The whole `localspec bench` command below its options: choose the drafters and prompts, load the
engine, run, and write the report, the raw runs and the plot."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Callable

from localspec.bench.estimate import head_estimate
from localspec.bench.report import SLOWER, draft_costs, markdown, meta, slower_prompts, summarize, to_json
from localspec.bench.runner import DRAFTERS, bench, bench_sessions
from localspec.bench.suites import load_sessions, load_suites
from localspec.errors import LocalspecError
from localspec.units import human_bytes


def drafters_of(spec: str) -> tuple[list[str], bool]:
    """The drafters `--drafter` names ("all", or a comma list), and whether it said "all"."""
    names = [d.strip() for d in spec.split(",") if d.strip()]
    unknown = [d for d in names if d not in DRAFTERS and names != ["all"]]
    if unknown:
        raise LocalspecError(f"Unknown drafter '{unknown[0]}' for --drafter; choose from all, {', '.join(DRAFTERS)}.")
    return (list(DRAFTERS) if names == ["all"] else names), names == ["all"]


def run(entry: str, *, drafter: str, suites: list[str], max_tokens: int, repeat: int, temperatures: list[float],
        peers: bool, limit: int | str | None, peer_prompts: int, n_ctx: int, placement: dict[str, Any],
        json_path: str | None, plot_path: str | None, say: Callable[[str], None]) -> str:
    """Run the bench on `entry` and return the report (Markdown and notes); `say` gets the progress."""
    from localspec.bench.peers import Run
    from localspec.loader import load_here
    from localspec.selfdraft import find_self_draft, no_self_draft

    drafters, every = drafters_of(drafter)
    prompts = load_suites(suites)
    sessions = load_sessions(suites)
    if isinstance(limit, str):  # prompt ids: run these again, with more repeats, say
        wanted = {name.strip() for name in limit.split(",") if name.strip()}
        unknown = wanted - {p.id for p in prompts} - {s.id for s in sessions}
        if unknown:
            raise LocalspecError(f"No prompt {', '.join(sorted(unknown))} in the suites {', '.join(suites)}.")
        prompts = [p for p in prompts if p.id in wanted]
        sessions = [s for s in sessions if s.id in wanted]
    elif limit:
        prompts = [p for p in prompts if p.index < limit]
        sessions = [s for s in sessions if s.index < limit]
    self_draft = find_self_draft(entry) if "self" in drafters else None
    if "self" in drafters and self_draft is None:
        if not every:
            raise no_self_draft(entry)
        drafters.remove("self")
        say("(no self-draft for this target: `localspec draft make` builds one; skipping 'self')")
    if placement and peers:
        say("(with --rpc the peers run locally: they say what the same file does on this machine alone)")
    # The drafting history in memory only: a bench neither reads nor feeds the user's own. The bench
    # reads the engine's costs: in this process, even with --rpc.
    engine = load_here(entry, drafter="auto", n_ctx=n_ctx, self_draft=self_draft, history="memory", **placement)
    say(f"localspec bench: {entry} on {platform.machine()} ({os.cpu_count()} threads); {len(prompts)} prompts, "
        f"{len(sessions)} sessions, {max_tokens} tokens, T in {temperatures}, repeat {repeat}, drafters {drafters}")
    with engine:
        runs: list[Run] = []
        not_run: dict[str, str] = {}
        if prompts:
            runs, not_run = bench(engine, prompts, drafters=drafters, temperatures=temperatures, max_tokens=max_tokens,
                                  repeat=repeat, peers=peers, peer_prompts=peer_prompts, progress=say)
        if sessions:
            runs += bench_sessions(engine, sessions, drafters=drafters, max_tokens=max_tokens, peers=peers,
                                   progress=say)
        rows = summarize(runs, engine.cost.verify, draft_costs(engine))
        about = meta(engine, entry, max_tokens=max_tokens, repeat=repeat, temperatures=temperatures,
                     drafters=drafters, peers_not_run=not_run)
        guess = head_estimate(engine)
        if guess is not None:
            # unrounded: the text prints it to two places, and rounding twice can differ (1.105001 -> 1.11, 1.105 -> 1.10)
            about["mtp_estimate"] = {"speedup": guess.speedup, "draft_len": guess.draft_len,
                                     "step_share": round(guess.step_share, 4), "kept": guess.published.kept,
                                     "source": guess.published.source}
    report = [markdown(rows), "\nSpeedups are against the faster plain decoding in this run (localspec's, or "
              "llama-cpp-python's `Llama` on the same file); first token: median from an empty cache, prompt included."]
    if notes := slower_prompts(rows):
        report.append("\nPrompts slower than localspec's plain decoding (below "
                      f"{SLOWER:.2f}x and below what this run's noise explains):\n{notes}")
    report += [f"{peer}: not run ({why})" for peer, why in not_run.items()]
    if guess is not None:
        report.append("\n" + guess.describe())
    report += [f"\n{role}: {name}, {human_bytes(size)}{note}" for role, name, size, note in about["draft_files"]]
    if json_path:
        Path(json_path).write_text(json.dumps(to_json(runs, rows, about), indent=1))
        say(f"raw runs: {json_path}")
    if plot_path:
        from localspec.benchplot import svg

        Path(plot_path).write_text(svg(rows, f"localspec bench: {entry}, {max_tokens} tokens"))
        say(f"plot: {plot_path}")
    return "\n".join(report)

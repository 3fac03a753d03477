"""`localspec bench`: speculative vs plain decoding (and peers) on shipped prompt suites, in one run.

For every prompt the variants run back to back (plain, drafter A, drafter B, …, then again for the next
repeat) so machine drift hits them alike; speedups are ratios of medians. Everything measured is kept
as raw runs (JSON); the report is a pure function of them, so it can be rebuilt and tested.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from localspec.engine import adaptive
from localspec.engine.contract import DRAFTER_SETTINGS
from localspec.errors import LocalspecError

SUITES = ("code", "edit", "chat", "creative")
SESSIONS = "sessions"   # the session suites: related requests in order (bench_prompts/sessions.yaml)
SESSION_KINDS = ("follow-up", "regenerate", "quote", "tool-output")
FIRST_REQUEST = "session-start"  # the runs of each session's first request (no history to draft from yet)
DRAFTERS = tuple(d for d in DRAFTER_SETTINGS if d != "none")  # each compared with plain decoding
PEERS = ("llama-cpp-python", "llama-cpp-python+lookup", "llama-speculative-simple")


@dataclass(frozen=True)
class Prompt:
    suite: str
    index: int
    text: str

    @property
    def id(self) -> str:
        return f"{self.suite}-{self.index + 1}"


@dataclass(frozen=True)
class Session:
    """Related requests replayed in order. Each request is a user message continuing the conversation
    after the previous answer, "regenerate" (the previous request's messages again), or {"new": text}
    (a new conversation)."""

    kind: str
    index: int
    requests: tuple[Any, ...]

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.index + 1}"


def load_sessions() -> list[Session]:
    text = resources.files("localspec").joinpath("bench_prompts", f"{SESSIONS}.yaml").read_text()
    counts: dict[str, int] = {}
    out = []
    for item in yaml.safe_load(text)["sessions"]:
        kind = item["kind"]
        out.append(Session(kind, counts.get(kind, 0), tuple(item["requests"])))
        counts[kind] = counts.get(kind, 0) + 1
    return out


def load_suites(names: Iterable[str]) -> list[Prompt]:
    prompts = []
    for name in names:
        if name == SESSIONS:
            continue  # run by bench_sessions
        if name not in SUITES:
            raise LocalspecError(f"Unknown suite '{name}'; choose from {', '.join((*SUITES, SESSIONS))}.")
        text = resources.files("localspec").joinpath("bench_prompts", f"{name}.yaml").read_text()
        prompts.extend(parse_prompts(text, name))
    return prompts


def parse_prompts(text: str, suite: str | None = None) -> list[Prompt]:
    """The prompts of one suite file (`prompts:`), named after `suite` or the file's own `name:`."""
    data = yaml.safe_load(text)
    return [Prompt(suite or data["name"], i, p) for i, p in enumerate(data["prompts"])]


@dataclass
class Run:
    """One generation. `variant` is 'plain', a drafter name, or a peer's name."""

    suite: str
    prompt: str
    variant: str
    temperature: float
    repeat: int
    tokens: list[int]
    generated: int
    seconds: float
    tokens_per_s: float
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    drafting_rounds: int = 0
    kept_by_position: list[int] = field(default_factory=list)
    tried_by_position: list[int] = field(default_factory=list)
    first_token_s: float = 0.0     # request to first answer token; with `cold`, the whole prompt is in it
    cold: bool = False             # started from an empty cache
    drafted_by: dict[str, int] = field(default_factory=dict)  # draft tokens by the drafter that proposed them
    reported: float = 0.0          # the speedup localspec itself showed for this answer (engine/speedup.py)


# ----------------------------------------------------------------------------- running


def _seed(prompt: Prompt, repeat: int) -> int:
    return int(hashlib.sha256(f"{prompt.id}/{repeat}".encode()).hexdigest()[:8], 16)


def run_engine(engine, prompt: Prompt, drafter: str, temperature: float, repeat: int, max_tokens: int,
               cold: bool = False, messages: list[dict] | None = None) -> Run:
    from localspec.engine.events import Summary, answer_tokens
    from localspec.engine.sampling import SamplingSettings

    if cold:
        engine.reset()
    sampling = SamplingSettings(temperature=temperature, seed=_seed(prompt, repeat))
    messages = messages or [{"role": "user", "content": prompt.text}]
    events = list(engine.chat(messages, max_tokens=max_tokens, sampling=sampling,
                              drafter="none" if drafter == "plain" else drafter))
    s = events[-1]
    assert isinstance(s, Summary)
    tried, kept = list(s.drafted_by_position), list(s.kept_by_position)
    return Run(suite=prompt.suite, prompt=prompt.id, variant=drafter, temperature=temperature, repeat=repeat,
               tokens=answer_tokens(events), generated=s.generated_tokens, seconds=s.wall_s,
               tokens_per_s=s.tokens_per_s, drafted=s.drafted, accepted=s.accepted, rounds=s.rounds,
               drafting_rounds=s.rounds - s.rounds_by_drafter.get("none", 0),
               kept_by_position=kept, tried_by_position=tried, first_token_s=s.first_token_s, cold=cold,
               drafted_by=dict(s.drafted_by_drafter), reported=s.speedup)


class LlamaPeer:
    """llama-cpp-python's own `Llama` on the same target file, plain or with its prompt-lookup draft.

    Plain is constructed as a user would (no draft, so no logits kept for every position), with every
    core: the fastest plain `Llama` there is (its default is half the cores)."""

    def __init__(self, path: Path, n_ctx: int, lookup: bool = False):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        threads = os.cpu_count() or 1
        self.lookup = lookup
        self.llm = Llama(str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False,
                         draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10) if lookup else None)

    @property
    def variant(self) -> str:
        return PEERS[1] if self.lookup else PEERS[0]

    def run(self, tokens: list[int], prompt: Prompt, temperature: float, repeat: int, max_tokens: int,
            is_eog: Callable[[int], bool], cold: bool = False) -> Run:
        llm = self.llm
        # Keep the evaluated prompt (as llama-cpp-python's own prefix reuse would); drop the last answer.
        keep = len(tokens) - 1
        t_request = time.perf_counter()
        if cold or llm.n_tokens > keep or \
                list(llm.input_ids[:min(llm.n_tokens, keep)]) != tokens[:min(llm.n_tokens, keep)]:
            llm.reset()
        if llm.n_tokens < keep:
            llm.eval(tokens[llm.n_tokens:keep])
        out: list[int] = []
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {"top_k": 1, "temp": 0.0} if temperature == 0 else \
            {"temp": temperature, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
        if temperature > 0:
            llm.set_seed(_seed(prompt, repeat))
        first_token_s = 0.0
        for tok in llm.generate(tokens[-1:], reset=False, **kwargs):
            if not out:
                first_token_s = time.perf_counter() - t_request
            if is_eog(tok):
                break
            out.append(tok)
            if len(out) >= max_tokens:
                break
        seconds = time.perf_counter() - t0
        llm.n_tokens = keep  # forget the answer (and the pending last prompt token) for the next run
        return Run(suite=prompt.suite, prompt=prompt.id, variant=self.variant,
                   temperature=temperature, repeat=repeat, tokens=out, generated=len(out), seconds=seconds,
                   tokens_per_s=len(out) / seconds if seconds > 0 else 0.0, first_token_s=first_token_s, cold=cold)

    def close(self) -> None:
        self.llm.close()


def speculative_simple_peer(target: Path, draft: Path, prompt_text: str, prompt: Prompt, repeat: int,
                            max_tokens: int, n_ctx: int) -> Run:
    """llama.cpp's `llama-speculative-simple` with the same pair and the chat-templated prompt (greedy;
    its own timing line). Raises PeerFailed with the reason when it cannot run."""
    binary = shutil.which(PEERS[2])
    if binary is None:
        raise PeerFailed(f"{PEERS[2]} is not on PATH")
    # This llama.cpp picks the drafting method with --spec-type; without it a plain draft model is not
    # used ("failed to initialize speculative decoding").
    cmd = [binary, "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple", "-p", prompt_text,
           "-n", str(max_tokens), "--temp", "0", "-c", str(n_ctx), "-t", str(os.cpu_count() or 1)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerFailed(f"{PEERS[2]} did not run: {exc}") from None
    output = proc.stderr + proc.stdout
    match = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s*s", output)
    if proc.returncode != 0 or not match:
        last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
        raise PeerFailed(f"{PEERS[2]} exited with {proc.returncode}: {last[0][:200]}")
    n, seconds = int(match.group(1)), float(match.group(2))
    return Run(suite=prompt.suite, prompt=prompt.id, variant=PEERS[2], temperature=0.0, repeat=repeat, tokens=[],
               generated=n, seconds=seconds, tokens_per_s=n / seconds if seconds else 0.0)


class PeerFailed(Exception):
    """A peer that could not run, and why (the report says so instead of dropping it)."""


def bench(engine, prompts: list[Prompt], *, drafters: list[str], temperatures: list[float], max_tokens: int,
          repeat: int, peers: bool, peer_prompts: int = 4,
          progress: Callable[[str], None] = lambda _m: None) -> tuple[list[Run], dict[str, str]]:
    """Every prompt x temperature x repeat: localspec plain, each drafter and (with `peers`) `Llama`
    plain back to back, in the reverse order on every other prompt (order alone moves a figure by up
    to ~10% on small machines). The first repeat of each variant at the first temperature starts from
    an empty cache, so its time to first token includes the whole prompt. On the first `peer_prompts`
    prompts of each suite, the other peers follow (greedy). Returns the runs and, for each peer that
    could not run, why."""
    runs: list[Run] = []
    notes: dict[str, str] = {}
    chosen = {p.id for p in prompts if p.index < peer_prompts} if peers else set()
    sides = ["plain", *drafters] + (["llama"] if peers else [])
    total = len(prompts) * len(temperatures) * repeat * len(sides) + repeat * len(chosen)
    done = 0
    t0 = time.perf_counter()
    plain_peer = LlamaPeer(Path(engine.target.path), engine.n_ctx) if peers else None
    lookup_peer = LlamaPeer(Path(engine.target.path), engine.n_ctx, lookup=True) if chosen else None
    is_eog = engine.target.vocab.is_eog

    def note(run: Run) -> None:
        nonlocal done
        runs.append(run)
        done += 1
        eta = (time.perf_counter() - t0) / done * (total - done)
        progress(f"[{done}/{total}] {run.prompt:11} T={run.temperature:<3} {run.variant:24} {run.tokens_per_s:6.1f} tok/s"
                 f"  {run.accepted}/{run.drafted} accepted  (about {eta / 60:.1f} min left)")

    _history_recording(engine, False)  # a variant must not draft from another's answer to the same prompt
    try:
        for n, prompt in enumerate(prompts):
            tokens = engine.chat_tokens([{"role": "user", "content": prompt.text}])
            order = sides if n % 2 == 0 else sides[::-1]
            for t, temperature in enumerate(temperatures):
                for r in range(repeat):
                    for variant in order:
                        cold = t == 0 and r == 0
                        if variant == "llama":
                            assert plain_peer is not None
                            note(plain_peer.run(tokens, prompt, temperature, r, max_tokens, is_eog, cold=cold))
                        else:
                            note(run_engine(engine, prompt, variant, temperature, r, max_tokens, cold=cold))
            if lookup_peer is not None and prompt.id in chosen:
                for r in range(repeat):
                    note(lookup_peer.run(tokens, prompt, 0.0, r, max_tokens, is_eog))
    finally:
        for peer in (plain_peer, lookup_peer):
            if peer is not None:
                peer.close()
    if chosen:
        if engine.draft is None:
            notes[PEERS[2]] = "this target has no draft model"
        else:
            for prompt in (p for p in prompts if p.id in chosen):
                text = engine.template.render([{"role": "user", "content": prompt.text}])
                try:
                    runs.append(speculative_simple_peer(Path(engine.target.path), Path(engine.draft.path), text,
                                                        prompt, 0, max_tokens, engine.n_ctx))
                except PeerFailed as exc:
                    notes[PEERS[2]] = str(exc)
                    progress(f"{PEERS[2]}: not run ({exc})")
                    break
    return runs, notes


def _history_recording(engine, on: bool, clear: bool = False) -> None:
    history = engine.drafter("history") if hasattr(engine, "drafter") else None
    if history is not None:
        history.recording = on
        if clear:
            history.clear()


def bench_sessions(engine, sessions: list[Session], *, drafters: list[str], max_tokens: int, peers: bool,
                   progress: Callable[[str], None] = lambda _m: None) -> list[Run]:
    """Each session's requests in order, greedy, once per variant (localspec plain, each drafter, and with
    `peers` `Llama` plain), the order of variants reversed on every other session. The drafting history
    starts empty for each variant's pass, so a variant drafts only from its own earlier requests of the
    session. The conversation (earlier answers in later prompts) is the first variant's, replayed
    verbatim for the others. Runs of a session's first request are suite FIRST_REQUEST; later requests
    are suite = the session's kind."""
    runs: list[Run] = []
    sides = ["plain", *drafters] + (["llama"] if peers else [])
    plain_peer = LlamaPeer(Path(engine.target.path), engine.n_ctx) if peers else None
    vocab = engine.target.vocab
    total, done, t0 = sum(len(s.requests) for s in sessions) * len(sides), 0, time.perf_counter()
    try:
        for n, session in enumerate(sessions):
            transcript: list[list[dict]] = []
            for variant in (sides if n % 2 == 0 else sides[::-1]):
                _history_recording(engine, True, clear=True)
                conversation: list[dict] = []
                for i, request in enumerate(session.requests):
                    if len(transcript) <= i:
                        transcript.append(_next_messages(request, conversation, transcript))
                    messages = transcript[i]
                    prompt = Prompt(session.kind if i else FIRST_REQUEST, session.index, session.id)
                    if variant == "llama":
                        assert plain_peer is not None
                        run = plain_peer.run(engine.chat_tokens(messages), prompt, 0.0, 0, max_tokens, vocab.is_eog)
                    else:
                        run = run_engine(engine, prompt, variant, 0.0, 0, max_tokens, messages=messages)
                    run.prompt = f"{session.id}/{i + 1}"
                    runs.append(run)
                    conversation = [*messages, {"role": "assistant", "content": vocab.detokenize(run.tokens)}]
                    done += 1
                    eta = (time.perf_counter() - t0) / done * (total - done)
                    share = run.drafted_by.get("history", 0) / run.drafted if run.drafted else 0.0
                    progress(f"[{done}/{total}] {run.prompt:16} {variant:16} {run.tokens_per_s:6.1f} tok/s  "
                             f"{run.accepted}/{run.drafted} accepted, {share:.0%} of drafts from history  "
                             f"(about {eta / 60:.1f} min left)")
    finally:
        _history_recording(engine, False, clear=True)
        if plain_peer is not None:
            plain_peer.close()
    return runs


def _next_messages(request: Any, conversation: list[dict], transcript: list[list[dict]]) -> list[dict]:
    if request == "regenerate":
        return list(transcript[-1])
    if isinstance(request, dict):
        return [{"role": "user", "content": str(request["new"])}]
    return [*conversation, {"role": "user", "content": str(request)}]


# ----------------------------------------------------------------------------- the report (pure)


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
    ratios = [_median(_by_prompt(sel)[p]) / _median(base[p]) for p in ran if _median(base[p]) > 0]
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
               reported=_median(shown) if shown else None)


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

"""Running the variants: for every prompt the variants run back to back (plain, drafter A, drafter B,
…, then again for the next repeat), in alternating order, so machine drift hits them alike."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from localspec.bench.peers import PEERS, LlamaPeer, PeerFailed, Run, seed_of, speculative_simple_peer
from localspec.bench.suites import FIRST_REQUEST, Prompt, Session
from localspec.engine.params import DRAFTER_SETTINGS

DRAFTERS = tuple(d for d in DRAFTER_SETTINGS if d != "none")  # each compared with plain decoding


def run_engine(engine, prompt: Prompt, drafter: str, temperature: float, repeat: int, max_tokens: int,
               cold: bool = False, messages: list[dict] | None = None) -> Run:
    from localspec.engine.events import Summary, answer_tokens
    from localspec.engine.sampling import SamplingSettings

    if cold:
        engine.reset()
    sampling = SamplingSettings(temperature=temperature, seed=seed_of(prompt, repeat), grammar=prompt.grammar)
    messages = messages or [{"role": "user", "content": prompt.text}]
    tokens = engine.chat_tokens(messages, list(prompt.tools) if prompt.tools else None)
    events = list(engine.generate(tokens, max_tokens=max_tokens, sampling=sampling,
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


def bench(engine, prompts: list[Prompt], *, drafters: list[str], temperatures: list[float], max_tokens: int,
          repeat: int, peers: bool, peer_prompts: int = 4,
          progress: Callable[[str], None] = lambda _m: None) -> tuple[list[Run], dict[str, str]]:
    """Every prompt x temperature x repeat: localspec plain, each drafter and (with `peers`) `Llama`
    plain back to back, in the reverse order on every other prompt and every other repeat (order alone
    moves a figure on small machines; with two repeats each prompt runs A B B A). The first repeat of each variant at the first temperature starts from
    an empty cache, so its time to first token includes the whole prompt. On the first `peer_prompts`
    prompts of each suite, the other peers follow (greedy). Returns the runs and, for each peer that
    could not run, why."""
    runs: list[Run] = []
    notes: dict[str, str] = {}
    # The other peers (prompt lookup, llama.cpp's example) take no grammar here: structured prompts skip them.
    chosen = {p.id for p in prompts if p.index < peer_prompts and p.grammar is None} if peers else set()
    sides = ["plain", *drafters] + (["llama"] if peers else [])
    total = len(prompts) * len(temperatures) * repeat * len(sides) + repeat * len(chosen)
    done = 0
    t0 = time.perf_counter()
    plain_peer = LlamaPeer(Path(engine.target.path), engine.n_ctx, on=engine.driver.run) if peers else None
    lookup_peer = LlamaPeer(Path(engine.target.path), engine.n_ctx, lookup=True, on=engine.driver.run) if chosen else None
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
            tokens = engine.chat_tokens([{"role": "user", "content": prompt.text}],
                                        list(prompt.tools) if prompt.tools else None)
            for t, temperature in enumerate(temperatures):
                for r in range(repeat):
                    for variant in (sides if (n + r) % 2 == 0 else sides[::-1]):
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
        runs += _speculative_simple_runs(engine, [p for p in prompts if p.id in chosen], max_tokens, notes, progress)
    return runs, notes


def _speculative_simple_runs(engine, prompts: list[Prompt], max_tokens: int, notes: dict[str, str],
                             progress: Callable[[str], None]) -> list[Run]:
    """llama.cpp's own speculative example on the same pair, greedy; why not in `notes` when it cannot run."""
    if engine.draft is None:
        notes[PEERS[2]] = "this target has no draft model"
        return []
    runs = []
    for prompt in prompts:
        text = engine.template.render([{"role": "user", "content": prompt.text}])
        try:
            runs.append(speculative_simple_peer(Path(engine.target.path), Path(engine.draft.path), text, prompt, 0,
                                                max_tokens, engine.n_ctx))
        except PeerFailed as exc:
            notes[PEERS[2]] = str(exc)
            progress(f"{PEERS[2]}: not run ({exc})")
            break
    return runs


def _history_recording(engine, on: bool, clear: bool = False) -> None:
    history = engine.drafter("history")
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
    plain_peer = LlamaPeer(Path(engine.target.path), engine.n_ctx, on=engine.driver.run) if peers else None
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
                        transcript.append(next_messages(request, conversation, transcript))
                    messages = transcript[i]
                    prompt = Prompt(session.suite if i else FIRST_REQUEST, session.index, session.id)
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


def next_messages(request: Any, conversation: list[dict], transcript: list[list[dict]]) -> list[dict]:
    """The messages of a session's next request, after `conversation` (the last answer included)."""
    if request == "regenerate":
        return list(transcript[-1])
    if isinstance(request, dict):
        return [{"role": "user", "content": str(request["new"])}]
    return [*conversation, {"role": "user", "content": str(request)}]

"""What the engine tells every front door: one `Round` per draft/verify step, then a `Summary`.

These types are the contract between the engine and the TUI, the server dialects and the bench;
change them only by adding fields.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Iterable, Union


@dataclass(frozen=True)
class Prefill:
    """The prompt was brought into the KV cache (only the part not already cached was evaluated)."""

    prompt_tokens: int
    evaluated: int   # prompt tokens the target actually ran
    cached: int      # prompt tokens reused from the KV cache
    seconds: float
    chunks: int = 1  # evaluations it was spread over (a prompt that joined others' steps, in chunks)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "prefill", **asdict(self)}


@dataclass(frozen=True)
class TokenLogprob:
    """An answer token's log-probability under the target, and the most likely tokens at its position
    (asked for with SamplingSettings.logprobs)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, log-probability), most likely first


@dataclass(frozen=True)
class Round:
    """One draft -> verify -> accept/reject step."""

    index: int
    drafter: str                      # the registered drafter that drafted ("model", "ngram", "history", …) or "none"
    accepted: tuple[int, ...]         # draft tokens the target kept
    rejected: tuple[int, ...]         # draft tokens the target threw away
    token: int | None                 # the target's own token (None when the answer ended inside the draft)
    token_kind: str                   # "correction", "bonus", "plain" or "" (no token)
    accepted_text: str
    rejected_text: str
    token_text: str
    text: str                         # what this round adds to the answer as streamed (stop strings held back)
    draft_s: float
    verify_s: float
    evidence: int = 0                 # n-gram match length behind the draft, 0 otherwise
    pieces: tuple[str, ...] = ()      # the decoded text of each emitted token (accepted ones, then the target's)
    seconds: float = 0.0              # the round's wall time, from the end of the one before
    speedup: float = 0.0              # the answer's speedup so far (engine/speedup.py: the one rule)
    baseline_tokens_per_s: float = 0.0  # plain decoding's rate on the answer so far, by that rule
    baseline_measured: bool = False   # from measured plain rounds (False: the calibration's estimate)
    shared: int = 0                   # other requests decoded in the same step (a server's concurrent work)
    logprobs: tuple[TokenLogprob, ...] = ()  # one per emitted token, when the request asked for them
    candidates: int = 0               # a candidate tree's nodes where one was verified (accepted and rejected are
                                      # then the branch the target followed)
    took_second: bool = False         # the target kept a second candidate there (the chain alone would have stopped)

    @property
    def drafted(self) -> int:
        return len(self.accepted) + len(self.rejected)

    @property
    def emitted(self) -> int:
        return len(self.accepted) + (self.token is not None)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "round", **asdict(self)}


@dataclass(frozen=True)
class Summary:
    text: str
    stop_reason: str                  # "eog", "length", "stop", "cancelled", "context"
    prompt_tokens: int
    prompt_evaluated: int
    prompt_s: float
    generated_tokens: int
    wall_s: float                     # generation only, prompt excluded
    tokens_per_s: float
    rounds: int
    drafted: int
    accepted: int
    acceptance_rate: float
    mean_accepted_per_round: float    # over rounds that drafted anything
    acceptance_by_position: tuple[float, ...]
    drafted_by_position: tuple[int, ...]
    draft_s: float
    verify_s: float
    baseline_tokens_per_s: float      # plain decoding's rate on this answer's tokens (engine/speedup.py)
    speedup: float                    # plain-equivalent time over time taken; 1.0 when nothing was drafted
    drafter: str                      # the drafter setting ("auto", a registered drafter, or "none")
    rounds_by_drafter: dict[str, int] = field(default_factory=dict)
    first_token_s: float = 0.0        # from the request to the first answer token: prompt + first round
    kept_by_position: tuple[int, ...] = ()  # draft tokens kept at each draft position (of drafted_by_position)
    kv_tokens: int = 0                # tokens in the target's KV cache after the answer (what a next request can reuse)
    drafted_by_drafter: dict[str, int] = field(default_factory=dict)   # draft tokens each drafter proposed
    accepted_by_drafter: dict[str, int] = field(default_factory=dict)  # and how many of them the target kept
    baseline_measured: bool = False   # the baseline came from measured plain rounds, not the calibration's estimate
    tree_rounds: int = 0              # rounds that verified a candidate tree (Round.candidates)
    seconds_kept: int = 0             # of those, rounds where the target kept a second candidate

    def to_dict(self) -> dict[str, Any]:
        return {"type": "summary", **asdict(self)}

    def stored(self) -> dict[str, Any]:
        """What the history keeps of it (the answer's text is the message itself), read back by `from_stored`."""
        return {k: v for k, v in self.to_dict().items() if k not in ("type", "text")} | {"one_line": self.one_line()}

    @classmethod
    def from_stored(cls, data: dict[str, Any] | None, text: str = "") -> "Summary | None":
        """A stored summary (`stored`); None for a message that has none (a failed answer keeps only its
        error). Fields an older version did not store take their defaults."""
        if not data or "generated_tokens" not in data:
            return None
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name in data and name != "text":
                value = data[name]
                values[name] = tuple(value) if isinstance(value, list) else value
            elif f.default is not MISSING:
                values[name] = f.default
            elif f.default_factory is not MISSING:
                values[name] = f.default_factory()
            else:  # (a required field an older version did not store)
                kind = str(f.type)
                values[name] = () if kind.startswith("tuple") else "" if kind == "str" else 0
        values["text"] = text
        return cls(**values)

    def one_line(self) -> str:
        return (
            f"{self.generated_tokens} tokens in {self.wall_s:.2f}s: {self.tokens_per_s:.1f} tok/s "
            f"({'plain' if self.baseline_measured else 'plain est.'} {self.baseline_tokens_per_s:.1f} tok/s, "
            f"{self.speedup:.2f}x), "
            f"acceptance {self.acceptance_rate:.0%} of {self.drafted} drafted, "
            f"{self.mean_accepted_per_round:.2f} accepted/round, "
            + (f"trees in {self.tree_rounds} rounds (a second candidate kept in {self.seconds_kept}), "
               if self.tree_rounds else "")
            + f"first token after {self.first_token_s:.2f}s, stop: {self.stop_reason}"
        )


Event = Union[Prefill, Round, Summary]


def answer_tokens(events: Iterable[Event]) -> list[int]:
    """The token ids of the answer, in order, from a stream of events."""
    out: list[int] = []
    for event in events:
        if isinstance(event, Round):
            out.extend(event.accepted)
            if event.token is not None:
                out.append(event.token)
    return out


class Tally:
    """Accumulates rounds into the statistics of a `Summary`."""

    def __init__(self) -> None:
        self.rounds = 0
        self.drafting_rounds = 0
        self.generated = 0
        self.drafted = 0
        self.accepted = 0
        self.draft_s = 0.0
        self.verify_s = 0.0
        self.tried_at: list[int] = []
        self.kept_at: list[int] = []
        self.by_drafter: dict[str, int] = {}
        self.drafted_by: dict[str, int] = {}
        self.accepted_by: dict[str, int] = {}
        self.speedup = 0.0            # the latest round's figures (engine/speedup.py)
        self.baseline_tokens_per_s = 0.0
        self.baseline_measured = False
        self.tree_rounds = 0
        self.seconds_kept = 0

    def add(self, r: Round) -> None:
        self.rounds += 1
        self.tree_rounds += r.candidates > 0
        self.seconds_kept += r.took_second
        self.generated += r.emitted
        self.drafted += r.drafted
        self.accepted += len(r.accepted)
        self.draft_s += r.draft_s
        self.verify_s += r.verify_s
        self.by_drafter[r.drafter] = self.by_drafter.get(r.drafter, 0) + 1
        if r.speedup > 0:
            self.speedup, self.baseline_tokens_per_s, self.baseline_measured = (
                r.speedup, r.baseline_tokens_per_s, r.baseline_measured)
        if r.drafted:
            self.drafting_rounds += 1
            self.drafted_by[r.drafter] = self.drafted_by.get(r.drafter, 0) + r.drafted
            self.accepted_by[r.drafter] = self.accepted_by.get(r.drafter, 0) + len(r.accepted)
        while len(self.tried_at) < r.drafted:
            self.tried_at.append(0)
            self.kept_at.append(0)
        for i in range(r.drafted):
            self.tried_at[i] += 1
            self.kept_at[i] += i < len(r.accepted)

    def summary(self, *, text: str, stop_reason: str, prefill: Prefill, wall_s: float,
                baseline_tokens_per_s: float, drafter: str, first_token_s: float = 0.0, kv_tokens: int = 0) -> Summary:
        """`baseline_tokens_per_s`: the estimate to fall back on when no round carried the speedup
        (engines that predate it); otherwise the rounds' own figures are the answer's."""
        tps = self.generated / wall_s if wall_s > 0 else 0.0
        if self.speedup > 0:
            speedup, measured = self.speedup, self.baseline_measured
            baseline_tokens_per_s = tps / speedup if tps > 0 else self.baseline_tokens_per_s
        else:
            speedup = tps / baseline_tokens_per_s if baseline_tokens_per_s > 0 else 0.0
            measured = False
        return Summary(
            text=text,
            stop_reason=stop_reason,
            prompt_tokens=prefill.prompt_tokens,
            prompt_evaluated=prefill.evaluated,
            prompt_s=prefill.seconds,
            generated_tokens=self.generated,
            wall_s=wall_s,
            tokens_per_s=tps,
            rounds=self.rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
            mean_accepted_per_round=self.accepted / self.drafting_rounds if self.drafting_rounds else 0.0,
            acceptance_by_position=tuple(k / t for k, t in zip(self.kept_at, self.tried_at)),
            drafted_by_position=tuple(self.tried_at),
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            baseline_tokens_per_s=baseline_tokens_per_s,
            speedup=speedup,
            drafter=drafter,
            rounds_by_drafter=dict(self.by_drafter),
            first_token_s=first_token_s,
            kept_by_position=tuple(self.kept_at),
            kv_tokens=kv_tokens,
            drafted_by_drafter=dict(self.drafted_by),
            accepted_by_drafter=dict(self.accepted_by),
            baseline_measured=measured,
            tree_rounds=self.tree_rounds,
            seconds_kept=self.seconds_kept,
        )

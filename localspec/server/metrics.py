"""What the server counts, and the Prometheus text of it (`GET /metrics`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from localspec.engine.events import Prefill, Summary


@dataclass
class Metrics:
    requests: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_chunks: int = 0  # evaluations of prompts spread over others' steps (beyond one per prompt)
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0
    generation_seconds: float = 0.0
    last_tokens_per_s: float = 0.0
    last_speedup: float = 0.0

    def count(self, summary: Summary, prefill: Prefill | None, limited: bool = False) -> None:
        self.generated_tokens += summary.generated_tokens
        self.drafted_tokens += summary.drafted
        self.accepted_tokens += summary.accepted
        self.rounds += summary.rounds
        self.generation_seconds += summary.wall_s
        self.last_tokens_per_s = summary.tokens_per_s
        self.last_speedup = summary.speedup
        if summary.stop_reason == "cancelled" and not limited:  # a completion ended by its own limits is not
            self.cancelled += 1                                  # a cancelled one (llama.cpp: stop_type "limit")
        if prefill:
            self.prompt_tokens += prefill.prompt_tokens
            self.prompt_tokens_cached += prefill.cached
            self.prompt_chunks += prefill.chunks - 1


def prometheus_text(metrics: Metrics, model: str, *, queue_depth: int, running: int, interjected: int, joined: int,
                    slot_tokens: Sequence[int]) -> str:
    m = metrics
    label = f'model="{model}"'
    lines = [
        "# HELP localspec_requests_total Requests by endpoint.",
        "# TYPE localspec_requests_total counter",
        *[f'localspec_requests_total{{{label},endpoint="{e}"}} {n}' for e, n in sorted(m.requests.items())],
    ]

    def metric(name: str, kind: str, help_: str, value) -> None:
        lines.extend([f"# HELP localspec_{name} {help_}", f"# TYPE localspec_{name} {kind}",
                      f"localspec_{name}{{{label}}} {value}"])

    metric("errors_total", "counter", "Generations that failed.", m.errors)
    metric("cancelled_total", "counter", "Generations cancelled (the client went away).", m.cancelled)
    metric("prompt_tokens_total", "counter", "Prompt tokens received.", m.prompt_tokens)
    metric("prompt_tokens_cached_total", "counter", "Prompt tokens reused from the KV cache.", m.prompt_tokens_cached)
    metric("prompt_chunks_total", "counter", "Extra evaluations of prompts evaluated in chunks within other "
           "requests' steps (a prompt in 3 chunks counts 2).", m.prompt_chunks)
    metric("generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens)
    metric("drafted_tokens_total", "counter", "Draft tokens proposed.", m.drafted_tokens)
    metric("accepted_tokens_total", "counter", "Draft tokens the target accepted.", m.accepted_tokens)
    metric("rounds_total", "counter", "Draft/verify rounds.", m.rounds)
    metric("generation_seconds_total", "counter", "Time spent generating.", round(m.generation_seconds, 6))
    metric("tokens_per_second", "gauge", "Throughput of the last generation.", round(m.last_tokens_per_s, 3))
    metric("speedup", "gauge", "Speedup over plain decoding of the last generation.", round(m.last_speedup, 3))
    metric("queue_depth", "gauge", "Requests running or waiting.", queue_depth)
    metric("requests_running", "gauge", "Requests generating now (an editor's completion runs beside a chat).",
           running)
    metric("interjected_total", "counter", "Completions run beside another generation.",
           interjected)
    metric("joined_total", "counter", "Requests that joined another's generation (decoded in the same steps).",
           joined)
    lines += ["# HELP localspec_slot_tokens Tokens held in each KV slot (what a request with that prefix reuses).",
              "# TYPE localspec_slot_tokens gauge",
              *[f'localspec_slot_tokens{{{label},slot="{i}"}} {n}'
                for i, n in enumerate(slot_tokens)]]
    return "\n".join(lines) + "\n"

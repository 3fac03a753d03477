"""`localspec bench`: speculative vs plain decoding (and peers) on shipped prompt suites, in one run.

For every prompt the variants run back to back (plain, drafter A, drafter B, …, then again for the next
repeat) so machine drift hits them alike; speedups are ratios of medians. Everything measured is kept
as raw runs (JSON); the report is a pure function of them, so it can be rebuilt and tested.

suites (the prompts) -> runner (localspec's variants) and peers (`Llama`, llama.cpp's tools) -> report;
`job.run` is the whole command, as the CLI calls it.
"""

from localspec.bench.peers import PEERS, LlamaPeer, PeerFailed, Run
from localspec.bench.report import Row, draft_costs, markdown, meta, slower_prompts, summarize, to_json
from localspec.bench.runner import DRAFTERS, bench, bench_sessions, next_messages, run_engine
from localspec.bench.suites import (FIRST_REQUEST, SESSION_KINDS, SESSIONS, SUITES, Prompt, Session, load_sessions,
                                    load_suites, parse_prompts)

__all__ = ["PEERS", "LlamaPeer", "PeerFailed", "Run", "Row", "draft_costs", "markdown", "meta", "slower_prompts", "summarize", "to_json",
           "DRAFTERS", "bench", "bench_sessions", "next_messages", "run_engine", "FIRST_REQUEST", "SESSION_KINDS",
           "SESSIONS", "SUITES", "Prompt", "Session", "load_sessions", "load_suites", "parse_prompts"]

"""What a user could run instead on the same files: llama-cpp-python's `Llama` (plain, and with its
prompt-lookup draft) and llama.cpp's `llama-speculative-simple`. Each run is a `Run`, like localspec's."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from localspec.bench.suites import Prompt

PEERS = ("llama-cpp-python", "llama-cpp-python+lookup", "llama-speculative-simple")


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


def seed_of(prompt: Prompt, repeat: int) -> int:
    """The sampling seed of a prompt's repeat: the same for every variant, so they sample alike."""
    return int(hashlib.sha256(f"{prompt.id}/{repeat}".encode()).hexdigest()[:8], 16)


class LlamaPeer:
    """llama-cpp-python's own `Llama` on the same target file, plain or with its prompt-lookup draft.

    Plain is constructed as a user would (no draft, so no logits kept for every position), with every
    core: the fastest plain `Llama` there is (its default is half the cores)."""

    def __init__(self, path: Path, n_ctx: int, lookup: bool = False,
                 on: Callable[[Callable[[], Any]], Any] = lambda fn: fn()):
        """`on`: runs a call on the thread that decodes for localspec in this process (`Driver.run`), as
        llama.cpp's CPU threads are a team per decoding thread and a second team slows both sides; a
        user's `Llama` alone in its process decodes with one."""
        from llama_cpp import Llama, llama_model_is_hybrid, llama_model_is_recurrent
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        threads = os.cpu_count() or 1
        self.lookup = lookup
        self._on = on
        self.llm = on(lambda: Llama(str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False,
                                    draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10) if lookup else None))
        # A recurrent state cannot drop the last answer (llama_decode refuses the next prompt): such a
        # target's prompt is evaluated again for every run, before the timed part.
        self.keeps_prompt = not (llama_model_is_recurrent(self.llm.model) or llama_model_is_hybrid(self.llm.model))

    @property
    def variant(self) -> str:
        return PEERS[1] if self.lookup else PEERS[0]

    def run(self, tokens: list[int], prompt: Prompt, temperature: float, repeat: int, max_tokens: int,
            is_eog: Callable[[int], bool], cold: bool = False) -> Run:
        return self._on(lambda: self._run(tokens, prompt, temperature, repeat, max_tokens, is_eog, cold))

    def _run(self, tokens: list[int], prompt: Prompt, temperature: float, repeat: int, max_tokens: int,
             is_eog: Callable[[int], bool], cold: bool) -> Run:
        llm = self.llm
        # Keep the evaluated prompt (as llama-cpp-python's own prefix reuse would); drop the last answer.
        keep = len(tokens) - 1
        t_request = time.perf_counter()
        if cold or not self.keeps_prompt or llm.n_tokens > keep or \
                list(llm.input_ids[:min(llm.n_tokens, keep)]) != tokens[:min(llm.n_tokens, keep)]:
            llm.reset()
        if llm.n_tokens < keep:
            llm.eval(tokens[llm.n_tokens:keep])
        out: list[int] = []
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {"top_k": 1, "temp": 0.0} if temperature == 0 else \
            {"temp": temperature, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
        if prompt.grammar is not None:  # llama-cpp-python's own grammar sampling, on the same GBNF
            from llama_cpp.llama_grammar import LlamaGrammar

            kwargs["grammar"] = LlamaGrammar.from_string(prompt.grammar, verbose=False)
        if temperature > 0:
            llm.set_seed(seed_of(prompt, repeat))
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
        self._on(self.llm.close)


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

"""Choosing a self-draft's blocks: acceptance is measured by teacher forcing (the target's greedy
answer is evaluated by the candidate draft in one batch, and each position counts as accepted when the
draft's argmax is the target's token) and the draft's cost per token is timed, then both go through
the same cost model the engine uses to choose draft lengths."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from localspec.errors import LocalspecError
from localspec.selfdraft.blocks import describe, make, ranges
from localspec.selfdraft.store import Recipe, target_digest

CALIBRATION = [
    "Write a Python function that returns the largest element of a list.",
    "Explain in two sentences what a compiler does.",
    "Rename the variable x to total:\n\ndef f(items):\n    x = 0\n    for i in items:\n        x += i\n    return x",
    "Write a haiku about autumn leaves.",
]


def _teacher_tokens(target_model, prompts: Sequence[list[int]], n: int) -> list[list[int]]:
    """The target's own greedy continuation of each prompt: what a perfect draft would propose."""
    from localspec.engine.kv import KvSequence

    kv = KvSequence(target_model)
    out = []
    for prompt in prompts:
        kv.reset()
        seq = list(prompt)
        logits = kv.extend(seq, [len(seq) - 1])[0]
        for _ in range(n):
            tok = int(np.argmax(logits))
            if target_model.vocab.is_eog(tok):
                break
            seq.append(tok)
            logits = kv.extend([tok], [0])[0]
        out.append(seq)
    kv.reset()
    return out


def _acceptance(draft_model, sequences: Sequence[list[int]], prompt_lens: Sequence[int]) -> float:
    """Share of answer positions where the draft's argmax, given the true prefix, is the target's token."""
    from localspec.engine.kv import KvSequence

    kv = KvSequence(draft_model)
    hits = total = 0
    for seq, start in zip(sequences, prompt_lens):
        if len(seq) <= start:
            continue
        kv.reset()
        rows = list(range(start - 1, len(seq) - 1))
        logits = kv.extend(seq[:-1], rows)
        guesses = np.argmax(logits, axis=1)
        truth = np.array(seq[start:])
        hits += int((guesses == truth).sum())
        total += len(truth)
    kv.reset()
    return hits / total if total else 0.0


def _draft_cost(draft_model, reps: int = 8) -> float:
    from localspec.engine.kv import KvSequence

    kv = KvSequence(draft_model)
    kv.reset()
    kv.extend([1, 2, 3, 4], [3])
    t0 = time.perf_counter()
    for i in range(reps):
        kv.extend([5 + i], [0])
    cost = (time.perf_counter() - t0) / reps
    kv.reset()
    return cost


def middle_out(count: int) -> list[int]:
    """Blocks from the middle outwards, the first and the last block at the very end."""
    inner = sorted(range(1, count - 1), key=lambda k: (abs(k - (count - 1) / 2), k))
    return inner + [k for k in (count - 1, 0) if count > 1] if count > 2 else list(range(count))


def drop_counts(n: int) -> list[int]:
    """How many of the least harmful blocks to drop together: from a few to most of them."""
    counts = sorted({max(2, round(n * f)) for f in (0.15, 0.25, 0.35, 0.5, 0.65, 0.8)} | {1})
    return [c for c in counts if c <= n]


class _Candidates:
    """Layer subsets measured against the target's own answers: each one's acceptance, draft cost and
    predicted speedup, and the best so far."""

    def __init__(self, target: Path, count: int, work: Path, sequences: list[list[int]], prompt_lens: list[int],
                 verify: Callable[[int], float], n_threads: int | None, progress: Callable[[str], None]):
        self.target, self.count, self.work = target, count, work
        self.sequences, self.prompt_lens, self.verify = sequences, prompt_lens, verify
        self.n_threads, self.progress = n_threads, progress
        self.digest = target_digest(target)
        self.best: Recipe | None = None
        self._tried: set[tuple[int, ...]] = set()

    def evaluate(self, keep: list[int]) -> Recipe | None:
        """Measure the draft that keeps these blocks (None: measured before)."""
        from localspec.engine.adaptive import speedup_bound
        from localspec.engine.backend import Model, ModelOptions

        if tuple(keep) in self._tried:
            return None
        self._tried.add(tuple(keep))
        path = make(self.target, keep, self.work / "candidate.gguf")
        draft = Model(path, ModelOptions(n_ctx=2048, n_threads=self.n_threads))
        try:
            alpha = _acceptance(draft, self.sequences, self.prompt_lens)
            per_token = _draft_cost(draft)
        finally:
            draft.close()
        predicted = speedup_bound(alpha, self.verify, per_token)
        plan = Recipe(target_sha256=self.digest, block_count=self.count, keep=keep, acceptance=round(alpha, 4),
                    draft_ms_per_token=round(per_token * 1000, 3), predicted_speedup=round(predicted, 4))
        self.progress(f"  {len(keep):3}/{self.count} layers {ranges(keep):24} acceptance {alpha:5.1%}  "
                      f"draft {per_token * 1000:6.1f} ms/token  predicted {predicted:.2f}x")
        if self.best is None or _merit(plan) > _merit(self.best):
            self.best = plan
        return plan


def search(target: Path, *, budget_s: float, prompts: Sequence[str] | None = None, answer_tokens: int = 48,
           n_threads: int | None = None, progress: Callable[[str], None] = lambda _m: None,
           work_dir: Path | None = None) -> Recipe:
    """Evaluate candidate layer subsets within the time budget; return the best as a Recipe (not yet saved)."""
    from localspec.engine.adaptive import CostModel
    from localspec.engine.backend import Model, ModelOptions
    from localspec.engine.calibration import calibrated_costs
    from localspec.engine.session import ChatTemplate

    t_start = time.perf_counter()
    _arch, count = describe(target)
    model = Model(target, ModelOptions(n_ctx=2048, n_threads=n_threads))
    tmp = Path(tempfile.mkdtemp(prefix="selfdraft-", dir=work_dir or _scratch(target)))
    try:
        template = ChatTemplate.for_model(model)
        texts = list(prompts or CALIBRATION)
        prompt_tokens = [template.tokens(model.vocab, [{"role": "user", "content": p}]) for p in texts]
        progress(f"the target's answers to {len(texts)} calibration prompts…")
        sequences = _teacher_tokens(model, prompt_tokens, answer_tokens)
        cost = CostModel(verify_s=calibrated_costs(model, True))
        candidates = _Candidates(target, count, tmp, sequences, [len(p) for p in prompt_tokens], cost.verify,
                                 n_threads, progress)

        def left() -> float:
            return budget_s - (time.perf_counter() - t_start)

        # 1. How much each block matters: acceptance with only that block removed (middle blocks first;
        #    the first and last usually matter most, and small budgets should not be spent on them).
        harm: dict[int, float] = {}
        for layer in middle_out(count):
            # At least one measurement however small the budget; then keep 40% for the joint drops.
            if harm and left() <= 0.4 * budget_s:
                break
            plan = candidates.evaluate([k for k in range(count) if k != layer])
            if plan is not None:
                harm[layer] = 1.0 - (plan.acceptance or 0.0)
        # 2. Drop the least harmful blocks together, more and more of them, while time remains.
        ranked = sorted(harm, key=lambda layer: harm[layer])
        for drop in drop_counts(len(ranked)):
            if left() <= 0:
                break
            doomed = set(ranked[:drop])
            candidates.evaluate([k for k in range(count) if k not in doomed])
        if candidates.best is None:
            raise LocalspecError("The time budget ended before any candidate was measured; give it more time.")
        return candidates.best
    finally:
        model.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _scratch(target: Path) -> Path | None:
    """Candidates are written and read back many times: RAM (/dev/shm) when it has room, else the temp dir."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and shutil.disk_usage(shm).free > 2 * target.stat().st_size:
            return shm
    except OSError:
        pass
    return None


def _merit(plan: Recipe) -> tuple[float, float]:
    """Predicted speedup first; where nothing pays (a tie at 1.0), accepted tokens per millisecond of drafting."""
    return (round(plan.predicted_speedup or 0.0, 3), (plan.acceptance or 0.0) / max(plan.draft_ms_per_token or 1e-9, 1e-9))

"""What a target's own heads should gain on this machine: its measured costs (verifying n positions, a
head step per draft token) at acceptance rates published for such heads. An estimate, printed as one:
no random-weight file accepts like a trained head, and the bench measures only what it ran."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.adaptive import CostModel, best_length


@dataclass(frozen=True)
class Published:
    """Acceptance someone measured and published: `kept[i]`, the share of drafts whose first i + 1 tokens
    were all kept (vLLM's per-position acceptance counts it so)."""

    what: str
    source: str
    kept: tuple[float, ...]

    def chained(self) -> list[float]:
        """Each position's chance to be kept given the ones before were (what best_length takes)."""
        before = (1.0, *self.kept[:-1])
        return [k / b if b else 0.0 for k, b in zip(self.kept, before)]


# Qwen3.5-122B-A10B's MTP head drafting 3 tokens under vLLM, Speed-Bench prompts (vllm-ascend v0.17.0rc1;
# its later releases reported less, traced there to a bug in their verify path). Position 1 alone varies
# with the text far more than this (0.91 on code, 0.49 on prose for a 27B of that architecture: docs/engine.md).
QWEN35_MTP = Published("Qwen3.5-122B-A10B's MTP head (vLLM, Speed-Bench)",
                       "github.com/vllm-project/vllm-ascend/issues/9871", (0.867, 0.743, 0.615))


@dataclass(frozen=True)
class Estimate:
    speedup: float          # expected tokens/s over plain decoding's, both at this machine's costs
    draft_len: int          # the best draft length at those costs (0: drafting does not pay)
    step_share: float       # a head step against one target token
    published: Published

    def describe(self) -> str:
        kept = self.published.kept
        rates = "/".join(f"{k:.3g}" for k in kept)
        gain = (f"{self.speedup:.2f}x plain decoding with {self.draft_len}-token drafts" if self.draft_len
                else "no gain: at these costs plain decoding is faster")
        return (f"MTP head, an estimate from this machine's costs, not a measured speed: {gain}, if it accepts "
                f"as {self.published.what} did ({rates} of drafts kept through positions 1-{len(kept)}; "
                f"{self.published.source}). A head step costs {self.step_share:.2f} of a target token here.")


def estimate(cost: CostModel, step_s: float, published: Published = QWEN35_MTP,
             plain_s: float | None = None, max_len: int | None = None) -> Estimate:
    """`cost`: the target's verifies with the head following; `plain_s`: plain decoding's seconds per token
    where it differs from one such verify (a load without the head: benchmarks/mtp_costs.py); `max_len`: the
    longest draft the heads can write (chained heads: as many as they are)."""
    plain_s = plain_s or cost.verify(1)
    k, rate = best_length(published.chained()[:max_len], cost, step_s, margin=0.0)
    return Estimate(rate * plain_s, k, step_s / plain_s, published)


def head_estimate(engine) -> Estimate | None:
    """The estimate for the engine's `mtp` drafter, if its target has heads."""
    drafter = engine.drafter("mtp")
    if drafter is None:
        return None
    return estimate(engine.cost, drafter.cost.per_token_s, max_len=drafter.max_len)

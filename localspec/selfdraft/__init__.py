"""Self-speculative drafts: a GGUF made of the target's own embeddings, output head and some of its blocks.

The vocabulary is the target's by construction, so it always pairs. `blocks.make` writes one for a given list
of blocks; `search.search` picks the list that maximizes the expected speculative speedup on
calibration prompts; `store` keeps each target's draft and its recipe; `build` is `draft make`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from localspec.errors import LocalspecError
from localspec.selfdraft.blocks import describe, make, parse_layers, ranges
from localspec.selfdraft.search import search
from localspec.selfdraft.store import (Recipe, find_self_draft, home, load_recipe, no_self_draft, save_recipe,
                                       target_digest, target_of)

__all__ = ["build", "describe", "make", "parse_layers", "search", "Recipe", "find_self_draft", "home", "load_recipe",
           "no_self_draft", "save_recipe", "target_digest", "target_of"]


def build(entry_or_path: str, *, keep: str | None, auto: bool, budget_s: float, out: Path | None,
          calibration: Path | None, progress: Callable[[str], None]) -> Recipe:
    """`localspec draft make`: choose the layers (given or searched), write the GGUF, remember it."""
    target = target_of(entry_or_path)
    _arch, count = describe(target)
    digest = target_digest(target)
    if keep and auto:
        raise LocalspecError("Give either --keep or --auto, not both.")
    if keep:
        plan = Recipe(target_sha256=digest, block_count=count, keep=parse_layers(keep, count))
    else:
        prompts = None
        if calibration is not None:
            try:
                prompts = [line.strip() for line in calibration.read_text().split("\n\n") if line.strip()]
            except OSError as exc:
                raise LocalspecError(f"Cannot read {calibration}: {exc.strerror}") from None
            if not prompts:
                raise LocalspecError(f"{calibration} has no prompts (separate them with blank lines).")
        progress(f"searching the layers of {target.name} ({count} blocks) for {budget_s:.0f}s")
        plan = search(target, budget_s=budget_s, prompts=prompts, progress=progress)
    path = out or home(digest) / f"{target.stem}.self-{ranges(plan.keep).replace(',', '_')}.gguf"
    progress(f"writing {path} ({len(plan.keep)} of {count} blocks: {ranges(plan.keep)})")
    make(target, plan.keep, path, target_sha256=digest)
    plan.file = str(path)
    save_recipe(plan)
    return plan

"""Drafters: cheap guesses at the target's next tokens, each one object behind `base.Drafter`.

Every drafter setting front doors offer (CLI choices, config, TUI, server, bench) comes from
`REGISTRY`. Adding a drafter is one module implementing `Drafter` (its `begin` makes each request's
`Turn`, which implements at least `offer`; a lookup returns its proposal with the offer) plus one line
here; the planner prices every registered drafter the setting allows each round and drafts with the
best (engine/planner.py).
"""

from __future__ import annotations

from localspec.engine.drafters.base import Draft, Drafter, Offer, Plan, Registration, Sources, Turn, text_only
from localspec.engine.drafters.copies import CopyDrafter
from localspec.engine.drafters.grammar import GrammarDrafter
from localspec.engine.drafters.history import HistoryDrafter
from localspec.engine.drafters.model import ModelDrafter
from localspec.engine.drafters.heads import HeadDrafter
from localspec.engine.drafters.blocks import BlockDrafter
from localspec.engine.drafters.ngram import NgramDrafter, OpeningDrafter

REGISTRY: tuple[Registration, ...] = (
    Registration("model", "the draft model", "draft model", lambda s: ModelDrafter.build(s, "model"),
                 needs="needs a draft model; this engine has none"),
    Registration("self", "a self-draft built from the target's own layers", "self-draft",
                 lambda s: ModelDrafter.build(s, "self"),
                 needs="needs a self-draft; build one with `localspec draft make TARGET`"),
    Registration("mtp", "the target's own multi-token-prediction heads, or its Gemma 4 assistant", "MTP head",
                 HeadDrafter.build,
                 needs="needs a target whose file carries MTP heads (as Qwen3.5's do), or a Gemma 4 assistant "
                       "as the draft; this one has neither"),
    Registration("eagle3", "an EAGLE-3 draft, trained on the target's hidden states", "EAGLE-3",
                 lambda s: HeadDrafter.build(s, "eagle3"),
                 needs="needs an EAGLE-3 draft (a pair whose draft file is one); this engine has none"),
    Registration("dflash", "a DFlash draft: a block at a time from the target's hidden states", "DFlash",
                 BlockDrafter.build,
                 needs="needs a DFlash draft (a pair whose draft file is one); this engine has none"),
    Registration("ngram", "copies from the prompt and the answer so far", "n-gram", CopyDrafter.build),
    Registration("history", "continuations of earlier requests' prompts and answers", "history",
                 HistoryDrafter.build, needs="is turned off (--no-history-drafts or the history_drafts setting)"),
    Registration("grammar", "what a request's grammar forces (JSON keys, a tool call's envelope)", "grammar",
                 GrammarDrafter.build),
)


def build(sources: Sources) -> list[Drafter]:
    """The registered drafters this engine can have, in registry order."""
    return [d for r in REGISTRY if (d := r.build(sources)) is not None]


__all__ = ["REGISTRY", "Draft", "Drafter", "Offer", "Plan", "Registration", "Sources", "Turn", "build", "text_only",
           "CopyDrafter", "GrammarDrafter", "HistoryDrafter", "ModelDrafter", "HeadDrafter", "BlockDrafter", "NgramDrafter", "OpeningDrafter"]

"""An engine's options, and what it tells a user about a target it cannot draft for."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.model import LanguageModel


@dataclass(frozen=True)
class EngineOptions:
    drafter: str = "auto"            # one of contract.DRAFTER_SETTINGS
    draft_len: int | None = None     # None: adaptive; N: always draft N
    draft_p_min: float = 0.5         # stop a model draft when its top probability falls below this
    calibrate: bool = True           # measure verify costs at load (cached per model file and machine)
    learn_costs: bool = True         # refine those costs with the timings of real rounds
    history_drafts: bool = True      # draft from earlier requests' text (the "history" drafter)
    cache_reuse: int = 0             # reuse cached runs of at least this many tokens that moved (0: prefix only)
    tree_leaves: int | None = None   # a model draft's second candidates, verified as a tree: None as many as the
                                     # target's verify costs make free; N: that many (experiments); 0: chains only


def plain_only_warning(target: LanguageModel) -> str:
    """Why a target whose recurrent state cannot be rolled back decodes without drafts."""
    architecture = target.meta("general.architecture") or "this architecture"
    return (f"{architecture} keeps a recurrent state that llama.cpp cannot roll back token by token: "
            "answers are decoded plainly, without drafts.")

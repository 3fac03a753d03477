"""What the tests of drafters that read the target's hidden states share: the script that records
llama.cpp's own drafts (scripts/mtp_reference.py), its recordings (tests/data/KIND_reference.json), and
the round-for-round comparison with them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from localspec.engine.backend import system_info
from localspec.engine.events import Round

SCRIPTS = Path(__file__).parent.parent / "scripts"


def _script():
    spec = importlib.util.spec_from_file_location("mtp_reference", SCRIPTS / "mtp_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()


def recorded(kind: str) -> dict:
    return json.loads((Path(__file__).parent / "data" / f"{kind}_reference.json").read_text())


def drafts_of(events) -> tuple[list[list[int]], list[int]]:
    """Each drafted round's tokens, and how many of them the target kept."""
    rounds = [e for e in events if isinstance(e, Round) and e.drafted]
    return [list(r.accepted + r.rejected) for r in rounds], [len(r.accepted) for r in rounds]


def assert_drafts_match(events, reference: dict, min_rounds: int) -> tuple[list[int], int]:
    """Our drafts against llama.cpp's, in every round before the reference's budget first cut a draft
    (after it, the two answers' ends differ); returns our accepted counts and that round count. On the
    kernels that recorded the reference: every draft and every accepted count. On others: the target's
    states differ in their last bits, which a random head amplifies at near ties, so most rounds
    (docs/engine.md, "Heads that draft from the target's states", says how many agreed on AVX2)."""
    drafts, accepted = drafts_of(events)
    n = next(i for i, v in enumerate(reference["verified"] + [0]) if v != reference["n_max"])
    assert n >= min_rounds
    if reference["cpu"] == system_info():
        assert drafts[:n] == reference["drafts"][:n]
        assert accepted[:n] == reference["accepted"][:n]
    else:
        assert sum(a == b for a, b in zip(drafts[:n], reference["drafts"][:n])) >= 0.7 * n
    return accepted, n

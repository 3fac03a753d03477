"""What `localspec check` finds: whether a draft can pair with a target (llama.cpp's pairing rules, and
a head's hidden-state width), and whether an image projector loads on a target. Lines for the CLI to
print, each a heading or a rule that passed or failed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Line:
    text: str
    ok: bool | None = None  # None: a heading, not a rule


def pair(target_path: Path, draft_path: Path) -> tuple[list[Line], bool]:
    """Can the draft draft for the target: each rule, and the verdict."""
    from localspec.engine.backend import VocabFile
    from localspec.engine.pairing import check_pair, hidden_state_width

    with VocabFile(target_path) as tv, VocabFile(draft_path) as dv:
        report = check_pair(tv.vocab, dv.vocab)
        decoding = tv.decoding(), dv.decoding()
        kind = {"eagle3": "EAGLE-3", "dflash": "DFlash", "gemma4-assistant": "Gemma 4 assistant"}.get(
            dv.meta("general.architecture") or "")
        if kind:  # it reads the target's hidden states: their width
            report = report.with_rule(f"{kind} draft's target width", *hidden_state_width(tv, dv))
    lines = [Line(f"target: {target_path}\n        {decoding[0]}\ndraft:  {draft_path}\n        {decoding[1]}")]
    lines += [Line(f"{result.rule}: {result.detail}", result.ok) for result in report.results]
    lines.append(Line("These two can be paired." if report.ok else f"Not compatible: {report.first_failure}"))
    return lines, report.ok


def projector(target_path: Path, projector_path: Path) -> tuple[list[Line], bool]:
    """Does the projector load on the target (so that it sees images)."""
    from localspec.engine.files import projector_problem

    problem = projector_problem(target_path, projector_path)
    return [Line(f"images: {projector_path}"),
            Line(problem or "the projector loads on this target: it sees images", not problem)], not problem

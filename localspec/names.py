"""What a model name given by a user means: a GGUF path, or a catalog id (a model or a pair).

One rule for every front door: a name ending in .gguf, or naming a file that exists, is a path;
anything else is looked up in the catalog (and must be pulled).
"""

from __future__ import annotations

from pathlib import Path

from localspec.errors import LocalspecError


def is_path(name: str) -> bool:
    return Path(name).suffix == ".gguf" or Path(name).exists()


def model_file(name: str) -> Path:
    """The GGUF file of one model: a path as it is, or a (pulled) catalog model id."""
    from localspec.catalog import PairSpec, load_catalog
    from localspec.pull import model_path

    if is_path(name):
        return Path(name)
    entry = load_catalog().resolve(name)
    if isinstance(entry, PairSpec):
        raise LocalspecError(f"'{name}' is a pair; give a model id or a GGUF path.")
    return model_path(entry)


def resolve(id_or_path: str, draft: str | None = None) -> tuple[Path, Path | None]:
    """The target's and the draft's files for a pair id, a model id or a GGUF path (`draft` overrides)."""
    from localspec.catalog import PairSpec, load_catalog
    from localspec.pull import model_path

    draft_path: Path | None = None
    if is_path(id_or_path):
        target_path = Path(id_or_path)
    else:
        entry = load_catalog().resolve(id_or_path)
        if isinstance(entry, PairSpec):
            target_path, draft_path = model_path(entry.target), model_path(entry.draft)
        else:
            target_path = model_path(entry)
    if draft:
        draft_path = model_file(draft)
    return target_path, draft_path


def catalog_projector(id_or_path: str) -> Path | None:
    """The pulled image projector the catalog lists for an id's target (None: a path, none listed, or not
    pulled)."""
    from localspec.catalog import PairSpec, load_catalog
    from localspec.pull import locate

    if is_path(id_or_path):
        return None
    entry = load_catalog().resolve(id_or_path)
    target = entry.target if isinstance(entry, PairSpec) else entry
    return locate(target.mmproj) if target.mmproj is not None else None


def existing_target(id_or_path: str) -> Path:
    """The target's file of a pair id, model id or path, which must exist."""
    path = resolve(id_or_path)[0]
    if not path.exists():
        raise LocalspecError(f"No such file: {path}")
    return path

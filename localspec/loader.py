"""`load()`: a catalog pair or model id, or GGUF paths, to a running engine.

The engine itself only knows files (`engine.api.load_files`); which files an id means, and where a
self-draft of a target was kept, is known here, a layer above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localspec.engine.api import Engine, load_files
from localspec.errors import LocalspecError


def _is_path(name: str) -> bool:
    return Path(name).suffix == ".gguf" or Path(name).exists()


def model_file(name: str) -> Path:
    """The GGUF file of one model: a path as it is, or a (pulled) catalog model id."""
    from localspec.catalog import PairSpec, load_catalog
    from localspec.pull import model_path

    if _is_path(name):
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
    if _is_path(id_or_path):
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


def load(id_or_path: str, *, draft: str | None = None, self_draft: str | Path | None = None,
         **options: Any) -> Engine:
    """Load a catalog pair or model id, or a GGUF path (with `draft=` another path or id). With the
    drafter 'self' and no `self_draft`, the one `localspec draft make` built for this target. `options`
    are `engine.api.load_files`'s: drafter, draft_len, n_ctx, n_threads, n_gpu_layers, draft_gpu_layers,
    calibrate."""
    target_path, draft_path = resolve(id_or_path, draft)
    if options.get("drafter") == "self" and self_draft is None:
        from localspec.selfdraft import find_self_draft

        self_draft = find_self_draft(str(target_path))
        if self_draft is None:
            raise LocalspecError(f"No self-draft for {target_path.name} yet; build one with "
                                 f"`localspec draft make {id_or_path}`.")
    return load_files(target_path, draft_path=draft_path, self_draft_path=self_draft, **options)

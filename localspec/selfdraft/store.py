"""Where self-drafts live: one folder per target (keyed by its sha256) with the draft and the recipe
it was made by, which `--drafter self` finds again."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from localspec import paths
from localspec.errors import LocalspecError


@dataclass
class Recipe:
    """Which blocks a self-draft keeps, what its search measured, and its file."""

    target_sha256: str
    block_count: int
    keep: list[int]
    acceptance: float | None = None
    draft_ms_per_token: float | None = None
    predicted_speedup: float | None = None
    file: str = ""


def home(target_sha256: str) -> Path:
    return paths.models_dir() / "self-drafts" / target_sha256[:16]


def target_digest(target: Path) -> str:
    """The target's sha256: from the registry when localspec pulled it (no re-hashing), else computed."""
    from localspec.registry import Registry

    registry = Registry()
    for model_id in registry.ids():
        record = registry.valid(model_id)
        if record is not None and Path(record.path).resolve() == target.resolve():
            return record.sha256
    # A file localspec did not pull is hashed once per version of it (path, size, mtime), not per load.
    st = target.stat()
    key = f"{target.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    cache_file = paths.cache_dir() / "digests.json"
    try:
        cache = json.loads(cache_file.read_text(encoding="utf-8"))
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache.get(key), str):
        return cache[key]
    from localspec.pull import sha256_file

    digest = sha256_file(target, f"hashing {target.name}")
    cache[key] = digest
    try:
        paths.ensure(cache_file.parent)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1), encoding="utf-8")
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only cache only costs the next load another hash
    return digest


def save_recipe(plan: Recipe) -> Path:
    folder = paths.ensure(home(plan.target_sha256))
    (folder / "plan.json").write_text(json.dumps(asdict(plan), indent=1))
    return folder / "plan.json"


def load_recipe(target_sha256: str) -> Recipe | None:
    path = home(target_sha256) / "plan.json"
    try:
        data = json.loads(path.read_text())
        plan = Recipe(**data)
    except (OSError, ValueError, TypeError):
        return None
    return plan if plan.target_sha256 == target_sha256 and Path(plan.file).exists() else None


def target_of(entry_or_path: str) -> Path:
    """A GGUF path, a model id, or a pair id (its target) -> the target's file."""
    from localspec.names import existing_target

    return existing_target(entry_or_path)


def find_self_draft(entry_or_path: str) -> Path | None:
    """The self-draft made for this target, if any."""
    try:
        target = target_of(entry_or_path)
    except LocalspecError:
        return None
    plan = load_recipe(target_digest(target))
    return Path(plan.file) if plan else None


def no_self_draft(entry_or_path: str) -> LocalspecError:
    """The error for `--drafter self` on a target without a self-draft."""
    return LocalspecError(f"No self-draft for {entry_or_path} yet; build one with `localspec draft make {entry_or_path}`.")

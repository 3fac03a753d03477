"""What is pulled: `localspec list` and `localspec rm` (which files removing a model or a pair
deletes, and deleting them).

A pair's draft that another pulled pair still uses stays; a model named on its own is removed even if
a pair uses it (the user asked for exactly that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localspec import paths
from localspec.catalog import ModelSpec, PairSpec, load_catalog
from localspec.pull import delete_hub_file, pulled_with
from localspec.registry import Registry
from localspec.units import human_bytes


def listing(available: bool = False) -> list[str]:
    """`localspec list`: the pulled pairs and models (with `available`, every catalog entry)."""
    catalog = load_catalog()
    registry = Registry()
    pulled = {mid for mid in catalog.models if registry.valid(mid)}
    lines = ["Pairs:"]
    for pair in catalog.pairs.values():
        have = [m.id in pulled for m in pair.models]
        if not available and not any(have):
            continue
        state = "ready" if all(have) else ("missing " + ", ".join(m.id for m, h in zip(pair.models, have) if not h)
                                           if any(have) else "not pulled")
        default = " (default)" if pair.id == catalog.default_pair else ""
        projector = pair.target.mmproj
        sees = "" if projector is None else (", sees images" if projector.id in pulled else f", images need {projector.id}")
        lines.append(f"  {pair.id:22} {state:28} {pair.target.id} + {pair.draft.id}{default}{sees}")
    lines.append("Models:")
    for model in catalog.models.values():
        record = registry.valid(model.id)
        if record:
            lines.append(f"  {model.id:30} {human_bytes(record.size):>9}  {record.source:4}  {record.path}")
        elif available:
            lines.append(f"  {model.id:30} {human_bytes(model.size):>9}  {'/'.join(model.sources):8} not pulled  "
                         f"{model.title}")
    if not pulled and not available:
        lines.append(f"  (nothing pulled yet; try `localspec pull {catalog.default_pair}` or `localspec list --available`)")
    return lines


@dataclass
class Removal:
    entry_id: str
    models: list[ModelSpec]                                # pulled models that go
    kept: list[tuple[str, str]] = field(default_factory=list)  # (model id, the pulled pair that still uses it)
    size: int = 0                                          # bytes their files take

    def delete(self, registry: Registry | None = None) -> list[Path]:
        registry = registry or Registry()
        return [path for model in self.models for path in remove_model(model, registry)]


def plan_removal(entry_id: str, registry: Registry | None = None) -> Removal:
    registry = registry or Registry()
    catalog = load_catalog()
    entry = catalog.resolve(entry_id)
    removal = Removal(entry_id, [])
    for _role, model in pulled_with(entry):
        keepers = [p.id for p in catalog.pairs_using(model.id)
                   if p.id != entry_id and all(registry.valid(m.id) for m in p.models)]
        if isinstance(entry, PairSpec) and keepers:
            removal.kept.append((model.id, keepers[0]))
        elif (record := registry.get(model.id)) is not None:
            removal.models.append(model)
            removal.size += record.size
    return removal


def remove_model(model: ModelSpec, registry: Registry | None = None) -> list[Path]:
    """Delete a pulled model's files (HF cache files too: that is what frees the space)."""
    registry = registry or Registry()
    record = registry.get(model.id)
    removed: list[Path] = []
    candidates = [Path(f) for f in record.files] if record else []
    own = paths.models_dir() / model.filename
    if own.exists() and own not in candidates:
        candidates.append(own)
    for path in candidates:
        if path.is_symlink() or path.exists():
            if record and record.source == "hub":
                delete_hub_file(path)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    registry.drop(model.id)
    return removed

"""The model catalog: models.yaml (shipped) merged with the user's own catalog file.

A *model* is one GGUF (possibly split into parts); a *pair* is a target and its draft. Ids of both
kinds share one namespace so that `localspec pull ID` takes either.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from localspec import paths
from localspec.errors import LocalspecError, UnknownIdError


@dataclass(frozen=True)
class FileSpec:
    name: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class HubSource:
    repo: str
    files: tuple[FileSpec, ...]
    revision: str = "main"

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Chunk:
    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class PypiSource:
    file: str
    chunks: tuple[Chunk, ...]
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    id: str
    title: str = ""
    family: str = ""
    license: str = ""
    hub: HubSource | None = None
    pypi: PypiSource | None = None
    mmproj: "ModelSpec | None" = None  # the image projector pulled and loaded with it (`mmproj: ID`)

    @property
    def filename(self) -> str:
        """The file llama.cpp loads (the first part of a split)."""
        if self.hub:
            return self.hub.files[0].name
        assert self.pypi is not None
        return self.pypi.file

    @property
    def size(self) -> int | None:
        if self.hub and self.hub.size:
            return self.hub.size
        return self.pypi.size if self.pypi else None

    @property
    def sources(self) -> list[str]:
        return [name for name, src in (("hub", self.hub), ("pypi", self.pypi)) if src]


@dataclass(frozen=True)
class PairSpec:
    id: str
    target: ModelSpec
    draft: ModelSpec
    title: str = ""

    @property
    def models(self) -> tuple[ModelSpec, ModelSpec]:
        return (self.target, self.draft)


@dataclass
class Catalog:
    models: dict[str, ModelSpec] = field(default_factory=dict)
    pairs: dict[str, PairSpec] = field(default_factory=dict)
    default_pair: str = ""

    @property
    def ids(self) -> list[str]:
        return sorted({*self.models, *self.pairs})

    def resolve(self, entry_id: str) -> ModelSpec | PairSpec:
        if entry_id in self.pairs:
            return self.pairs[entry_id]
        if entry_id in self.models:
            return self.models[entry_id]
        close = difflib.get_close_matches(entry_id, self.ids, n=4, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UnknownIdError(
            f"No model or pair named '{entry_id}' in the catalog.{hint} "
            "See `localspec list --available` for every id."
        )

    def pairs_using(self, model_id: str) -> list[PairSpec]:
        """The pairs with this model as target, draft or the target's image projector."""
        return [p for p in self.pairs.values()
                if model_id in (p.target.id, p.draft.id, p.target.mmproj.id if p.target.mmproj else None)]


def shipped_catalog_text() -> str:
    """The catalog localspec ships: the copy a built package carries (setup.py puts it there), else, run
    from a source checkout, the repository's top-level models.yaml itself."""
    packaged = resources.files("localspec").joinpath("models.yaml")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parent.parent / "models.yaml").read_text(encoding="utf-8")


def load_catalog(user_file: Path | None = None) -> Catalog:
    """The shipped catalog, extended and overridden entry by entry by the user's file."""
    raw = _parse(shipped_catalog_text(), "the shipped models.yaml")
    user_file = user_file or paths.user_catalog_file()
    if user_file.exists():
        user = _parse(user_file.read_text(encoding="utf-8"), str(user_file))
        for section in ("models", "pairs"):
            raw.setdefault(section, {}).update(user.get(section) or {})
        if user.get("default_pair"):
            raw["default_pair"] = user["default_pair"]
    return build_catalog(raw)


def _parse(text: str, origin: str) -> dict:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise LocalspecError(f"{origin} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise LocalspecError(f"{origin} must be a mapping with 'models' and 'pairs'.")
    return data


def build_catalog(raw: dict) -> Catalog:
    models = {mid: _model(mid, entry) for mid, entry in (raw.get("models") or {}).items()}
    for mid, entry in (raw.get("models") or {}).items():
        ref = entry.get("mmproj")
        if ref is None:
            continue
        if ref not in models or models[ref].family != "clip":
            raise LocalspecError(f"catalog model '{mid}': mmproj '{ref}' is not a projector (family: clip) in the catalog.")
        models[mid] = dataclasses.replace(models[mid], mmproj=models[ref])
    pairs: dict[str, PairSpec] = {}
    for pid, entry in (raw.get("pairs") or {}).items():
        if pid in models:
            raise LocalspecError(f"catalog id '{pid}' names both a model and a pair; ids must be unique.")
        try:
            target, draft = models[entry["target"]], models[entry["draft"]]
        except KeyError as exc:
            raise LocalspecError(f"pair '{pid}' refers to {exc}, which is not a model in the catalog.") from None
        pairs[pid] = PairSpec(id=pid, target=target, draft=draft, title=entry.get("title", ""))
    default = raw.get("default_pair", "")
    if default and default not in pairs and default not in models:
        raise LocalspecError(f"default_pair '{default}' is not in the catalog.")
    return Catalog(models=models, pairs=pairs, default_pair=default)


def _model(model_id: str, entry: dict) -> ModelSpec:
    if not isinstance(entry, dict):
        raise LocalspecError(f"catalog model '{model_id}' must be a mapping.")
    hub = pypi = None
    try:
        if "hub" in entry:
            h = entry["hub"]
            hub = HubSource(
                repo=h["repo"],
                revision=str(h.get("revision") or "main"),
                files=tuple(_file(f) for f in h["files"]),
            )
            if not hub.files:
                raise LocalspecError(f"catalog model '{model_id}': hub.files is empty.")
        if "pypi" in entry:
            p = entry["pypi"]
            pypi = PypiSource(
                file=p["file"],
                size=p.get("size"),
                sha256=_sha(p.get("sha256")),
                chunks=tuple(Chunk(c["package"], str(c["version"]), c["member"]) for c in p["chunks"]),
            )
    except (KeyError, TypeError) as exc:
        raise LocalspecError(f"catalog model '{model_id}' is missing a field: {exc}") from None
    if not hub and not pypi:
        raise LocalspecError(f"catalog model '{model_id}' has no source (needs 'hub' or 'pypi').")
    return ModelSpec(
        id=model_id,
        title=entry.get("title", model_id),
        family=entry.get("family", ""),
        license=entry.get("license", ""),
        hub=hub,
        pypi=pypi,
    )


def _file(f: dict | str) -> FileSpec:
    if isinstance(f, str):
        return FileSpec(name=f)
    return FileSpec(name=f["name"], size=f.get("size"), sha256=_sha(f.get("sha256")))


def _sha(value: str | None) -> str | None:
    return value.lower() if value else None

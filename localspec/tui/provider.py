"""Where the chat app gets engines from: the catalog and the local models, or a running server.

The app talks to a provider only; tests give it a scripted one. Every method may block (they run in
thread workers), none touches widgets.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from localspec.names import is_path

if TYPE_CHECKING:
    from localspec.catalog import ModelSpec, PairSpec
    from localspec.engine.contract import ChatEngine


@dataclass(frozen=True)
class Choice:
    id: str
    kind: str             # "pair" or "model"
    label: str
    size: int | None
    ready: bool           # pulled and verified
    default: bool = False


class Provider(Protocol):
    """Where the chat app's models come from: the catalog and this process (`LocalProvider`), a
    running server (`tui.remote.RemoteProvider`), or the tests' script."""

    def choices(self) -> list[Choice]: ...
    def default_id(self) -> str: ...
    def is_ready(self, entry_id: str) -> bool: ...
    def pull(self, entry_id: str, say: Callable[[str], None]) -> None: ...
    def pull_progress(self, entry_id: str) -> tuple[int, int | None]: ...
    def load(self, entry_id: str) -> ChatEngine: ...


class LocalProvider:
    """Models from the catalog, pulled into LOCALSPEC_HOME, loaded in this process."""

    def __init__(self, n_ctx: int = 4096, n_gpu_layers: int | None = None, history: str = "saved",
                 placement: dict | None = None, flash_attn: bool | None = None,
                 mmproj: tuple[str, str] | None = None):
        self.n_ctx = n_ctx
        self.n_gpu_layers = n_gpu_layers
        self.history = history  # the "history" drafter: saved, memory or off (engine.files.load_files)
        self.flash_attn = flash_attn  # None: llama.cpp decides (settings.yaml's flash_attention)
        self.placement = placement or {}  # RPC workers for the target (loader.load's rpc, tensor_split)
        self.mmproj = mmproj  # (model id, projector path): `chat MODEL --mmproj PATH`, for that model only
        self._lock = threading.Lock()
        self._resolved: dict[str, ModelSpec | PairSpec] = {}

    def _catalog(self):
        from localspec.catalog import load_catalog

        return load_catalog()

    def choices(self) -> list[Choice]:
        from localspec.registry import Registry

        catalog, registry = self._catalog(), Registry()
        out = []
        for pair in catalog.pairs.values():
            ready = all(registry.valid(m.id) for m in pair.models)
            size = sum(m.size or 0 for m in pair.models) or None
            out.append(Choice(pair.id, "pair", f"{pair.target.id} + {pair.draft.id}", size, ready,
                              pair.id == catalog.default_pair))
        for model in catalog.models.values():
            out.append(Choice(model.id, "model", model.title, model.size, bool(registry.valid(model.id))))
        return sorted(out, key=lambda c: (not c.ready, not c.default, c.kind != "pair", c.id))

    def default_id(self) -> str:
        return self._catalog().default_pair

    def is_ready(self, entry_id: str) -> bool:
        from localspec.catalog import PairSpec
        from localspec.registry import Registry

        if is_path(entry_id):
            return Path(entry_id).exists()
        entry = self._catalog().resolve(entry_id)
        models = entry.models if isinstance(entry, PairSpec) else [entry]
        registry = Registry()
        return all(registry.valid(m.id) for m in models)

    def pull(self, entry_id: str, say: Callable[[str], None]) -> None:
        from localspec.pull import pull_entry

        pull_entry(self._catalog().resolve(entry_id), say=say)

    def pull_progress(self, entry_id: str) -> tuple[int, int | None]:
        from localspec.pull import bytes_on_disk

        entry = self._resolved.get(entry_id)
        if entry is None:  # polled twice a second while a pull runs: parse the catalog once
            entry = self._resolved[entry_id] = self._catalog().resolve(entry_id)
        return bytes_on_disk(entry)

    def load(self, entry_id: str):
        from localspec.loader import load
        from localspec.selfdraft import find_self_draft

        return load(entry_id, n_ctx=self.n_ctx, n_gpu_layers=self.n_gpu_layers, draft_gpu_layers=self.n_gpu_layers,
                    self_draft=find_self_draft(entry_id), history=self.history, flash_attn=self.flash_attn,
                    mmproj=self.mmproj[1] if self.mmproj and self.mmproj[0] == entry_id else None, **self.placement)

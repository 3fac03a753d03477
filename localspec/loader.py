"""`load()`: a catalog pair or model id, or GGUF paths, to a running engine.

The engine itself only knows files (`engine.files.load_files`); which files an id means, and where a
self-draft of a target was kept, is known here, a layer above it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.engine.api import Engine
from localspec.engine.files import load_files
from localspec.errors import LocalspecError
from localspec.names import catalog_projector, resolve

if TYPE_CHECKING:
    from localspec.engine.calibration import Calibration
    from localspec.hosted import HostedEngine


def load(id_or_path: str, *, rpc: list[str] | None = None, **options: Any) -> Engine | HostedEngine:
    """Load a catalog pair or model id, or a GGUF path, as `load_here` does; but with `rpc` workers
    the engine runs in a child process (localspec.hosted: a worker dying mid-answer must not end this
    one)."""
    target_path, opener = _opener(id_or_path, rpc=rpc, **options)
    if rpc:
        from localspec.hosted import HostedEngine

        return HostedEngine(opener, target_path, rpc)
    return opener()


def load_here(id_or_path: str, **options: Any) -> Engine:
    """Load a catalog pair or model id, or a GGUF path, in this process (the bench reads its costs),
    even with RPC workers. Options are `_opener`'s."""
    return _opener(id_or_path, **options)[1]()


def _opener(id_or_path: str, *, draft: str | None = None, self_draft: str | Path | None = None,
            rpc: list[str] | None = None, tensor_split: tuple[float, ...] = (),
            **options: Any) -> tuple[Path, functools.partial[Engine]]:
    """The target's file, and how to open the engine (a picklable call): `draft=` another path or id; with the drafter 'self'
    and no `self_draft`, the one `localspec draft make` built for this target. `rpc`: workers (checked
    HOST:PORT, localspec.rpc.parse_workers) that hold the target's layers, split by `tensor_split`
    (default: by their free memory). `options` are `engine.files.load_files`'s: drafter, draft_len,
    n_ctx, n_threads, n_gpu_layers, draft_gpu_layers, calibrate, slots, history, flash_attn."""
    target_path, draft_path = resolve(id_or_path, draft)
    if options.get("mmproj") is None and (listed := catalog_projector(id_or_path)) is not None:
        # the catalog's projector, pulled with the target: images on where it loads, a warning where not
        options = {**options, "mmproj": listed, "mmproj_optional": True}
    if options.get("drafter") == "self" and self_draft is None:
        from localspec.selfdraft import find_self_draft, no_self_draft

        self_draft = find_self_draft(str(target_path))
        if self_draft is None:
            raise no_self_draft(id_or_path)
    return target_path, functools.partial(open_files, target_path, draft_path, self_draft, tuple(rpc or ()),
                                          tensor_split, options)


def open_files(target_path: Path, draft_path: Path | None, self_draft: str | Path | None, rpc: tuple[str, ...],
               tensor_split: tuple[float, ...], options: dict[str, Any]) -> Engine:
    """The engine of resolved files, in this process (also what a hosted engine's child runs: a
    module-level function, so that a `functools.partial` of it crosses to a spawned process)."""
    if rpc:
        options = {**options, **_rpc_placement(list(rpc), tensor_split)}
    return load_files(target_path, draft_path=draft_path, self_draft_path=self_draft, **options)


def _rpc_placement(workers: list[str], tensor_split: tuple[float, ...]) -> dict[str, Any]:
    """The target's devices on RPC workers, after asking each for its protocol version (ggml's own
    client would end the process on a worker that is down or speaks another version)."""
    from localspec.engine import backend
    from localspec.rpc import check_workers, require_rpc_backend

    require_rpc_backend()
    if tensor_split and len(tensor_split) != len(workers):
        raise LocalspecError(f"--tensor-split gives {len(tensor_split)} shares for {len(workers)} RPC workers.")
    check_workers(workers)
    return {"target_devices": tuple(backend.rpc_devices(workers)), "tensor_split": tensor_split,
            "placement": "rpc:" + ",".join(workers)}


def calibrate(id_or_path: str, *, n_ctx: int = 4096, force: bool = False, flash_attn: bool | None = None,
              say=lambda message: None) -> list[tuple[str, "Calibration", bool]]:
    """Measure the verify costs of a pair's target (and its draft's own costs) as the engine would at
    load, and cache those that can be trusted. Without `force`, a trusted cached calibration is kept.
    Returns (what, calibration, from the cache) for each."""
    from localspec.engine import calibration
    from localspec.engine.backend import Model, ModelOptions

    target_path, draft_path = resolve(id_or_path)
    busy = calibration.others_busy_now(0.5)
    if busy is not None and busy > calibration.QUIET_OTHERS_BUSY:
        say(f"Other programs are using {busy:.0%} of the CPU: a calibration taken now is likely not trusted "
            "(and then not cached). Measuring anyway...")
    # (file, what, sizes, prefill): the engine's own calibrations of a pair (drafters/model.py for the draft's)
    jobs: list[tuple[Path, str, tuple[int, ...], bool]] = [
        (target_path, "target verify costs", calibration.CALIBRATION_SIZES, False)]
    if draft_path is not None:
        jobs += [(draft_path, "draft one-token cost", (1,), False), (draft_path, "draft prefill cost", (64,), True)]
    out: list[tuple[str, calibration.Calibration, bool]] = []
    models: dict[Path, Model] = {}
    try:
        for path, what, sizes, prefill in jobs:
            if path not in models:
                say(f"Loading {path.name}...")
                models[path] = Model(path, ModelOptions(n_ctx=n_ctx, flash_attn=flash_attn))
            say(f"Measuring {what} of {path.name}...")
            calibrator = calibration.Calibrator(models[path], True, sizes, prefill, force=force)
            out.append((f"{what} ({path.name})", calibrator.current, calibrator.from_cache))
    finally:
        for model in models.values():
            model.close()
    return out

"""`localspec doctor`: the build, the devices, where files live, and what localspec has stored."""

from __future__ import annotations

import os

from localspec import __version__, paths
from localspec.errors import LocalspecError
from localspec.units import human_bytes


def report() -> list[str]:
    """Every line `localspec doctor` prints."""
    from localspec.engine import backend

    lines: list[str] = []
    say = lines.append
    gpu = backend.supports_gpu_offload()
    say(f"localspec           {__version__}")
    say(f"llama-cpp-python    {backend.bindings_version()}")
    say(f"GPU offload         {'yes' if gpu else 'no (CPU only build)'}")
    say(f"RPC workers         {'yes (--rpc HOST:PORT; localspec rpc-worker)' if backend.supports_rpc() else 'no (rebuild: bash setup.sh)'}")
    for device in backend.devices():
        mem = f"{device.free_bytes / 2**30:.1f}/{device.total_bytes / 2**30:.1f} GiB free" if device.total_bytes else ""
        say(f"  device {device.kind:5} {device.name}: {device.description} {mem}")
    say(f"CPU threads         {os.cpu_count()} (localspec uses all by default)")
    say(f"llama.cpp features  {backend.system_info()}")
    say(f"flash attention     {_flash_attention_state()}")
    say(f"recurrent targets   drafts verified and rolled back: {', '.join(sorted(backend.ROLLBACK_ARCHITECTURES))}; "
        "other recurrent or hybrid models decode plainly")
    from localspec.engine.backend.staging import unavailable

    heads = unavailable()
    say(f"hidden-state drafts {'no: ' + heads if heads else 'yes: MTP heads in a target file (mtp), EAGLE-3 drafts (eagle3), DFlash drafts (dflash)'}")
    from localspec.engine.backend.vision import available as images_unavailable

    blind = images_unavailable()
    say(f"images              {'no: ' + blind if blind else 'yes, for a model loaded with its projector (--mmproj PATH, or a catalog model that lists one)'}")
    if not gpu:
        say("With an NVIDIA GPU and the CUDA toolkit, `bash setup.sh` builds for it (docs/gpu.md).")
    say(f"models              {paths.models_dir()}")
    say(f"config              {paths.config_dir()}")
    say(f"cache               {paths.cache_dir()}")
    from localspec.pull import hub_cache_dir, hub_endpoint

    say(f"HF endpoint/cache   {hub_endpoint()}  {hub_cache_dir() or '(huggingface_hub default)'}")
    lines += _history()
    lines += _calibrations()
    return lines


def _flash_attention_state() -> str:
    from localspec.config import load_user_config

    try:
        setting = load_user_config().flash_attention
    except LocalspecError as exc:
        return f"unknown ({exc})"
    state = "llama.cpp's choice" if setting == "auto" else setting
    return f"{state} (flash_attention: {setting} in settings)"


def _history() -> list[str]:
    """The "history" drafter's stored indexes: one per target file, each bounded."""
    from localspec.config import load_user_config
    from localspec.engine.drafters.suffix_index import MAX_TOKENS, describe_file, memory_bound

    lines: list[str] = []
    say = lines.append
    folder = paths.history_dir()
    try:
        state = "on" if load_user_config().history_drafts else "off (history_drafts: false in settings)"
    except LocalspecError as exc:
        state = f"unknown ({exc})"
    say(f"drafting history    {state}; {folder}")
    say(f"  bounded to {MAX_TOKENS:,} tokens per target (~{human_bytes(memory_bound())} in memory while loaded)")
    for file in sorted(folder.glob("*.npz")) if folder.exists() else []:
        try:
            documents, tokens = describe_file(file)
            detail = f"{documents} requests, {tokens:,} tokens"
        except ValueError as exc:
            detail = f"unreadable ({exc}); ignored and rebuilt at the next load"
        say(f"  {file.name}: {human_bytes(file.stat().st_size)}, {detail}")
    return lines


def _calibrations() -> list[str]:
    """Each cached calibration: its age, and how it was measured (only trusted ones are cached)."""
    import time

    from localspec.engine.calibration import cached_entries
    from localspec.units import human_age

    lines: list[str] = []
    say = lines.append
    entries = cached_entries()
    say(f"calibrations        {len(entries)} cached in {paths.calibration_file()} (`localspec calibrate ID --force` "
               "measures again)")
    for entry in entries:
        c = entry.calibration
        if c is None:
            say(f"  {entry.model} {entry.kind}, ctx {entry.n_ctx}: unchecked (cached before calibrations were "
                       "checked); measured again at the next load")
            continue
        state = "trusted" if c.trusted else f"not trusted: {c.problem}"
        shape = f", 16 positions {c.costs[16] / c.costs[1]:.1f}x one" if 1 in c.costs and 16 in c.costs else ""
        say(f"  {entry.model} {entry.kind}, ctx {entry.n_ctx}: {state}, {human_age(time.time() - c.measured_at)} "
                   f"old; {c.headline()}{shape} ({c.how()})")
    return lines

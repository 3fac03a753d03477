"""A self-draft's GGUF: the target's embeddings, output head and some of its blocks (renumbered,
`block_count` updated, every other key copied), written with the gguf library."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from localspec.errors import LocalspecError

# Architectures whose blocks are independent transformer layers (dropping one leaves a valid model).
SUPPORTED = {"llama", "qwen2", "qwen3", "gemma3", "gemma2", "gemma", "mistral", "phi3", "starcoder2", "granite",
             "olmo2", "smollm3", "exaone"}
# Hybrid and recurrent models: their per-layer kinds and states are tied to layer positions.
REFUSED = {"mamba", "mamba2", "rwkv6", "rwkv7", "rwkv6qwen2", "jamba", "falcon-h1", "granitehybrid", "lfm2",
           "nemotron_h", "qwen3next", "plamo2", "arwkv7", "bamba", "gemma3n"}
BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def _reader(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as exc:  # truncated or not a GGUF at all
        raise LocalspecError(f"{path} is not a readable GGUF file: {exc}") from None


def describe(path: Path) -> tuple[str, int]:
    """(architecture, number of blocks) of a GGUF; refuses what cannot be self-drafted."""
    reader = _reader(path)
    arch_field = reader.get_field("general.architecture")
    if arch_field is None:
        raise LocalspecError(f"{path.name} has no general.architecture; not a model GGUF.")
    arch = str(arch_field.contents())
    if arch in REFUSED:
        raise LocalspecError(f"{path.name} is a {arch} model: a hybrid/recurrent architecture whose layers cannot "
                             "simply be dropped, so it cannot have a self-draft. Use the n-gram drafter.")
    if arch not in SUPPORTED:
        raise LocalspecError(f"Self-drafts are not supported for the {arch} architecture yet "
                             f"(supported: {', '.join(sorted(SUPPORTED))}).")
    count = reader.get_field(f"{arch}.block_count")
    if count is None:
        raise LocalspecError(f"{path.name} has no {arch}.block_count.")
    return arch, int(count.contents())


def parse_layers(spec: str, block_count: int) -> list[int]:
    """'0-3,6,10-11' -> [0, 1, 2, 3, 6, 10, 11], checked against the block count."""
    keep: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise LocalspecError(f"Cannot read '{part}' in --keep; use numbers and ranges like 0-3,6,10-11.")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if a > b:
            raise LocalspecError(f"The range {part} runs backwards.")
        keep.update(range(a, b + 1))
    layers = sorted(keep)
    if not layers:
        raise LocalspecError("Keep at least one layer.")
    if layers[-1] >= block_count:
        raise LocalspecError(f"Layer {layers[-1]} does not exist: the target has {block_count} (0-{block_count - 1}).")
    if len(layers) == block_count:
        raise LocalspecError("That keeps every layer: the draft would be the target itself.")
    return layers


def make(target: Path, keep: Sequence[int], out: Path, target_sha256: str = "") -> Path:
    """Write a GGUF with the target's non-block tensors and blocks `keep`, renumbered 0..len(keep)-1."""
    import gguf

    arch, count = describe(target)
    keep = sorted(set(keep))
    if not keep or keep[-1] >= count or keep[0] < 0:
        raise LocalspecError(f"Layers {keep} do not fit a model of {count} blocks.")
    reader = _reader(target)
    renumber = {old: new for new, old in enumerate(keep)}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), arch=arch, endianess=reader.endianess)
    try:
        for f in reader.fields.values():
            if f.name == "general.architecture" or f.name.startswith("GGUF."):
                continue
            kind = f.types[0]
            sub = f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            value = f.contents()
            if f.name == f"{arch}.block_count":
                value = len(keep)
            elif f.name.startswith(f"{arch}.") and kind == gguf.GGUFValueType.ARRAY and len(value) == count:
                value = [value[i] for i in keep]  # per-layer settings follow their layers
            elif f.name == "general.name":
                value = f"{value} (self-draft, {len(keep)}/{count} layers)"
            writer.add_key_value(f.name, value, kind, sub_type=sub)
        writer.add_array("localspec.self_draft.layers", list(keep))
        if target_sha256:
            writer.add_string("localspec.self_draft.target_sha256", target_sha256)
        tensors = []
        for t in reader.tensors:
            m = BLOCK.match(t.name)
            if m:
                layer = int(m.group(1))
                if layer not in renumber:
                    continue
                name = f"blk.{renumber[layer]}.{m.group(2)}"
            else:
                name = t.name
            tensors.append((name, t))
            writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _name, t in tensors:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
    except OSError as exc:
        writer.close()
        partial.unlink(missing_ok=True)
        raise LocalspecError(f"Could not write {out}: {exc.strerror or exc}") from None
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    partial.replace(out)
    return out


def ranges(layers: Sequence[int]) -> str:
    """Blocks as ranges: [0, 1, 2, 5] -> '0-2,5'."""
    out: list[str] = []
    start: int | None = None
    prev = 0
    for x in layers:
        if start is None:
            start = prev = x
        elif x == prev + 1:
            prev = x
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = x
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)

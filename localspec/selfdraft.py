"""Self-speculative drafts: a GGUF made of the target's own embeddings, output head and some of its blocks.

The vocabulary is the target's by construction, so it always pairs. `make` writes one for a given list
of blocks (renumbered, `block_count` updated, every other key copied) with the gguf library;
`search` picks the list that maximizes the expected speculative speedup on calibration prompts:
acceptance is measured by teacher forcing (the target's greedy answer is evaluated by the candidate
draft in one batch, and each position counts as accepted when the draft's argmax is the target's
token) and the draft's cost per token is timed, then both go through the same cost model the
engine uses to choose draft lengths.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from localspec import paths
from localspec.errors import LocalspecError

# Architectures whose blocks are independent transformer layers (dropping one leaves a valid model).
SUPPORTED = {"llama", "qwen2", "qwen3", "gemma3", "gemma2", "gemma", "mistral", "phi3", "starcoder2", "granite",
             "olmo2", "smollm3", "exaone"}
# Hybrid and recurrent models: their per-layer kinds and states are tied to layer positions.
REFUSED = {"mamba", "mamba2", "rwkv6", "rwkv7", "rwkv6qwen2", "jamba", "falcon-h1", "granitehybrid", "lfm2",
           "nemotron_h", "qwen3next", "plamo2", "arwkv7", "bamba", "gemma3n"}
BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")

CALIBRATION = [
    "Write a Python function that returns the largest element of a list.",
    "Explain in two sentences what a compiler does.",
    "Rename the variable x to total:\n\ndef f(items):\n    x = 0\n    for i in items:\n        x += i\n    return x",
    "Write a haiku about autumn leaves.",
]


@dataclass
class Plan:
    target_sha256: str
    block_count: int
    keep: list[int]
    acceptance: float | None = None
    draft_ms_per_token: float | None = None
    predicted_speedup: float | None = None
    file: str = ""


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


# ----------------------------------------------------------------------------- where self-drafts live


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


def save_plan(plan: Plan) -> Path:
    folder = paths.ensure(home(plan.target_sha256))
    (folder / "plan.json").write_text(json.dumps(asdict(plan), indent=1))
    return folder / "plan.json"


def load_plan(target_sha256: str) -> Plan | None:
    path = home(target_sha256) / "plan.json"
    try:
        data = json.loads(path.read_text())
        plan = Plan(**data)
    except (OSError, ValueError, TypeError):
        return None
    return plan if plan.target_sha256 == target_sha256 and Path(plan.file).exists() else None


def target_of(entry_or_path: str) -> Path:
    """A GGUF path, a model id, or a pair id (its target) -> the target's file."""
    from localspec.catalog import PairSpec, load_catalog
    from localspec.pull import model_path

    if entry_or_path.endswith(".gguf") or Path(entry_or_path).exists():
        path = Path(entry_or_path)
        if not path.exists():
            raise LocalspecError(f"No such file: {path}")
        return path
    entry = load_catalog().resolve(entry_or_path)
    return model_path(entry.target if isinstance(entry, PairSpec) else entry)


def find_self_draft(entry_or_path: str) -> Path | None:
    """The self-draft made for this target, if any."""
    try:
        target = target_of(entry_or_path)
    except LocalspecError:
        return None
    plan = load_plan(target_digest(target))
    return Path(plan.file) if plan else None


# ----------------------------------------------------------------------------- choosing the layers


def _teacher_tokens(target_model, prompts: Sequence[list[int]], n: int) -> list[list[int]]:
    """The target's own greedy continuation of each prompt: what a perfect draft would propose."""
    from localspec.engine.kv import KvSequence

    kv = KvSequence(target_model)
    out = []
    for prompt in prompts:
        kv.reset()
        seq = list(prompt)
        logits = kv.extend(seq, [len(seq) - 1])[0]
        for _ in range(n):
            tok = int(np.argmax(logits))
            if target_model.vocab.is_eog(tok):
                break
            seq.append(tok)
            logits = kv.extend([tok], [0])[0]
        out.append(seq)
    kv.reset()
    return out


def _acceptance(draft_model, sequences: Sequence[list[int]], prompt_lens: Sequence[int]) -> float:
    """Share of answer positions where the draft's argmax, given the true prefix, is the target's token."""
    from localspec.engine.kv import KvSequence

    kv = KvSequence(draft_model)
    hits = total = 0
    for seq, start in zip(sequences, prompt_lens):
        if len(seq) <= start:
            continue
        kv.reset()
        rows = list(range(start - 1, len(seq) - 1))
        logits = kv.extend(seq[:-1], rows)
        guesses = np.argmax(logits, axis=1)
        truth = np.array(seq[start:])
        hits += int((guesses == truth).sum())
        total += len(truth)
    kv.reset()
    return hits / total if total else 0.0


def _draft_cost(draft_model, reps: int = 8) -> float:
    from localspec.engine.kv import KvSequence

    kv = KvSequence(draft_model)
    kv.reset()
    kv.extend([1, 2, 3, 4], [3])
    t0 = time.perf_counter()
    for i in range(reps):
        kv.extend([5 + i], [0])
    cost = (time.perf_counter() - t0) / reps
    kv.reset()
    return cost


def middle_out(count: int) -> list[int]:
    """Blocks from the middle outwards, the first and the last block at the very end."""
    inner = sorted(range(1, count - 1), key=lambda k: (abs(k - (count - 1) / 2), k))
    return inner + [k for k in (count - 1, 0) if count > 1] if count > 2 else list(range(count))


def drop_counts(n: int) -> list[int]:
    """How many of the least harmful blocks to drop together: from a few to most of them."""
    counts = sorted({max(2, round(n * f)) for f in (0.15, 0.25, 0.35, 0.5, 0.65, 0.8)} | {1})
    return [c for c in counts if c <= n]


def search(target: Path, *, budget_s: float, prompts: Sequence[str] | None = None, answer_tokens: int = 48,
           n_threads: int | None = None, progress: Callable[[str], None] = lambda _m: None,
           work_dir: Path | None = None) -> Plan:
    """Evaluate candidate layer subsets within the time budget; return the best as a Plan (not yet saved)."""
    from localspec.engine.calibration import calibrated_costs
    from localspec.engine.adaptive import CostModel, speedup_bound
    from localspec.engine.backend import Model, ModelOptions
    from localspec.engine.session import ChatTemplate

    t_start = time.perf_counter()
    _arch, count = describe(target)
    digest = target_digest(target)
    model = Model(target, ModelOptions(n_ctx=2048, n_threads=n_threads))
    tmp = Path(tempfile.mkdtemp(prefix="selfdraft-", dir=work_dir or _scratch(target)))
    try:
        vocab = model.vocab
        template = ChatTemplate.for_model(model)
        texts = list(prompts or CALIBRATION)
        prompt_tokens = [template.tokens(vocab, [{"role": "user", "content": p}]) for p in texts]
        progress(f"the target's answers to {len(texts)} calibration prompts…")
        sequences = _teacher_tokens(model, prompt_tokens, answer_tokens)
        cost = CostModel(verify_s=calibrated_costs(model, True))
        best: Plan | None = None
        tried: set[tuple[int, ...]] = set()

        def evaluate(keep: list[int]) -> Plan | None:
            nonlocal best
            if tuple(keep) in tried:
                return None
            tried.add(tuple(keep))
            path = make(target, keep, tmp / "candidate.gguf")
            draft = Model(path, ModelOptions(n_ctx=2048, n_threads=n_threads))
            try:
                alpha = _acceptance(draft, sequences, [len(p) for p in prompt_tokens])
                per_token = _draft_cost(draft)
            finally:
                draft.close()
            predicted = speedup_bound(alpha, cost.verify, per_token)
            plan = Plan(target_sha256=digest, block_count=count, keep=keep, acceptance=round(alpha, 4),
                        draft_ms_per_token=round(per_token * 1000, 3), predicted_speedup=round(predicted, 4))
            progress(f"  {len(keep):3}/{count} layers {_ranges(keep):24} acceptance {alpha:5.1%}  "
                     f"draft {per_token * 1000:6.1f} ms/token  predicted {predicted:.2f}x")
            if best is None or _merit(plan) > _merit(best):
                best = plan
            return plan

        def left() -> float:
            return budget_s - (time.perf_counter() - t_start)

        # 1. How much each block matters: acceptance with only that block removed (middle blocks first;
        #    the first and last usually matter most, and small budgets should not be spent on them).
        harm: dict[int, float] = {}
        for layer in middle_out(count):
            # At least one measurement however small the budget; then keep 40% for the joint drops.
            if harm and left() <= 0.4 * budget_s:
                break
            plan = evaluate([k for k in range(count) if k != layer])
            if plan is not None:
                harm[layer] = 1.0 - (plan.acceptance or 0.0)
        # 2. Drop the least harmful blocks together, more and more of them, while time remains.
        ranked = sorted(harm, key=lambda layer: harm[layer])
        for drop in drop_counts(len(ranked)):
            if left() <= 0:
                break
            doomed = set(ranked[:drop])
            evaluate([k for k in range(count) if k not in doomed])
        if best is None:
            raise LocalspecError("The time budget ended before any candidate was measured; give it more time.")
        return best
    finally:
        model.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _scratch(target: Path) -> Path | None:
    """Candidates are written and read back many times: RAM (/dev/shm) when it has room, else the temp dir."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and shutil.disk_usage(shm).free > 2 * target.stat().st_size:
            return shm
    except OSError:
        pass
    return None


def _merit(plan: Plan) -> tuple[float, float]:
    """Predicted speedup first; where nothing pays (a tie at 1.0), accepted tokens per millisecond of drafting."""
    return (round(plan.predicted_speedup or 0.0, 3), (plan.acceptance or 0.0) / max(plan.draft_ms_per_token or 1e-9, 1e-9))


def _ranges(layers: Sequence[int]) -> str:
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


def build(entry_or_path: str, *, keep: str | None, auto: bool, budget_s: float, out: Path | None,
          calibration: Path | None, progress: Callable[[str], None]) -> Plan:
    """`localspec draft make`: choose the layers (given or searched), write the GGUF, remember it."""
    target = target_of(entry_or_path)
    _arch, count = describe(target)
    digest = target_digest(target)
    if keep and auto:
        raise LocalspecError("Give either --keep or --auto, not both.")
    if keep:
        plan = Plan(target_sha256=digest, block_count=count, keep=parse_layers(keep, count))
    else:
        prompts = None
        if calibration is not None:
            try:
                prompts = [line.strip() for line in calibration.read_text().split("\n\n") if line.strip()]
            except OSError as exc:
                raise LocalspecError(f"Cannot read {calibration}: {exc.strerror}") from None
            if not prompts:
                raise LocalspecError(f"{calibration} has no prompts (separate them with blank lines).")
        progress(f"searching the layers of {target.name} ({count} blocks) for {budget_s:.0f}s")
        plan = search(target, budget_s=budget_s, prompts=prompts, progress=progress)
    path = out or home(digest) / f"{target.stem}.self-{_ranges(plan.keep).replace(',', '_')}.gguf"
    progress(f"writing {path} ({len(plan.keep)} of {count} blocks: {_ranges(plan.keep)})")
    make(target, plan.keep, path, target_sha256=digest)
    plan.file = str(path)
    save_plan(plan)
    return plan

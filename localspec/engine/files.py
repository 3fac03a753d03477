"""An engine on GGUF files: the target, and optionally a draft model and a self-draft, each checked
against llama.cpp's pairing rules before any weights are read. Catalog ids are resolved a layer up
(`localspec.loader`)."""

from __future__ import annotations

from pathlib import Path

from localspec import paths
from localspec.engine.api import Engine, EngineOptions


def load_files(
    target_path: str | Path,
    *,
    draft_path: str | Path | None = None,
    self_draft_path: str | Path | None = None,
    drafter: str = "auto",
    draft_len: int | None = None,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
    draft_gpu_layers: int | None = None,
    calibrate: bool = True,
    slots: int = 1,
    history: str = "saved",
    cache_reuse: int = 0,
    target_devices: tuple[int, ...] = (),
    tensor_split: tuple[float, ...] = (),
    placement: str = "",
    flash_attn: bool | None = None,
    tree_leaves: int | None = None,
    mmproj: str | Path | None = None,
    mmproj_optional: bool = False,
) -> Engine:
    """An engine on GGUF files: the target, optionally a draft model and a self-draft (catalog ids are
    resolved a layer up, in `localspec.loader`). Pairs are checked before any weights are read.
    `slots`: KV sequences of the target that requests are routed to (n_ctx is shared out among them).
    `history`: the "history" drafter's index of earlier requests: "saved" (per target file under the
    cache folder, kept across runs), "memory" (this engine's life only) or "off". `target_devices`: ggml
    devices for every layer of the target (RPC workers, see localspec.rpc), split by `tensor_split`;
    `placement` names them for the calibration cache. The draft stays local. `flash_attn`: None lets
    llama.cpp decide (settings.yaml's flash_attention). `mmproj`: the target's image projector (images in
    prompts, engine/backend/vision.py); `mmproj_optional`: one that cannot be loaded is a warning, not an error
    (the catalog's, loaded without being asked for)."""
    from localspec.engine.backend import Model, ModelOptions
    from localspec.engine.backend.assistant import Gemma4Assistant
    from localspec.engine.backend.dflash import DFlashDraft
    from localspec.engine.backend.eagle3 import Eagle3Draft
    from localspec.engine.backend.gguf import read_architecture
    from localspec.engine.drafters.model import MAX_TREE_LEAVES

    if history not in ("saved", "memory", "off"):
        raise ValueError(f"history must be saved, memory or off (got {history!r})")
    # What kind of draft it is, read once from its header: a second model, or one beside the target (an
    # EAGLE-3 or DFlash draft, or a Gemma 4 assistant, which drafts as the target's MTP head would: `mtp`).
    kind = read_architecture(Path(draft_path)) if draft_path is not None else None
    if drafter in ("none", "ngram", "self", "history") or (drafter == "mtp" and kind != "gemma4-assistant"):
        draft_path = kind = None  # do not spend memory on a draft that will not be used
    target_path = Path(target_path)
    if draft_path is not None:
        _require_pair(target_path, Path(draft_path), f"{Path(draft_path).name} cannot draft for {target_path.name}")
    if self_draft_path is not None:
        _require_pair(target_path, Path(self_draft_path),
                      f"{Path(self_draft_path).name} is not a self-draft of {target_path.name}")

    eagle3_draft, dflash_draft, assistant_draft = (kind == k for k in ("eagle3", "dflash", "gemma4-assistant"))
    # A draft model's candidate trees take spare sequences of a one-slot target (engine/tree.py).
    drafts_trees = tree_leaves != 0 and (self_draft_path is not None or (
        draft_path is not None and not assistant_draft and not eagle3_draft and not dflash_draft))
    # Plain decoding keeps no snapshots of a recurrent state: they only serve dropping drafts, and on a GPU
    # they cost time (docs/gpu.md, "Hybrid targets and MTP heads"); a follow-up resumes at a checkpoint.
    loaded = ModelOptions(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_seq=slots,
                          devices=target_devices, tensor_split=tensor_split, placement=placement,
                          flash_attn=flash_attn, mtp=drafter in ("auto", "mtp"),
                          tree_seqs=MAX_TREE_LEAVES if drafts_trees else 0)
    target = Model(target_path, loaded.with_(rollback=0) if drafter == "none" else loaded)
    draft_model = self_model = eagle3 = dflash = assistant = None
    try:
        # The draft model has a sequence per slot, each of a slot's context (drafters/model.py).
        local = ModelOptions(n_ctx=target.n_ctx * target.n_seq, n_threads=n_threads, n_gpu_layers=draft_gpu_layers,
                             n_seq=target.n_seq, flash_attn=flash_attn)
        if draft_path is not None and assistant_draft:
            assistant = Gemma4Assistant(Path(draft_path), target)  # drafts as the target's head would
            draft_path = None
        elif draft_path is not None and eagle3_draft:
            # drafts from the target's hidden states, beside it (the target closes it)
            eagle3 = Eagle3Draft(Path(draft_path), target)
            draft_path = None
        elif draft_path is not None and dflash_draft:
            dflash = DFlashDraft(Path(draft_path), target)  # the same, a block at a time
            draft_path = None
        unseeing = _attach_projector(target, mmproj, mmproj_optional) if mmproj is not None else None
        draft_model = Model(Path(draft_path), local) if draft_path is not None else None
        self_model = Model(Path(self_draft_path), local) if self_draft_path is not None else None
        options = EngineOptions(drafter=drafter, draft_len=draft_len, calibrate=calibrate,
                                history_drafts=history != "off", cache_reuse=cache_reuse, tree_leaves=tree_leaves)
        engine = Engine(target, draft_model, options, self_draft=self_model, eagle3=eagle3, dflash=dflash,
                        assistant=assistant,
                        history_file=paths.history_index_file(target_path) if history == "saved" else None)
        if unseeing:
            engine.load_warnings.append(f"images are off: {unseeing}")
        return engine
    except BaseException:
        for model in (target, draft_model, self_model):
            if model is not None:
                model.close()
        raise


def projector_problem(target_path: str | Path, mmproj: str | Path) -> str | None:
    """Why `mmproj` cannot give the target at `target_path` images (None: it can), found by loading both as
    `load_files` would (the target's weights on the CPU, a small context)."""
    from localspec.engine.backend import Model, ModelOptions

    target = Model(Path(target_path), ModelOptions(n_ctx=256, n_gpu_layers=0))
    try:
        return _attach_projector(target, mmproj, optional=True)
    finally:
        target.close()


def _attach_projector(target, mmproj: str | Path, optional: bool) -> str | None:
    """Images in the target's prompts through `mmproj`; where it cannot be loaded and is `optional`, why not
    (for a warning: the model answers text)."""
    from localspec.engine.backend.vision import Projector
    from localspec.errors import LocalspecError

    try:
        projector = Projector(mmproj, target, threads=target.options.threads(),
                              use_gpu=target.options.gpu_layers() != 0)
    except LocalspecError as exc:
        if not optional:
            raise
        return str(exc)
    target.attach_projector(projector)
    return None


def _require_pair(target_path: Path, draft_path: Path, complaint: str) -> None:
    """llama.cpp's pairing rules on the two vocabularies (vocab-only loads), before any weights are read."""
    from localspec.engine.backend import VocabFile
    from localspec.engine.pairing import check_pair
    from localspec.errors import IncompatiblePairError

    with VocabFile(target_path) as tv, VocabFile(draft_path) as dv:
        report = check_pair(tv.vocab, dv.vocab)
    if not report.ok:
        raise IncompatiblePairError(f"{complaint}: {report.first_failure}")

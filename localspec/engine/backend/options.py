"""How to load one GGUF (`ModelOptions`): its context, threads, GPU layers, sequences and what its state
keeps; None means: decide from the machine."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import llama_cpp as L

from localspec.engine.backend.gguf import ROLLBACK_POSITIONS
from localspec.engine.backend.system import supports_gpu_offload

MAX_LOGITS_PER_CALL = 64


@dataclass(frozen=True)
class ModelOptions:
    """How to load one GGUF. None means: decide from the machine."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int | None = None  # None: everything when GPU offload exists, else 0
    flash_attn: bool | None = None    # None: llama.cpp decides (attention_type)
    mmap: bool | None = None          # None: llama.cpp decides (mmap on CPUs); False: read into memory (less RSS,
                                      # slower decoding on CPUs); True: mmap explicitly
    n_outputs_max: int = MAX_LOGITS_PER_CALL  # logits rows one decode may return; 0: llama.cpp's default (n_batch)
    n_seq: int = 1                    # KV sequences (slots); n_ctx is shared out among them, as llama-server's -np
    devices: tuple[int, ...] = ()     # ggml devices to place every layer on (RPC workers: rpc_devices); () = llama.cpp's
    tensor_split: tuple[float, ...] = ()  # share of the layers on each of `devices`; () = by their free memory
    placement: str = ""               # where the layers are, for cache keys: "" local, "rpc:HOST:PORT,…"
    kv_unified: bool = False          # one KV buffer for all sequences (candidate trees need it)
    rollback: int = ROLLBACK_POSITIONS  # recurrent/hybrid targets: snapshots of each sequence's state kept per decode,
                                      # so a verify can drop up to this many draft tokens (llama.cpp's n_rs_seq); the
                                      # longest draft such a target is sent. Each costs one more copy of the state.
    mtp: bool = True                  # load and follow the file's MTP heads, if it has any (the `mtp` drafter)
    tree_seqs: int = 0                # spare sequences for a candidate tree's other branches (engine/tree.py); only
                                      # for one slot of a model whose positions can be dropped: they share one KV
                                      # buffer with it (kv_unified), so a shared node is held once

    def with_(self, **changes) -> "ModelOptions":
        return dataclasses.replace(self, **changes)

    def threads(self) -> int:
        return self.n_threads or max(1, os.cpu_count() or 1)

    def load_mode(self) -> int:
        # mmap by default: reading the weights into memory saves the mapped originals' resident pages
        # (llama.cpp keeps them beside its CPU-repacked copy) but decodes slower on CPUs
        # (docs/performance.md, "Memory"); mmap=False opts in.
        if self.mmap is None:
            return L.LLAMA_LOAD_MODE_AUTO
        return L.LLAMA_LOAD_MODE_MMAP if self.mmap else L.LLAMA_LOAD_MODE_NONE

    def attention_type(self) -> int:
        """Flash attention as `flash_attn` says; None: llama.cpp's choice (on, on CPUs)."""
        # Left on by default on CPUs: with it, batched logits equal one-token logits bit for bit for small
        # batches, so verified greedy answers part from plain ones less often, and prompts are faster; off
        # makes verify batches after long contexts cheaper (settings.yaml's `flash_attention` chooses).
        if self.flash_attn is None:
            return L.LLAMA_FLASH_ATTN_TYPE_AUTO
        return L.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED

    def gpu_layers(self) -> int:
        if self.n_gpu_layers is not None:
            return self.n_gpu_layers
        return -1 if self.devices or supports_gpu_offload() else 0

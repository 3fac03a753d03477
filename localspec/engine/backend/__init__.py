"""llama.cpp through llama-cpp-python's low-level C bindings. The only package that touches ctypes.

Why not the high-level `Llama` class: with a draft model attached it requests logits for every
prompt token (a full output-layer pass each, 152k columns for Qwen), and it hides the KV cache we
need to roll back. Here each `decode` asks for logits only at the positions the caller names.

`system`: the process-wide side (log, start, what the build supports, devices, the RPC server);
`gguf`: loading a file, its tokenizer and metadata, quantizing; `options`: how a file is loaded;
`llama`: models with their contexts and KV sequences, their images' side in `images` and `grids`.
"""

from localspec.engine.backend.gguf import ROLLBACK_ARCHITECTURES, Vocab, VocabFile, quantize
from localspec.engine.backend.llama import Model
from localspec.engine.backend.options import MAX_LOGITS_PER_CALL, ModelOptions
from localspec.engine.backend.system import (Device, bindings_version, build_id, devices, init, rpc_devices,
                                             serve_rpc, supports_gpu_offload, supports_rpc, system_info)

__all__ = ["MAX_LOGITS_PER_CALL", "ROLLBACK_ARCHITECTURES", "Model", "ModelOptions", "Vocab", "VocabFile", "quantize", "Device",
           "bindings_version", "build_id", "devices", "init", "rpc_devices", "serve_rpc", "supports_gpu_offload",
           "supports_rpc", "system_info"]

"""llama.cpp's process-wide side: its log, its backend's start, what this build supports (GPU
offload, RPC), the devices it sees and the RPC server. Only this package touches ctypes."""


from __future__ import annotations

import collections
import ctypes
import functools
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as L

from localspec.errors import LocalspecError

_GGML_LOG_WARN = 3
_GGML_LOG_CONT = 5

_init_lock = threading.Lock()
_initialized = False
_recent_problems: collections.deque[str] = collections.deque(maxlen=12)
_problems_logged = 0  # ever appended; a mark taken before a call finds the lines logged since
_last_level = 0


@L.llama_log_callback
def _on_log(level: int, text: bytes, _user_data) -> None:
    """Keep warnings and errors so that a failed load can say why; drop llama.cpp's chatter."""
    global _last_level, _problems_logged
    if level != _GGML_LOG_CONT:
        _last_level = level
    if _last_level >= _GGML_LOG_WARN:
        line = text.decode("utf-8", "replace").rstrip()
        if line:
            _recent_problems.append(line)
            _problems_logged += 1
    if os.environ.get("LOCALSPEC_LLAMA_LOG"):
        os.write(2, text)


def init() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            L.llama_log_set(_on_log, ctypes.c_void_p(0))
            L.llama_backend_init()
            _initialized = True


def problems_mark() -> int:
    """A mark to take before a llama.cpp call; `problems_since(mark)` says what it logged as wrong."""
    return _problems_logged


def problems_since(mark: int) -> str:
    new = min(_problems_logged - mark, len(_recent_problems))
    lines = list(_recent_problems)[len(_recent_problems) - new:] if new > 0 else []
    return "; ".join(line for line in lines if "error" in line.lower() or "fail" in line.lower())[:400]


# ----------------------------------------------------------------------------- system


def supports_gpu_offload() -> bool:
    """A GPU this build can offload to. (llama.cpp's own llama_supports_gpu_offload() is also true for
    any build with the RPC backend, GPU or not.)"""
    return any(d.kind in ("gpu", "igpu") for d in devices())


def supports_rpc() -> bool:
    """Built with llama.cpp's RPC backend (-DGGML_RPC=ON): layers can be placed on RPC workers."""
    init()
    return bool(L.llama_supports_rpc())


def _ggml(name: str = "libggml.so") -> ctypes.CDLL:
    return ctypes.CDLL(str(Path(L.__file__).parent / "lib" / name))


def rpc_devices(endpoints: list[str]) -> list[int]:
    """The ggml devices of RPC workers (HOST:PORT each), in order, for `ModelOptions.devices`.

    Callers check that each worker answers first (localspec.rpc): ggml's RPC client ends the process
    when it cannot reach one."""
    init()
    rpc, ggml = _ggml("libggml-rpc.so"), _ggml()
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    out: list[int] = []
    for endpoint in endpoints:
        reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
        count = ggml.ggml_backend_reg_dev_count(reg) if reg else 0
        if not count:
            raise LocalspecError(f"The RPC worker {endpoint} offers no device.")
        out += [ggml.ggml_backend_reg_dev_get(reg, i) for i in range(count)]
    return out


def serve_rpc(endpoint: str, threads: int, cache_dir: Path | None = None) -> None:
    """llama.cpp's RPC server on this machine's CPU (what its `rpc-server` tool runs); blocks for good."""
    init()
    rpc, ggml = _ggml("libggml-rpc.so"), _ggml()
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    cpu = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    devs = (ctypes.c_void_p * 1)(cpu)
    rpc.ggml_backend_rpc_start_server.restype = None
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                                  ctypes.POINTER(ctypes.c_void_p)]
    rpc.ggml_backend_rpc_start_server(endpoint.encode(), str(cache_dir).encode() if cache_dir else None,
                                      threads, 1, devs)


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    kind: str
    free_bytes: int
    total_bytes: int


def devices() -> list[Device]:
    """ggml's backend devices (CPU, CUDA, Metal, Vulkan…) with their memory."""
    init()
    try:
        lib = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libggml.so"))
    except OSError:
        return []
    try:
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
            fn.restype = ctypes.c_char_p
            fn.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    except AttributeError:
        return []
    kinds = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Device(
            name=(lib.ggml_backend_dev_name(dev) or b"").decode(),
            description=(lib.ggml_backend_dev_description(dev) or b"").decode(),
            kind=kinds.get(lib.ggml_backend_dev_type(dev), "other"),
            free_bytes=free.value,
            total_bytes=total.value,
        ))
    return out


def system_info() -> str:
    init()
    return L.llama_print_system_info().decode("utf-8", "replace").strip()


def bindings_version() -> str:
    return getattr(L, "__version__", "unknown")


@functools.cache
def build_id() -> str:
    """Which llama.cpp build computes (version and kernels): a cost measured under another is stale."""
    return hashlib.sha256(f"{bindings_version()}|{system_info()}".encode()).hexdigest()[:12]


def utf8(text: str) -> bytes:
    """`text` as UTF-8, a lone surrogate (half of a UTF-16 pair an editor cut, valid in JSON) as U+FFFD,
    as llama-server's tokenizer reads it."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")

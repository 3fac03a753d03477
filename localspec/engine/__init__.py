"""The speculative decoding engine (llama.cpp through llama-cpp-python's ctypes bindings)."""

# llama.cpp's native libraries must be loaded before numpy's. A CUDA build's libggml-cuda carries and
# exports its own libstdc++ symbols; loaded after numpy (which brings the system's), llama.cpp crashes
# in std::regex while reading a BPE vocabulary (seen on an H200 with CUDA 13: importing numpy first
# segfaulted llama_model_load_from_file; importing llama_cpp first worked). Every engine module is
# imported through this package, so this import comes first.
import llama_cpp  # noqa: F401  (import for its side effect: the native libraries, in the right order)

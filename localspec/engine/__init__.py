"""The speculative decoding engine (llama.cpp through llama-cpp-python's ctypes bindings).

Only `backend` needs llama.cpp; the contract, the events and the pure numpy modules import without it.
"""

# llama.cpp's native libraries must be loaded before numpy's. A CUDA build's libggml-cuda carries and
# exports its own libstdc++ symbols; loaded after numpy (which brings the system's), llama.cpp crashes
# in std::regex while reading a BPE vocabulary (importing numpy first segfaults
# llama_model_load_from_file; importing llama_cpp first works). Nearly every front door
# imports an engine module before anything that brings numpy (textual does not; gguf does), so the
# native libraries are loaded here, whenever llama.cpp is installed at all.
try:
    import llama_cpp  # noqa: F401  (import for its side effect: the native libraries, in the right order)
except ImportError:  # a client-only install (`chat --connect`), or tools that read events
    pass

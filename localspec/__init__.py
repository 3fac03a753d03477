"""localspec: local LLM chat with speculative decoding on llama.cpp.

Scripting API (heavy modules load on first use)::

    from localspec import load
    engine = load("smollm2-135m", drafter="ngram")
    for event in engine.generate("Write a haiku about caches."):
        print(event)
"""

__version__ = "0.1.0"


def load(model_id_or_path: str, **kwargs):
    """Load a catalog pair/model id or a GGUF path; see `localspec.loader.load`."""
    from localspec.loader import load as _load

    return _load(model_id_or_path, **kwargs)


__all__ = ["load", "__version__"]

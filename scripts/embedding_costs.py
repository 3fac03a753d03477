"""Embeddings as `localspec serve` computes them (engine/backend/embedding.py) against llama-cpp-python's
`Llama(embedding=True)` on the same file: seconds per text and the largest difference between the two
vectors, the two sides alternating which runs first.

    .venv/bin/python scripts/embedding_costs.py MODEL.gguf [--tokens 480] [--rounds 2]

A chat model is mean-pooled on both sides (Llama with pooling_type MEAN); an embedding model pools as its
file says. One process, one side at a time (llama.cpp's threads spin: never time two at once).
"""

from __future__ import annotations

import argparse
import time

import llama_cpp
import numpy as np

from localspec.engine.backend import Model, ModelOptions
from localspec.engine.backend.embedding import Embedder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=480, help="about this many tokens per text")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ours_model = Model(args.model, ModelOptions(n_ctx=256))
    ours = Embedder.borrowing(ours_model)
    unit = "def add(values):\n    total = 0\n    for value in values:\n        total += value\n    return total\n"
    text = unit * max(1, args.tokens // max(1, len(ours.tokens(unit))))
    tokens = ours.tokens(text)
    pooling = llama_cpp.LLAMA_POOLING_TYPE_MEAN if ours.causal else llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
    ref = llama_cpp.Llama(args.model, embedding=True, pooling_type=pooling, n_ctx=4096, n_batch=4096, n_ubatch=4096,
                          verbose=False)
    print(f"{len(tokens)} tokens, {'causal, pooled here in chunks of ' + str(ours.chunk) if ours.causal else 'encoder'}"
          f", {ours.pooling_name} pooling")
    for r in range(args.rounds):
        sides = ["localspec", "Llama"] if r % 2 == 0 else ["Llama", "localspec"]
        took, vectors = {}, {}
        for side in sides:
            t0 = time.perf_counter()
            vectors[side] = ours.embed(tokens) if side == "localspec" else np.array(ref.embed(text))
            took[side] = time.perf_counter() - t0
        diff = float(np.abs(vectors["localspec"] - vectors["Llama"]).max())
        print(f"round {r + 1} ({sides[0]} first): localspec {took['localspec']:.2f} s, Llama {took['Llama']:.2f} s, "
              f"ratio {took['Llama'] / took['localspec']:.2f}x, max |difference| {diff:.2e}")
    ref.close()
    ours_model.close()


if __name__ == "__main__":
    main()

"""How far llama.cpp's batched logits stray from its one-token logits for the same positions.

The engine decodes one position at a time when it does not draft, and verifies drafts in batches.
On CPUs these take different kernels (the repacked K-quant gemm from 4 rows, the tiled K-quant matmul
from 8), which sum in different orders, so the same position's logits differ between the two. At
temperature 0 a near tie can then flip. This script decodes answers one token at a time, evaluates
them again as batches of `--batch` positions (as a verify round does), and prints per batch size:
the largest logit difference, how many positions' argmax flipped, and the shortfall of the one-token
choice in the batched row (best logit minus that token's logit). The largest shortfall is what
`sampling.REPLAY_TOLERANCE` must exceed for a replayed greedy answer to be kept whole.

    .venv/bin/python scripts/batch_noise.py [catalog pair or GGUF path] [--tokens 64] [--batch 2,4,8,64]
        [--flash-attn on|off]

The prompts are those of scripts/plain_parity.py (not the bench's).
"""

from __future__ import annotations

import argparse

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)
import numpy as np

from localspec.engine import backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("entry", nargs="?", default=None, help="catalog pair or GGUF path (default: the default pair)")
    ap.add_argument("--tokens", type=int, default=64, help="answer tokens per prompt")
    ap.add_argument("--batch", default="2,3,4,8,16,64", help="batch sizes to compare with one position")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                    help="flash attention (auto: llama.cpp's choice, as localspec loads by default)")
    args = ap.parse_args()
    from localspec.catalog import load_catalog
    from localspec.engine.api import Engine
    from localspec.loader import resolve
    from plain_parity import PROMPTS

    target = resolve(args.entry or load_catalog().default_pair)[0]
    print(backend.system_info())
    flash = {"on": True, "off": False}.get(args.flash_attn)
    model = backend.Model(target, backend.ModelOptions(n_ctx=2048, flash_attn=flash))
    engine = Engine(model, None)  # for its chat template
    sizes = [int(b) for b in args.batch.split(",")]
    worst = {b: [0.0, 0, 0.0] for b in sizes}  # largest |difference|, flips, largest shortfall
    rows = 0
    for text in PROMPTS:
        prompt = engine.chat_tokens([{"role": "user", "content": text}])
        n = len(prompt)
        model.truncate(0)
        logits = model.decode(prompt, 0, [n - 1])[0]
        answer, single = [], []
        for i in range(args.tokens):
            answer.append(int(np.argmax(logits)))
            logits = model.decode([answer[-1]], n + i, [0])[0]
            single.append(logits)
        rows += len(answer) - 1
        for b in sizes:
            model.truncate(n)
            batched = np.concatenate([model.decode(answer[a:a + b], n + a, list(range(len(answer[a:a + b]))))
                                      for a in range(0, len(answer), b)])
            for i in range(len(answer) - 1):  # row i chose answer[i + 1] one token at a time
                row, chosen = batched[i], answer[i + 1]
                w = worst[b]
                w[0] = max(w[0], float(np.abs(row - single[i]).max()))
                w[1] += int(np.argmax(row)) != chosen
                w[2] = max(w[2], float(row.max() - row[chosen]))
    print(f"{target.name}: {len(PROMPTS)} prompts x {args.tokens} tokens decoded one at a time, then in batches")
    print("batch  max |logit diff|  argmax flips  max shortfall of the one-token choice")
    for b, (diff, flips, short) in worst.items():
        print(f"{b:5d} {diff:17.3f} {flips:7d}/{rows} {short:12.3f}")


if __name__ == "__main__":
    main()

"""Record what llama.cpp's own drafting from hidden states proposes, round by round, for the tests to
hold localspec's drafters to: `mtp` and `mtp-glm4moe`, random Qwen3.5 (hybrid) and GLM-4.5 (transformer) files with an MTP block, and
`mtp-step35`, a random Step-3.5 file with three heads, which llama.cpp chains (tests/test_mtp.py),
`mtp-gemma4`, a random Gemma 4 target with a random Gemma 4 assistant (tests/test_assistant.py),
`eagle3`, a random EAGLE-3 draft for the tests' SmolLM2 (tests/test_eagle3.py), and `dflash`, a random
DFlash draft for it (tests/test_dflash.py).

    python scripts/mtp_reference.py --llama-bin BUILD/bin/llama-speculative-simple \\
        --tokenizer SmolLM2-135M-Instruct.Q4_1.gguf [--kind mtp|eagle3|dflash] [--out FILE.json]

The binary is `llama-speculative-simple` built from the llama.cpp that llama-cpp-python 0.3.36 vendors
(its sdist: `cmake -S vendor/llama.cpp -B build -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF` then
`cmake --build build --target llama-speculative-simple`; ~20 minutes on 2 cores). It runs
`--spec-type draft-mtp`, `draft-eagle3` or `draft-dflash` (common/speculative.cpp) greedily with debug logs, which name
each draft's tokens (`draft candidate 0`, with its margin over the runner-up) and how many the target
kept.

The random file is written by scripts/random_gguf.py with the settings in FILES below; its sha256 is
recorded, so a test compares drafts on the very file the reference ran on. The tests also run the
binary live when LOCALSPEC_LLAMA_SPECULATIVE names it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
# mtp: small weights make the trunk often repeat its input token, which the head (its projection passing
# the token on) predicts: drafts kept whole, in part and not at all, all in one answer. eagle3: a draft
# for the tests' SmolLM2 (the `--tokenizer` file), which is the target. dflash: small weights leave the
# block's outputs near its mask token's embedding, so it drafts that token (SmolLM2's " yes"), which the
# target sometimes continues the prompt with: drafts kept whole, in part and not at all, but all alike.
# mtp-step35: its output layer tied to the embeddings, so the trunk repeats its input as Qwen3.5's does; the
# three heads' drafts are kept whole, in part and not at all, and differ from what the first head alone
# would chain in about half the rounds.
# dflash-varied: larger weights, so the block depends on the cache (the target's states): drafts that
# differ from round to round, none kept.
FILES = {"mtp": {"arch": "qwen35", "shape": "tiny", "seed": 0, "stdev": 0.06, "mtp": 1},
         "mtp-glm4moe": {"arch": "glm4moe", "shape": "tiny", "seed": 0, "stdev": 0.13, "mtp": 1},
         "mtp-step35": {"arch": "step35", "shape": "tiny", "seed": 0, "stdev": 0.1, "mtp": 3},
         "mtp-gemma4": {"arch": "gemma4-assistant", "shape": "tiny", "seed": 0, "stdev": 0.1, "mtp": 0,
                        "target": {"arch": "gemma4", "shape": "tiny", "seed": 0, "stdev": 0.1, "mtp": 0}},
         "eagle3": {"arch": "eagle3", "shape": "tiny", "seed": 0, "stdev": 0.1, "mtp": 0},
         "dflash": {"arch": "dflash", "shape": "tiny", "seed": 0, "stdev": 0.02, "mtp": 0, "mask": 9805},
         "dflash-varied": {"arch": "dflash", "shape": "tiny", "seed": 0, "stdev": 0.08, "mtp": 0, "mask": 9805}}
PROMPTS = {"mtp": "one two three four five six seven eight nine ten " * 3,
           "mtp-glm4moe": "one two three four five six seven eight nine ten " * 3,
           "mtp-step35": "one two three four five six seven eight nine ten " * 3,
           "mtp-gemma4": "one two three four five six seven eight nine ten " * 3,
           "eagle3": "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
           "dflash": "yes no yes yes no yes yes yes no yes yes yes yes no yes yes yes yes yes",
           "dflash-varied": "yes no yes yes no yes yes yes no yes yes yes yes no yes yes yes yes yes"}
N_MAX = 3       # llama.cpp's default draft length for MTP
N_PREDICT = 48
_CANDIDATE = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \(\s*([0-9.]+)\)")
_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def write_file(out: Path, tokenizer: Path, kind: str = "mtp", settings: dict | None = None) -> Path:
    """The kind's random file. A kind with a `target` of its own (mtp-gemma4) is a draft for that
    target: write the target first (`target_path`) and give it as `tokenizer`."""
    spec = importlib.util.spec_from_file_location("random_gguf", HERE / "random_gguf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    f = settings or FILES[kind]
    return module.write(f["arch"], out, tokenizer, shape=f["shape"], seed=f["seed"], stdev=f["stdev"], mtp=f["mtp"],
                        mask_token=f.get("mask", 0))


def target_path(draft: Path) -> Path:
    """Where the target of a kind with a random target of its own is written, beside its draft."""
    return draft.with_name(draft.stem + "-target.gguf")


def write_pair(out: Path, tokenizer: Path, kind: str) -> tuple[Path, Path]:
    """A kind with a random target of its own: (target, draft), the target carrying `tokenizer`'s."""
    target = write_file(target_path(out), tokenizer, kind, FILES[kind]["target"])
    return target, write_file(out, target, kind)


def cpu_kernels() -> str:
    """The CPU kernels llama.cpp runs here (its system info): a reference recorded with others may part
    at near ties of a random file's distributions, which amplify the last bits of the target's states
    (scripts/batch_noise.py shows the size of such differences)."""
    from localspec.engine.backend import system_info

    return system_info()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_reference(binary: Path, model: Path, n_predict: int = N_PREDICT, kind: str = "mtp",
                  draft: Path | None = None) -> dict:
    """llama.cpp's drafts (one list per draft call), how many of each the target verified and kept.
    `kind` eagle3 or dflash: `model` is the target and `draft` the draft's file."""
    spec_type = "draft-" + kind.split("-")[0]
    drafting = ["--spec-type", spec_type] + (["-md", str(draft)] if draft is not None else [])
    command = [str(binary), "-m", str(model), *drafting, "--spec-draft-n-max", str(N_MAX),
               "-p", PROMPTS[kind], "-n", str(n_predict), "--temp", "0", "-t", "2", "-c", "1024", "-lv", "5"]
    result = subprocess.run(command, capture_output=True, timeout=600)
    log = result.stdout.decode("utf-8", "replace") + result.stderr.decode("utf-8", "replace")
    if result.returncode != 0:
        raise SystemExit(f"{binary.name} failed ({result.returncode}):\n{log[-2000:]}")
    drafts: list[list[int]] = []
    margins: list[list[float]] = []  # per drafted token: how far its probability is above the runner-up's
    for line in log.splitlines():
        if m := _CANDIDATE.search(line):
            rank, pos, token, p = int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4))
            if rank == 0:
                if pos == 0:
                    drafts.append([])
                    margins.append([])
                drafts[-1].append(token)
                margins[-1].append(p)
            elif rank == 1 and margins[-1][-1] > 0:
                margins[-1][-1] = round((margins[-1][-1] - p) / margins[-1][-1], 3)
    kept = [(int(m.group(1)), int(m.group(2))) for m in _ACCEPTED.finditer(log)]
    if not drafts:
        raise SystemExit("no drafts found in the log: is this a build with draft-mtp?")
    # "verified": the draft's tokens the target evaluated (fewer than drafted where the answer's budget ends)
    return {"drafts": drafts, "accepted": [k for k, _n in kept], "verified": [n for _k, n in kept],
            "margins": margins}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-bin", type=Path, required=True, help="llama-speculative-simple")
    parser.add_argument("--tokenizer", type=Path, required=True, help="the tests' SmolLM2 GGUF")
    parser.add_argument("--kind", choices=sorted(FILES), default="mtp")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    out = args.out or HERE.parent / "tests" / "data" / f"{args.kind}_reference.json"
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / f"{args.kind}.gguf"
        if "target" in FILES[args.kind]:  # a draft for a random target of its own
            target, written = write_pair(out_file, args.tokenizer, args.kind)
            file = {**FILES[args.kind], "sha256": sha256(written),
                    "target": {**FILES[args.kind]["target"], "sha256": sha256(target)}}
            reference = run_reference(args.llama_bin, target, kind=args.kind, draft=written)
        else:
            written = write_file(out_file, args.tokenizer, args.kind)
            file = {**FILES[args.kind], "sha256": sha256(written)}
            if FILES[args.kind]["arch"] in ("eagle3", "dflash"):  # a draft for the tokenizer's model
                reference = run_reference(args.llama_bin, args.tokenizer, kind=args.kind, draft=written)
            else:
                reference = run_reference(args.llama_bin, written, kind=args.kind)
        record = {"file": file, "cpu": cpu_kernels(),
                  "prompt": PROMPTS[args.kind], "n_max": N_MAX, "n_predict": N_PREDICT, **reference}
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in record.items()]  # a draft per line
    for key in ("drafts", "margins"):
        lines[list(record).index(key)] = (f' "{key}": [\n' + ",\n".join(f"  {json.dumps(d)}" for d in record[key]) + "]")
    out.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    kept = sum(reference["accepted"])
    print(f"{out}: {len(reference['drafts'])} drafts, {kept} tokens kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())

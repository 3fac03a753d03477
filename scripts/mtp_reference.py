"""Record what llama.cpp's own MTP drafting proposes on a random Qwen3.5 file with an MTP block, round by
round, for tests/test_mtp.py to hold the `mtp` drafter to.

    python scripts/mtp_reference.py --llama-bin BUILD/bin/llama-speculative-simple \\
        --tokenizer SmolLM2-135M-Instruct.Q4_1.gguf [--out tests/data/mtp_reference.json]

The binary is `llama-speculative-simple` built from the llama.cpp that llama-cpp-python 0.3.36 vendors
(its sdist: `cmake -S vendor/llama.cpp -B build -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF` then
`cmake --build build --target llama-speculative-simple`; ~20 minutes on 2 cores). It runs
`--spec-type draft-mtp` (common/speculative.cpp, `common_speculative_impl_draft_mtp`) greedily with
debug logs, which name each draft's tokens (`draft candidate 0`) and how many the target kept.

The file is written by scripts/random_gguf.py with the settings in FILE below; its sha256 is recorded, so
a test compares drafts on the very file the reference ran on. tests/test_mtp.py also runs the binary
live when LOCALSPEC_LLAMA_SPECULATIVE names it.
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
# Small weights make the trunk often repeat its input token, which the head (its projection passing the
# token on) predicts: drafts kept whole, in part and not at all, all in one answer.
FILE = {"arch": "qwen35", "shape": "tiny", "seed": 0, "stdev": 0.06, "mtp": 1}
PROMPT = "one two three four five six seven eight nine ten " * 3
N_MAX = 3       # llama.cpp's default draft length for MTP
N_PREDICT = 48
_CANDIDATE = re.compile(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+)")
_ACCEPTED = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def write_file(out: Path, tokenizer: Path) -> Path:
    spec = importlib.util.spec_from_file_location("random_gguf", HERE / "random_gguf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.write(FILE["arch"], out, tokenizer, shape=FILE["shape"], seed=FILE["seed"], stdev=FILE["stdev"],
                        mtp=FILE["mtp"])


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_reference(binary: Path, model: Path, n_predict: int = N_PREDICT) -> dict:
    """llama.cpp's drafts (one list per draft call), how many of each the target verified and kept."""
    command = [str(binary), "-m", str(model), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(N_MAX),
               "-p", PROMPT, "-n", str(n_predict), "--temp", "0", "-t", "2", "-c", "1024", "-lv", "5"]
    result = subprocess.run(command, capture_output=True, timeout=600)
    log = result.stdout.decode("utf-8", "replace") + result.stderr.decode("utf-8", "replace")
    if result.returncode != 0:
        raise SystemExit(f"{binary.name} failed ({result.returncode}):\n{log[-2000:]}")
    drafts: list[list[int]] = []
    for line in log.splitlines():
        if m := _CANDIDATE.search(line):
            if int(m.group(1)) == 0:
                drafts.append([])
            drafts[-1].append(int(m.group(2)))
    kept = [(int(m.group(1)), int(m.group(2))) for m in _ACCEPTED.finditer(log)]
    if not drafts:
        raise SystemExit("no drafts found in the log: is this a build with draft-mtp?")
    # "verified": the draft's tokens the target evaluated (fewer than drafted where the answer's budget ends)
    return {"drafts": drafts, "accepted": [k for k, _n in kept], "verified": [n for _k, n in kept]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-bin", type=Path, required=True, help="llama-speculative-simple")
    parser.add_argument("--tokenizer", type=Path, required=True, help="the tests' SmolLM2 GGUF")
    parser.add_argument("--out", type=Path, default=HERE.parent / "tests" / "data" / "mtp_reference.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_file(Path(tmp) / "qwen35-mtp.gguf", args.tokenizer)
        reference = run_reference(args.llama_bin, model)
        record = {"file": {**FILE, "sha256": sha256(model)}, "prompt": PROMPT, "n_max": N_MAX,
                  "n_predict": N_PREDICT, **reference}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in record.items()]  # a draft per line
    lines[list(record).index("drafts")] = ' "drafts": [\n' + ",\n".join(f"  {json.dumps(d)}" for d in record["drafts"]) + "]"
    args.out.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    kept = sum(reference["accepted"])
    print(f"{args.out}: {len(reference['drafts'])} drafts, {kept} tokens kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())

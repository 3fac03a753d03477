#!/bin/bash
# Fill .gpu/ (git-ignored through .git/info/exclude) with what benchmarks/gpu/check.sh needs on a GPU
# machine that reaches no registry: llama-cpp-python's sdist without its model files, docs and web UI (the
# transfer is capped at 64 MiB), py3.12 wheels of the dependencies that image lacks, and vocab-only GGUFs
# (the tokenizers, not the weights) of the test model and of Qwen2.5.
#   bash benchmarks/gpu/prepare.sh SDIST_DIR   # SDIST_DIR: llama_cpp_python-0.3.36 unpacked (pip download … --no-binary :all:)
set -euo pipefail
src=$(cd "$1" && pwd); repo=$(pwd); mkdir -p .git/info .gpu/whl
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
V=llama_cpp_python-0.3.36/vendor/llama.cpp
(cd "$src/.." && tar czf "$repo/.gpu/llama_cpp_python-0.3.36-trim.tar.gz" --exclude=.git --exclude=$V/models \
  --exclude=$V/docs --exclude=$V/media --exclude=$V/benches --exclude=$V/.github --exclude=$V/tools/ui \
  --exclude=$V/tools/mtmd/test-3.mp4 --exclude=$V/examples --exclude=llama_cpp_python-0.3.36/examples llama_cpp_python-0.3.36)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/whl annotated-types diskcache fastapi \
  gguf platformdirs pydantic pydantic_core starlette textual typing-inspection uvicorn mdit-py-plugins \
  linkify-it-py uc-micro-py opentelemetry-api importlib-metadata
models=${LOCALSPEC_TEST_CACHE:-$HOME/.cache/localspec-tests}/home/data/models
.venv/bin/python -c "
import sys; sys.path.insert(0, 'tests')
from pathlib import Path
from ggufs import write_vocab_only
m = Path('$models')
write_vocab_only(m / 'SmolLM2-135M-Instruct.Q4_1.gguf', Path('.gpu/smollm2-vocab.gguf'))
write_vocab_only(m / 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf', Path('.gpu/qwen-vocab.gguf'))"
du -sh .gpu

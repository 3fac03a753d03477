#!/bin/bash
# One device call (docs/gpu.md, "Steady shapes"): the vendored llama.cpp built once with CUDA for both
# llama-server and the library llama-cpp-python loads (LLAMA_CPP_LIB_PATH), a random Qwen3.5-4B-shaped
# file with its MTP head, its verify costs steady and after a change, then plain, localspec `mtp` and
# llama-server `draft-mtp` for 1 and 4 requests at once. Budget: ~8 minutes on an H200 with 16 cores.
# Prepare .gpu/ with benchmarks/gpu/prepare.sh, then: device run `bash benchmarks/gpu/engines.sh`, carry .gpu
# A dry run on a CPU: DRY=1 bash benchmarks/gpu/engines.sh (a tiny file, the installed llama_cpp, LLAMA_SERVER).
REPO=$PWD
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
QUIET='^llama_\|^load\|^print_info\|^ggml\|^common\|^graph\|^sched\|^create_\|^init\|^\.\|^$'
if [ -n "$DRY" ]; then
  PY=${PY:-.venv/bin/python}; FILE=/tmp/q35-dry.gguf; LAYERS=0; REQUESTS="1 2"; TOKENS=32
  $PY tests/fixtures/random_gguf.py qwen35 $FILE --shape tiny --mtp 1 --tokenizer "${VOCAB:?a GGUF with the Qwen tokenizer}" > /dev/null
  export PATH=$REPO/.venv/bin:$PATH
else
  PY=python3; FILE=/tmp/q35.gguf; LAYERS=99; REQUESTS="1 4"; TOKENS=128
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$REPO PATH=/tmp/site/bin:$PATH
  (cd /tmp && tar xzf "$REPO/.gpu/llama_cpp_python-0.3.36-trim.tar.gz")
  python3 tests/fixtures/random_gguf.py qwen35 /tmp/q35-f16.gguf --shape qwen3.5-4b --mtp 1 --tokenizer .gpu/qwen-vocab.gguf > /tmp/gguf.log 2>&1 &
  GEN=$!
  # one CUDA build: libllama and its ggml libraries for the Python package, and llama-server beside them
  cmake -S /tmp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/lc -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_CUDA_FA=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF > /tmp/build.log 2>&1 &&
  timeout 330 cmake --build /tmp/lc --target llama llama-server -j "$(nproc)" >> /tmp/build.log 2>&1 ||
    { el build failed; tail -30 /tmp/build.log; exit 1; }
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-cache-dir \
    --target /tmp/site /tmp/llama_cpp_python-0.3.36 >> /tmp/build.log 2>&1 || { el package failed; tail -20 /tmp/build.log; exit 1; }
  export LLAMA_CPP_LIB_PATH=/tmp/lc/bin LLAMA_SERVER=/tmp/lc/bin/llama-server
  el build done
  wait $GEN || { cat /tmp/gguf.log; exit 1; }
  python3 -c "from localspec.engine.backend import quantize; quantize('/tmp/q35-f16.gguf', '$FILE', 'Q4_K_M')" > /dev/null 2>&1
  rm -f /tmp/q35-f16.gguf; el quantized
fi
export LOCALSPEC_HOME=/tmp/localspec-home  # (no calibration cached from another build)
timeout 90 $PY benchmarks/gpu/shape_costs.py $FILE --mtp 2>&1 | grep -v "$QUIET"
el costs
timeout $(( 470 - ($(date +%s) - T0) )) $PY benchmarks/gpu/engines.py $FILE --requests $REQUESTS --tokens $TOKENS \
  --trials 1 --gpu-layers $LAYERS 2>&1 | grep -v "$QUIET"
el end

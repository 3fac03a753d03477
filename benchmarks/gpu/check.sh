#!/bin/bash
# One device check (docs/gpu.md): a CUDA build of llama-cpp-python 0.3.36, then at Qwen3.5-4B's shape
# (random weights, Q4_K_M) one position decoded in a stream against right after a rollback (CUDA
# graphs on and off), the MTP and recurrent costs, and the hybrid/MTP tests. ~6 minutes on an H200 with 16 cores.
# Prepare .gpu/ with benchmarks/gpu/prepare.sh, then: device run `bash benchmarks/gpu/check.sh`, carry .gpu
REPO=$PWD
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$REPO:$REPO/benchmarks/gpu
(cd /tmp && tar xzf "$REPO/.gpu/llama_cpp_python-0.3.36-trim.tar.gz")
# the random file is written (numpy, one core) while the build runs
python3 tests/fixtures/random_gguf.py qwen35 /tmp/q35-f16.gguf --shape qwen3.5-4b --mtp 1 --tokenizer .gpu/qwen-vocab.gguf > /tmp/gguf.log 2>&1 &
GEN=$!
CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 330 python3 -m pip install --no-build-isolation --no-deps --no-cache-dir \
  --target /tmp/site /tmp/llama_cpp_python-0.3.36 > /tmp/build.log 2>&1 || { el build failed; tail -30 /tmp/build.log; exit 1; }
el build done
wait $GEN || { cat /tmp/gguf.log; exit 1; }
python3 -c "from localspec.engine.backend import quantize; quantize('/tmp/q35-f16.gguf', '/tmp/q35.gguf', 'Q4_K_M')" > /dev/null 2>&1
rm -f /tmp/q35-f16.gguf; el quantized
QUIET='^llama_\|^load\|^print_info\|^ggml\|^common\|^graph\|^sched\|^create_\|^init\|^\.\|^$'
timeout 60 python3 benchmarks/recurrent_costs.py /tmp/q35.gguf --after-rollback 2>&1 | grep -v "$QUIET"
GGML_CUDA_DISABLE_GRAPHS=1 timeout 60 python3 benchmarks/recurrent_costs.py /tmp/q35.gguf --after-rollback 2>&1 \
  | grep -v "$QUIET" | sed 's/^/CUDA graphs off: /'
timeout 75 python3 benchmarks/mtp_costs.py /tmp/q35.gguf --context 512 --rounds 1 --sizes 1 2 4 8 16 32 2>&1 | grep -v "$QUIET"
timeout 75 python3 benchmarks/recurrent_costs.py /tmp/q35.gguf --rounds 1 2>&1 | grep -v "$QUIET"
el costs
unset GGML_CUDA_DISABLE_GRAPHS
# llama_cpp before pytest: pytest's plugins load before conftest, and numpy first crashes a CUDA build
export GPU_SMOLLM2_VOCAB=$REPO/.gpu/smollm2-vocab.gguf LOCALSPEC_TEST_CACHE=/tmp/tc
timeout $(( 480 - ($(date +%s) - T0) )) python3 -c "import llama_cpp, sys, pytest; sys.exit(pytest.main(sys.argv[1:]))" \
  -p vocab_plugin -p no:cacheprovider tests/test_hybrid.py tests/test_mtp.py \
  --deselect tests/test_mtp.py::test_mtp_on_a_file_without_heads_is_a_clear_error -q -rs 2>&1 | tail -40
el end

#!/usr/bin/env bash
# Sets up .venv with localspec and its test tools. Safe to rerun: finished steps are skipped.
#
# llama-cpp-python ships as source only, so pip compiles llama.cpp (~11 minutes on 2 cores). We build
# its wheel once into a folder keyed by the build flags and install from there, so a rerun takes
# seconds and a wheel built with other flags is never picked up by mistake.
#
# The build flags, unless LOCALSPEC_CMAKE_ARGS gives them (printed with the reason at every run;
# `--print-flags` prints them and stops):
# - An NVIDIA GPU (`nvidia-smi -L` lists one) and the CUDA toolkit (`nvcc` on PATH or in
#   $CUDA_HOME/bin, default /usr/local/cuda): a CUDA build for the GPU's own architecture
#   (`nvidia-smi --query-gpu=compute_cap`), which compiles minutes faster than ggml's list of all.
#   A GPU without the toolkit: a CPU build, and a note saying what to install.
# - Apple Silicon: llama.cpp's default there, Metal.
# - Otherwise x86-64-v3 (AVX2/FMA/F16C) rather than -march=native: some virtual machines advertise
#   Intel AMX but fault when it is used, and a native build then crashes in its AMX kernels. AVX-512
#   (with VNNI, VBMI, BF16 where the CPU lists them) is added when this CPU has it: batched decoding
#   (every verify) runs llama.cpp's AVX-512 kernels at about half the time of its AVX2 ones
#   (docs/performance.md, "Build flags").
# A wheel is kept per flag set, so a machine without AVX-512 never picks up one built with it.
# -DGGML_RPC=ON adds llama.cpp's RPC backend: `--rpc` puts a target's layers on other machines running
# `localspec rpc-worker` (docs/rpc.md); it costs nothing when unused.
#
# --with-editor-tools: also make sure vim, tmux and curl are there (Debian's, with apt, only if missing and
# only as root): the real-editor test drives the llama.vim plugin in vim inside tmux, and skips without them.
set -euo pipefail
cd "$(dirname "$0")"

EDITOR_TOOLS=0
PRINT_FLAGS=0
for arg in "$@"; do
    case "$arg" in
        --with-editor-tools) EDITOR_TOOLS=1 ;;
        --print-flags) PRINT_FLAGS=1 ;;
        *) echo "usage: bash setup.sh [--with-editor-tools] [--print-flags]" >&2; exit 2 ;;
    esac
done

if [ "$EDITOR_TOOLS" = 1 ] && [ "$PRINT_FLAGS" = 0 ]; then
    missing=""
    for tool in vim tmux curl; do command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"; done
    if [ -n "$missing" ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "Installing$missing for the real-editor test..."
            { apt-get update -qq && apt-get install -y -qq vim-nox tmux curl; } >/dev/null 2>&1 \
                || echo "Could not install$missing; tests/test_editor_vim.py will be skipped."
        else
            echo "Missing$missing (not root or no apt-get); tests/test_editor_vim.py will be skipped."
        fi
    fi
fi

PYTHON="${PYTHON:-python3}"
LLAMA_VERSION="0.3.36"
CPU_FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
cpu_has() { for flag in "$@"; do case "$CPU_FLAGS" in *" $flag "*) ;; *) return 1 ;; esac; done; }

x86_flags() {
    local flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    if cpu_has avx512f avx512cd avx512vl avx512dq avx512bw; then  # what ggml's GGML_AVX512 compiles for
        flags="$flags -DGGML_AVX512=ON"
        if cpu_has avx512vbmi; then flags="$flags -DGGML_AVX512_VBMI=ON"; fi
        if cpu_has avx512_vnni; then flags="$flags -DGGML_AVX512_VNNI=ON"; fi
        if cpu_has avx512_bf16; then flags="$flags -DGGML_AVX512_BF16=ON"; fi
        WHY_CPU="this CPU has AVX-512"
    else
        WHY_CPU="AVX2 kernels (no AVX-512 on this CPU)"
    fi
    echo "$flags"
}

find_nvcc() {
    if command -v nvcc >/dev/null 2>&1; then command -v nvcc; return 0; fi
    local candidate="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
    if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
    return 1
}

# Sets CMAKE_ARGS_DEFAULT and WHY (one line for the user).
choose_flags() {
    local gpu nvcc caps
    gpu="$(nvidia-smi -L 2>/dev/null | grep -m1 '^GPU' || true)"
    if [ -n "$gpu" ]; then
        if nvcc="$(find_nvcc)"; then
            caps="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u | paste -sd ';' -)"
            export CUDACXX="$nvcc"
            CMAKE_ARGS_DEFAULT="-DGGML_CUDA=on${caps:+ -DCMAKE_CUDA_ARCHITECTURES=$caps} $(x86_flags)"
            WHY="CUDA build: ${gpu%% (UUID*} and the CUDA toolkit ($nvcc)${caps:+, for compute capability $caps}"
        else
            CMAKE_ARGS_DEFAULT="$(x86_flags)"
            WHY="CPU build, $WHY_CPU: an NVIDIA GPU is here (${gpu%% (UUID*}) but not the CUDA toolkit (no nvcc on PATH or in ${CUDA_HOME:-/usr/local/cuda}/bin). Install it (e.g. Debian/Ubuntu: apt install nvidia-cuda-toolkit, or NVIDIA's cuda-toolkit package) and run this again for a GPU build."
        fi
    elif [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then
        CMAKE_ARGS_DEFAULT="-DGGML_METAL=on"
        WHY="Metal build (Apple Silicon)"
    else
        CMAKE_ARGS_DEFAULT="$(x86_flags)"
        WHY="CPU build, $WHY_CPU (no NVIDIA GPU found by nvidia-smi)"
    fi
    CMAKE_ARGS_DEFAULT="$CMAKE_ARGS_DEFAULT -DGGML_RPC=ON"
}

WHY_CPU=""
x86_flags >/dev/null  # sets WHY_CPU (the calls inside $(...) run in a subshell)
choose_flags
if [ -n "${LOCALSPEC_CMAKE_ARGS:-}" ]; then
    WHY="LOCALSPEC_CMAKE_ARGS (the automatic choice would be: $WHY)"
fi
export CMAKE_ARGS="${LOCALSPEC_CMAKE_ARGS:-$CMAKE_ARGS_DEFAULT}"
if [ "$PRINT_FLAGS" = 1 ]; then
    printf 'flags: %s\nwhy: %s\n' "$CMAKE_ARGS" "$WHY"
    exit 0
fi
echo "llama.cpp build: $WHY"
if command -v sha256sum >/dev/null 2>&1; then hash=(sha256sum); else hash=(shasum -a 256); fi  # macOS: shasum
KEY="$(printf '%s %s' "$LLAMA_VERSION" "$CMAKE_ARGS" | "${hash[@]}" | cut -c1-16)"
WHEELS="${LOCALSPEC_WHEEL_CACHE:-$HOME/.cache/localspec-build}/$KEY"

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip

if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
    echo "Building llama-cpp-python $LLAMA_VERSION (CMAKE_ARGS=$CMAKE_ARGS); the first build takes ~11 minutes..."
    mkdir -p "$WHEELS"
    .venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps --no-cache-dir \
        "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
    "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
.venv/bin/python -m pip install -q --disable-pip-version-check --find-links "$WHEELS" -e '.[test]'
echo "localspec is installed in .venv (try: .venv/bin/localspec --help)"

#!/usr/bin/env bash
# Sets up .venv with localspec and its test tools. Safe to rerun: finished steps are skipped.
#
# llama-cpp-python ships as source only, so pip compiles llama.cpp (~11 minutes on 2 cores). We build
# its wheel once into a folder keyed by the build flags and install from there, so a rerun takes
# seconds and a wheel built with other flags is never picked up by mistake.
#
# Default flags target x86-64-v3 (AVX2/FMA/F16C) rather than -march=native: some virtual machines
# advertise Intel AMX but fault when it is used, and a native build then crashes in its AMX kernels.
# AVX-512 (with VNNI, VBMI, BF16 where the CPU lists them) is added when this CPU has it: batched
# decoding (every verify) runs llama.cpp's AVX-512 kernels at about half the time of its AVX2 ones,
# while one-token decoding, bound by memory, is unchanged (README, "GPU", on the build flags).
# A wheel is kept per flag set, so a machine without AVX-512 never picks up one built with it.
# -DGGML_RPC=ON adds llama.cpp's RPC backend: `--rpc` puts a target's layers on other machines running
# `localspec rpc-worker` (README, "RPC workers"); it costs nothing when unused.
# Set LOCALSPEC_CMAKE_ARGS to override, e.g. "-DGGML_CUDA=on -DGGML_RPC=ON" for NVIDIA GPUs (see README, "GPU").
#
# --with-editor-tools: also make sure vim, tmux and curl are there (Debian's, with apt, only if missing and
# only as root): the real-editor test drives the llama.vim plugin in vim inside tmux, and skips without them.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--with-editor-tools" ]; then
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
CMAKE_ARGS_DEFAULT="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
if cpu_has avx512f avx512cd avx512vl avx512dq avx512bw; then  # what ggml's GGML_AVX512 compiles for
    CMAKE_ARGS_DEFAULT="$CMAKE_ARGS_DEFAULT -DGGML_AVX512=ON"
    if cpu_has avx512vbmi; then CMAKE_ARGS_DEFAULT="$CMAKE_ARGS_DEFAULT -DGGML_AVX512_VBMI=ON"; fi
    if cpu_has avx512_vnni; then CMAKE_ARGS_DEFAULT="$CMAKE_ARGS_DEFAULT -DGGML_AVX512_VNNI=ON"; fi
    if cpu_has avx512_bf16; then CMAKE_ARGS_DEFAULT="$CMAKE_ARGS_DEFAULT -DGGML_AVX512_BF16=ON"; fi
fi
CMAKE_ARGS_DEFAULT="$CMAKE_ARGS_DEFAULT -DGGML_RPC=ON"
export CMAKE_ARGS="${LOCALSPEC_CMAKE_ARGS:-$CMAKE_ARGS_DEFAULT}"
KEY="$(printf '%s %s' "$LLAMA_VERSION" "$CMAKE_ARGS" | sha256sum | cut -c1-16)"
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

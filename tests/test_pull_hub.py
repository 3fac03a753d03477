"""The Hub path against a loopback server that speaks the Hub's protocol (HF_ENDPOINT)."""

import hashlib
import os
from pathlib import Path

import pytest

from hubserver import FakeHub
from localspec.catalog import build_catalog
from localspec.errors import ChecksumError, PullError
from localspec.pull import locate, pull_model
from localspec.registry import Registry

REPO = "acme/tiny-GGUF"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _catalog(files: dict[str, bytes], *, wrong_hash_for: str | None = None, pypi=None):
    entries = []
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        if name == wrong_hash_for:
            sha = "0" * 64
        entries.append({"name": name, "size": len(data), "sha256": sha})
    model = {"hub": {"repo": REPO, "revision": REVISION, "files": entries}}
    if pypi:
        model["pypi"] = pypi
    return build_catalog({"models": {"tiny": model}})


@pytest.fixture
def hub(monkeypatch):
    with FakeHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def test_full_download_lands_in_hf_cache_and_second_pull_is_instant(hub, tmp_path):
    data = os.urandom(300_000)
    hub.add(REPO, "tiny.gguf", data)
    model = _catalog({"tiny.gguf": data}).models["tiny"]
    record = pull_model(model, source="hub", say=lambda _m: None)
    path = locate(model)
    assert path is not None and path.read_bytes() == data
    assert str(path).startswith(str(tmp_path / "hf"))  # the standard HF cache (HF_HOME)
    assert record.source == "hub" and record.sha256 == hashlib.sha256(data).hexdigest()

    before = len(hub.requests)
    messages = []
    pull_model(model, source="hub", say=messages.append)
    assert len(hub.requests) == before, "an already verified file must not be fetched again"
    assert "already pulled and verified" in messages[0]


def test_interrupted_download_resumes_with_a_range_request(hub):
    # huggingface_hub writes in 10 MB chunks: cut after one has been written.
    data = os.urandom(24_000_000)
    hub.add(REPO, "tiny.gguf", data)
    hub.drop_first_get_after = 13_000_000
    model = _catalog({"tiny.gguf": data}).models["tiny"]
    pull_model(model, source="hub", say=lambda _m: None)
    assert locate(model).read_bytes() == data
    ranges = [r for method, _p, r in hub.requests if method == "GET" and r]
    assert ranges, "the second attempt should continue with a Range request"
    assert int(ranges[0].split("=")[1].rstrip("-")) > 0


def test_sha256_mismatch_deletes_the_file_and_names_the_source(hub):
    data = os.urandom(100_000)
    hub.add(REPO, "tiny.gguf", data)
    model = _catalog({"tiny.gguf": data}, wrong_hash_for="tiny.gguf").models["tiny"]
    with pytest.raises(ChecksumError) as err:
        pull_model(model, source="hub", say=lambda _m: None)
    assert hub.endpoint in str(err.value) and REPO in str(err.value)
    assert "deleted" in str(err.value)
    assert locate(model) is None
    blobs = list((Registry().file.parent.parent.parent / "hf").rglob("blobs/*"))
    assert all(b.stat().st_size != len(data) for b in blobs if b.is_file())


def test_split_parts_are_all_fetched_and_the_first_is_loaded(hub):
    parts = {f"tiny-0000{i}-of-00003.gguf": os.urandom(50_000 + i) for i in (1, 2, 3)}
    for name, data in parts.items():
        hub.add(REPO, name, data)
    model = _catalog(parts).models["tiny"]
    record = pull_model(model, source="hub", say=lambda _m: None)
    assert record.path.endswith("tiny-00001-of-00003.gguf")
    assert len(record.files) == 3
    assert record.size == sum(len(d) for d in parts.values())


def test_missing_file_on_the_hub_is_a_clear_error(hub):
    model = _catalog({"absent.gguf": b"x"}).models["tiny"]
    with pytest.raises(PullError, match="has no acme/tiny-GGUF/absent.gguf"):
        pull_model(model, source="hub", say=lambda _m: None)


def test_auto_without_a_mirror_reports_the_unreachable_hub(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    model = _catalog({"tiny.gguf": b"x"}).models["tiny"]
    with pytest.raises(PullError) as err:
        pull_model(model, source="auto", say=lambda _m: None)
    assert "127.0.0.1:9" in str(err.value)


@pytest.mark.parametrize("model_id", ["qwen3.5-0.8b-q4_k_m", "qwen3.5-4b-q4_k_m", "lfm2.5-1.2b-instruct-q4_k_m",
                                      "gemma-4-e4b-it-mmproj", "gemma-4-12b-it-assistant", "qwen3.8-27b-mmproj"])
def test_shipped_2026_entries_pull_from_their_pinned_revision(hub, model_id):
    """The catalog's hybrid targets go through the same Hub path: the pinned revision and file are
    asked for, and bytes other than the pinned ones are refused and deleted."""
    from localspec.catalog import load_catalog

    model = load_catalog().models[model_id]
    (file,) = model.hub.files
    hub.add(model.hub.repo, file.name, b"GGUF" + bytes(1000))
    with pytest.raises(ChecksumError) as err:
        pull_model(model, source="hub", say=lambda _m: None)
    assert f"expected {file.size}" in str(err.value) and "deleted" in str(err.value)
    asked = [path for method, path, _range in hub.requests if method == "GET" and "/resolve/" in path]
    assert asked == [f"/{model.hub.repo}/resolve/{model.hub.revision}/{file.name}"]
    assert locate(model) is None


def test_a_targets_image_projector_is_pulled_with_it_and_found_at_load(hub):
    """A catalog model that lists its projector (`mmproj: ID`) brings it along; the loader then finds it."""
    import yaml

    from localspec import paths
    from localspec.names import catalog_projector
    from localspec.pull import pull_entry

    weights, projector = b"GGUF target bytes", b"GGUF projector bytes"
    entry = lambda name, data: {"hub": {"repo": REPO, "revision": REVISION, "files": [
        {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]}}
    catalog = {"models": {"seeing": {**entry("seeing.gguf", weights), "mmproj": "seeing-mmproj"},
                          "seeing-mmproj": {**entry("mmproj.gguf", projector), "family": "clip"}}}
    paths.ensure(paths.config_dir())
    paths.user_catalog_file().write_text(yaml.safe_dump(catalog))
    hub.add(REPO, "seeing.gguf", weights)
    hub.add(REPO, "mmproj.gguf", projector)
    said: list[str] = []
    from localspec.catalog import load_catalog

    assert catalog_projector("seeing") is None  # (not pulled yet)
    records = pull_entry(load_catalog().models["seeing"], source="hub", say=said.append)
    assert [Path(r.path).read_bytes() for r in records] == [weights, projector]
    assert "[2/2] image projector: seeing-mmproj" in said
    assert catalog_projector("seeing") == Path(records[1].path)
    from localspec.inventory import plan_removal

    assert [m.id for m in plan_removal("seeing").models] == ["seeing", "seeing-mmproj"]  # (rm takes it along)

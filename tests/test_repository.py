"""The repository around the code stays true: the command reference equals the CLI's help, every result
file is cited and every cited file exists, one catalog, the package cites no history, and the benchmarks
share one helper module instead of reaching into each other."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
# What a reader is pointed at; docs/findings.md is the dated record and names files that are gone.
CURRENT_DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", BENCHMARKS / "README.md",
                *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "findings.md")]
CITED_PATH = re.compile(r"(?:assets|benchmarks|tests/fixtures|docs)/[\w./*-]*[\w*]")


def _cited() -> dict[str, list[str]]:
    """Every repository path a current document names, with the documents naming it."""
    cited: dict[str, list[str]] = {}
    for doc in CURRENT_DOCS:
        for path in CITED_PATH.findall(doc.read_text()):
            cited.setdefault(path, []).append(doc.name)
    return cited


def test_docs_cli_md_is_the_clis_own_help():
    from localspec.cli_reference import render

    assert (ROOT / "docs" / "cli.md").read_text() == render(), \
        "docs/cli.md differs from the CLI's help: python -m localspec.cli_reference > docs/cli.md"


def test_every_command_has_its_section_in_the_reference():
    from localspec.cli import cli

    text = (ROOT / "docs" / "cli.md").read_text()
    for name in cli.commands:
        assert f"## `localspec {name}`" in text


def test_every_result_and_picture_is_cited_by_a_current_document():
    cited = _cited()
    files = [p for folder in (ROOT / "assets", BENCHMARKS / "results") for p in sorted(folder.iterdir())]
    assert files
    unreferenced = [str(p.relative_to(ROOT)) for p in files if str(p.relative_to(ROOT)) not in cited]
    assert not unreferenced, f"cited by no document (cite or delete): {unreferenced}"


def test_every_path_a_current_document_cites_exists():
    missing = {path: docs for path, docs in _cited().items()
               if not ((ROOT / path).exists() if "*" not in path else list(ROOT.glob(path)))}
    assert not missing, f"cited but not in the tree: {missing}"


def test_the_cited_path_pattern_finds_what_it_must():
    """The two tests above rest on the pattern: a cited asset and a cited script are found, prose is not."""
    text = "see `assets/chat.svg` and benchmarks/serve_suite.py, (benchmarks/results/x-1.json; docs/*.md); assets are"
    assert CITED_PATH.findall(text) == ["assets/chat.svg", "benchmarks/serve_suite.py", "benchmarks/results/x-1.json",
                                        "docs/*.md"]


def test_one_catalog_the_top_level_file_shipped_in_the_package(tmp_path):
    """One models.yaml in the tree; a built package carries it (setup.py's build step, run here as a wheel
    build runs it), and a source checkout reads the top-level file itself."""
    import subprocess
    import sys

    from localspec.catalog import shipped_catalog_text

    tracked = subprocess.run(["git", "ls-files", "*models.yaml"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0:  # (a git checkout)
        assert tracked.stdout.split() == ["models.yaml"]
    assert shipped_catalog_text() == (ROOT / "models.yaml").read_text()
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=ROOT,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "localspec" / "models.yaml").read_text() == (ROOT / "models.yaml").read_text()
    assert (tmp_path / "localspec" / "tui" / "chat.tcss").is_file()


def test_the_package_cites_no_history_results_or_experiments():
    offenders = []
    for path in sorted((ROOT / "localspec").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"docs/history|docs/findings|assets/|scripts/", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_no_module_of_the_package_is_over_450_lines():
    """Short modules, one concern each (docs/architecture.md): a module that grows past this has a seam."""
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "localspec").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert long == {}


def test_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_share_common_and_reach_into_no_other_script(script):
    """A benchmark imports its siblings' public names only (one helper module, common.py, holds what they
    share) and never patches the import path: `python benchmarks/X.py` finds its siblings."""
    siblings = {p.stem for p in BENCHMARKS.glob("*.py")}
    tree = ast.parse(script.read_text())
    imported_siblings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in siblings:
            assert not [a.name for a in node.names if a.name.startswith("_")], ast.unparse(node)
        if isinstance(node, ast.Import):
            imported_siblings |= {a.asname or a.name for a in node.names if a.name in siblings}
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in imported_siblings:
                assert not node.attr.startswith("_"), ast.unparse(node)
            assert not (node.value.id == "sys" and node.attr == "path"), f"{script.name} patches sys.path"

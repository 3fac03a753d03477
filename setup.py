"""The build, as pyproject.toml configures it, plus one step: the catalog is the repository's top-level
models.yaml, and a built package carries a copy of it (`localspec.catalog.shipped_catalog_text`)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CATALOG = Path(__file__).resolve().parent / "models.yaml"


class BuildWithCatalog(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "localspec"
        self.mkpath(str(target))  # (an editable install builds into an empty folder)
        self.copy_file(str(CATALOG), str(target / "models.yaml"))


setup(cmdclass={"build_py": BuildWithCatalog})

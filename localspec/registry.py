"""A small JSON record of the files localspec pulled and verified.

A file whose size and modification time still match its record is known to be good, so pulling it
again is instant instead of re-hashing gigabytes.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from localspec import paths


@dataclass
class Record:
    model_id: str
    path: str          # the file llama.cpp loads (first part of a split)
    files: list[str]   # every file that belongs to the model
    size: int          # bytes of all files together
    sha256: str        # of the loaded file; for splits, of the first part
    source: str        # "hub", "pypi" or "local"
    verified_at: float
    stamps: dict[str, list[int]]  # file -> [size, mtime_ns] when verified

    def still_valid(self) -> bool:
        for name, (size, mtime_ns) in self.stamps.items():
            try:
                st = os.stat(name)
            except OSError:
                return False
            if st.st_size != size or st.st_mtime_ns != mtime_ns:
                return False
        return bool(self.stamps)


def stamp(files: list[Path]) -> dict[str, list[int]]:
    out = {}
    for f in files:
        st = os.stat(f)
        out[str(f)] = [st.st_size, st.st_mtime_ns]
    return out


class Registry:
    def __init__(self, file: Path | None = None):
        self.file = file or paths.registry_file()

    def _load(self) -> dict[str, dict]:
        try:
            return json.loads(self.file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            # A damaged registry only costs a re-verification, never the models themselves.
            return {}

    def _save(self, data: dict[str, dict]) -> None:
        paths.ensure(self.file.parent)
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.file)

    def ids(self) -> list[str]:
        return list(self._load())

    def get(self, model_id: str) -> Record | None:
        entry = self._load().get(model_id)
        if not entry:
            return None
        try:
            return Record(**entry)
        except TypeError:
            return None

    def valid(self, model_id: str) -> Record | None:
        record = self.get(model_id)
        return record if record and record.still_valid() else None

    def put(self, model_id: str, *, path: Path, files: list[Path], sha256: str, source: str) -> Record:
        record = Record(
            model_id=model_id,
            path=str(path),
            files=[str(f) for f in files],
            size=sum(os.path.getsize(f) for f in files),
            sha256=sha256,
            source=source,
            verified_at=time.time(),
            stamps=stamp(files),
        )
        data = self._load()
        data[model_id] = asdict(record)
        self._save(data)
        return record

    def drop(self, model_id: str) -> None:
        data = self._load()
        if data.pop(model_id, None) is not None:
            self._save(data)

    def all(self) -> dict[str, Record]:
        out = {}
        for key in self._load():
            record = self.get(key)
            if record:
                out[key] = record
        return out

"""Where localspec keeps its files.

Every location comes from platformdirs unless LOCALSPEC_HOME is set, which relocates all of them
below one folder (the tests point it at a temporary directory). Nothing is created at import time:
callers ask for a folder with `ensure()` when they are about to write into it.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "localspec"
HOME_ENV = "LOCALSPEC_HOME"


def _home() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME))


def cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME))


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME))


def runtime_dir() -> Path:
    home = _home()
    if home:
        return home / "run"
    # user_runtime_dir is /run/user/UID on Linux, which may not exist in containers.
    runtime = Path(platformdirs.user_runtime_dir(APP_NAME))
    return runtime if runtime.parent.exists() else cache_dir() / "run"


def models_dir() -> Path:
    """GGUF files that localspec assembled itself (PyPI mirror) or that the user placed here."""
    return data_dir() / "models"


def staging_dir() -> Path:
    """Downloads in progress; kept between runs so an interrupted pull resumes."""
    return cache_dir() / "staging"


def registry_file() -> Path:
    """What was pulled and verified, so a second pull of the same file is instant."""
    return data_dir() / "pulled.json"


def user_catalog_file() -> Path:
    return config_dir() / "models.yaml"


def settings_file() -> Path:
    return config_dir() / "settings.yaml"


def history_db() -> Path:
    return data_dir() / "history.sqlite3"


def images_dir() -> Path:
    """Images attached in the chat app, one file per content hash (conversations refer to them by it)."""
    return data_dir() / "images"


def server_socket() -> Path:
    """Where `localspec serve` listens by default, and `chat --connect` dials."""
    return runtime_dir() / "localspec.sock"


def calibration_file() -> Path:
    return cache_dir() / "calibration.json"


def history_dir() -> Path:
    """The "history" drafter's indexes of past requests, one per target file (engine/drafters/history.py)."""
    return cache_dir() / "history"


def history_index_file(model_path: Path) -> Path:
    return history_dir() / f"{Path(model_path).stem}.npz"


def every_place() -> list[tuple[str, Path]]:
    """(label, path) of every place localspec keeps files, for `localspec list --paths`."""
    return [("data", data_dir()), ("models", models_dir()), ("cache", cache_dir()), ("config", config_dir()),
            ("user catalog", user_catalog_file()), ("settings", settings_file()), ("runtime", runtime_dir())]


def ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path

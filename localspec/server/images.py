"""Images as the dialects send them: OpenAI's `image_url` parts (a data: URI; a local file:// or a remote
URL only where `serve` was told to take them), Ollama's `images` and llama.cpp's `multimodal_data` (base64
each). The server never fetches a URL a request names unless asked to at start: a browser page must not
be able to make it read the user's files or reach their network."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from localspec.engine.session import MAX_IMAGE_BYTES
from localspec.server.common import ApiError


@dataclass(frozen=True)
class ImageSources:
    """Where `image_url` may point besides data: URIs (`serve --allow-image-files/--allow-image-urls`)."""

    files: bool = False
    urls: bool = False


def from_base64(text: str, where: str) -> bytes:
    """An image sent as base64 (a data: URI's payload, Ollama's `images`, llama.cpp's `multimodal_data`)."""
    if not isinstance(text, str):
        raise ApiError(400, f"{where} must be a base64 string.")
    if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ApiError(400, f"{where} is larger than {MAX_IMAGE_BYTES >> 20} MB.")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{where} is not valid base64.") from None


def from_url(url: str, sources: ImageSources, where: str) -> bytes:
    """An `image_url`: a data: URI, or a file:// or http(s):// URL where `sources` allows it."""
    if not isinstance(url, str) or not url:
        raise ApiError(400, f"{where} needs a url.")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            raise ApiError(400, f"{where}: a data: URI must be base64 (data:image/png;base64,...).")
        return from_base64(payload, where)
    if scheme == "file":
        if not sources.files:
            raise ApiError(400, f"{where}: file:// images are refused; start serve with --allow-image-files "
                                "to read local files, or send the image as a data: URI.")
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
        try:
            if path.stat().st_size > MAX_IMAGE_BYTES:
                raise ApiError(400, f"{where}: {path} is larger than {MAX_IMAGE_BYTES >> 20} MB.")
            return path.read_bytes()
        except OSError as exc:
            raise ApiError(400, f"{where}: cannot read {path}: {exc.strerror}.") from None
    if scheme in ("http", "https"):
        if not sources.urls:
            raise ApiError(400, f"{where}: remote image URLs are refused (the server fetches nothing a request "
                                "names); start serve with --allow-image-urls, or send the image as a data: URI.")
        try:
            with urllib.request.urlopen(url, timeout=20) as answer:  # noqa: S310 (allowed at start)
                data = answer.read(MAX_IMAGE_BYTES + 1)
        except OSError as exc:
            raise ApiError(400, f"{where}: cannot fetch {url}: {exc}.") from None
        if len(data) > MAX_IMAGE_BYTES:
            raise ApiError(400, f"{where}: the image at {url} is larger than {MAX_IMAGE_BYTES >> 20} MB.")
        return data
    raise ApiError(400, f"{where}: unsupported image URL scheme {scheme or url[:20]!r}; send a data: URI.")

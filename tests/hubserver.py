"""A loopback HTTP server that speaks enough of the Hugging Face Hub protocol for hf_hub_download.

`HEAD|GET /{repo}/resolve/{revision}/{filename}` answers with ETag, X-Repo-Commit and Content-Length,
and honours `Range`. Knobs let a test cut a download short or serve wrong bytes.
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self):
        self.files: dict[tuple[str, str], bytes] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.drop_first_get_after: int | None = None  # bytes sent before cutting the first GET
        self._dropped = False
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _lookup(self):
                m = re.match(r"^/(.+?/.+?)/resolve/([^/]+)/(.+)$", self.path.split("?")[0])
                if not m:
                    return None
                repo, _revision, filename = m.groups()
                return hub.files.get((repo, filename))

            def _not_found(self):
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _headers(self, data: bytes, status: int, length: int, extra: dict | None = None):
                self.send_response(status)
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(length))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()

            def do_HEAD(self):
                hub.requests.append(("HEAD", self.path, None))
                data = self._lookup()
                if data is None:
                    return self._not_found()
                self._headers(data, 200, len(data))

            def do_GET(self):
                rng = self.headers.get("Range")
                hub.requests.append(("GET", self.path, rng))
                data = self._lookup()
                if data is None:
                    return self._not_found()
                start = 0
                if rng:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                    body = data[start:]
                    self._headers(data, 206, len(body), {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"})
                else:
                    body = data
                    self._headers(data, 200, len(body))
                if hub.drop_first_get_after is not None and not hub._dropped:
                    hub._dropped = True
                    self.wfile.write(body[: hub.drop_first_get_after])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo: str, filename: str, data: bytes) -> None:
        self.files[(repo, filename)] = data

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

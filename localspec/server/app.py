"""The FastAPI app: the dialects' routers over one scheduler, behind the local-only guards."""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from localspec import __version__
from localspec.errors import LocalspecError
from localspec.server import embeddings, llamacpp, native, ollama, openai
from localspec.server.common import ApiError, Served, compact
from localspec.server.common import api_error as common_api_error

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
OPEN_PATHS = {"/health", "/metrics"}
# Far above any editor's or chat client's request (a 32k-token context is ~130 KB of JSON), far below
# what would tie the server up tokenizing before the context check refuses it. settings.yaml's
# max_request_mb and `serve --max-request-mb` change it.
MAX_BODY_BYTES = 8 * 2**20


class Guard:
    """Refuses what `refusal` names before any route runs. A plain ASGI middleware, not
    @app.middleware("http"): Starlette's BaseHTTPMiddleware wraps the receive channel so that
    `request.is_disconnected()` never sees a client that left, and a non-streaming completion that an
    editor abandoned (llama.vim kills its curl as the user types on) would run to its end."""

    def __init__(self, app, refusal, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.refusal = refusal
        self.max_body = max_body

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            scope = _as_json(scope)
            request = Request(scope)
            response = self.refusal(request)
            if response is None:
                response, receive = await self._bounded(request, receive)
            if response is not None:
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _bounded(self, request: Request, receive):
        """A 413 for a body over the limit, decided before it is read: by its Content-Length, or, for a
        chunked body, by reading at most the limit (then handed on to the app as it arrived)."""
        too_big = _error(request, 413, f"The request body is larger than this server accepts "
                                       f"({self.max_body / 2**20:g} MB; serve --max-request-mb raises it).",
                         "invalid_request_error")
        length = request.headers.get("content-length")
        if length is not None:
            try:
                return (too_big if int(length) > self.max_body else None), receive
            except ValueError:
                return _error(request, 400, "Invalid Content-Length header.", "invalid_request_error"), receive
        if request.method in ("GET", "HEAD", "OPTIONS") or "chunked" not in request.headers.get("transfer-encoding", ""):
            return None, receive
        held, size = [], 0
        while True:
            message = await receive()
            held.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_body:
                return too_big, receive
            if not message.get("more_body", False):
                break

        async def replay():
            return held.pop(0) if held else await receive()

        return None, replay


def _as_json(scope):
    """Every body is read as JSON, whatever its Content-Type says, as llama-server and Ollama read them:
    their READMEs teach `curl URL -d '{...}'`, which curl sends as a form. (A browser page cannot use
    this to post without a preflight: the Guard refuses any Origin and Host that are not local.)"""
    headers = scope.get("headers") or []
    kind = next((value for name, value in headers if name == b"content-type"), b"")
    if scope.get("method") not in ("POST", "PUT", "PATCH") or b"json" in kind.lower():
        return scope
    kept = [(name, value) for name, value in headers if name != b"content-type"]
    return {**scope, "headers": [*kept, (b"content-type", b"application/json")]}


def create_server_app(served: Served, *, api_key: str | None = None, any_host: bool = False,
                      max_body: int = MAX_BODY_BYTES) -> FastAPI:
    """`any_host`: accept any Host header (only when bound beyond loopback, where the API key is required).
    `max_body`: bytes of request body accepted (413 beyond)."""
    app = FastAPI(title="localspec", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served = served

    def refusal(request: Request) -> Response | None:
        # DNS rebinding: a web page can point its own domain at 127.0.0.1, but it cannot fake the Host header.
        host = _hostname(request.headers.get("host", "localhost"))
        if not any_host and host not in LOCAL_HOSTS:
            return _error(request, 403, f"Host '{host}' is not local; localspec only answers localhost.",
                          "forbidden_error")
        origin = request.headers.get("origin")
        if origin and not any_host and not _local_origin(origin):
            return _error(request, 403, f"Cross-origin requests from {origin} are refused.", "forbidden_error")
        if api_key and request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                return _error(request, 401, "Missing or wrong API key (send Authorization: Bearer KEY).",
                              "authentication_error")
        return None

    app.add_middleware(Guard, refusal=refusal, max_body=max_body)

    async def api_error(request: Request, exc: Exception):  # a LocalspecError: structured.py's checks, say
        error = common_api_error(exc)
        return _error(request, error.status, error.message, error.kind)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(LocalspecError, api_error)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return _error(request, 400, _describe(exc), "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = "Not found: " + request.url.path if exc.status_code == 404 else str(exc.detail)
        return _error(request, exc.status_code, message,
                      "not_found_error" if exc.status_code == 404 else "invalid_request_error")

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception):
        return _error(request, 500, f"Internal error: {type(exc).__name__}: {exc}", "server_error")

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(served.scheduler.prometheus(served.name),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/")
    def root():
        return {"name": "localspec", "version": __version__, "model": served.name}

    for module in (llamacpp, openai, ollama, native, embeddings):
        app.include_router(module.router(served))
    return app


def _hostname(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _local_origin(origin: str) -> bool:
    parts = urlsplit(origin)
    if parts.scheme.startswith("vscode"):  # VS Code webviews
        return True
    return (parts.hostname or "") in LOCAL_HOSTS


def _describe(exc: RequestValidationError) -> str:
    problems = []
    for err in exc.errors()[:3]:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            return f"Malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}"
        if err.get("type") == "missing":
            problems.append(f"'{'.'.join(loc)}' is required")
        elif err.get("type") == "model_attributes_type" or not loc:
            problems.append(f"the body must be a JSON object ({err.get('msg')})")
        else:
            problems.append(f"'{'.'.join(loc)}': {err.get('msg')}")
    return "Invalid request: " + "; ".join(problems) + "."


def _error(request: Request, status: int, message: str, kind: str) -> Response:
    path = request.url.path
    body: dict[str, Any]
    if path.startswith("/v1/"):
        body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    elif path.startswith("/api/"):
        body = {"error": message}
    else:
        body = {"error": {"code": status, "message": message, "type": kind}}
    return Response(compact(body), status_code=status, media_type="application/json")

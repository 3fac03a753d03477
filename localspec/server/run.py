"""Starting the server: load the engine, bind TCP loopback and the Unix socket, run uvicorn on both."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from localspec import paths
from localspec.engine.api import Engine
from localspec.engine.contract import describe_drafters
from localspec.errors import LocalspecError
from localspec.names import is_path
from localspec.server.common import Served
from localspec.server.embeddings import embedding_model as load_embedding_model
from localspec.server.embeddings import target_embeddings
from localspec.server.scheduler import Scheduler

if TYPE_CHECKING:
    from localspec.hosted import HostedEngine

DEFAULT_PORT = 8012  # llama.vim's and llama.vscode's default endpoint: no editor configuration needed


def served_for(engine: Engine | HostedEngine, entry_id: str, temperature: float | None = None,
               interject: bool = True, join: bool = True) -> Served:
    """The engine under the names clients may use: the entry id, the target's id and file name, 'localspec'.
    `interject`: an editor's completions run beside a chat's answer, in its steps; `join`: a request
    arriving while another generates joins it when a slot is free (server/scheduler.py)."""
    assert engine.target.path is not None, "a served engine's target is a GGUF file"
    target_path = Path(engine.target.path)
    is_file = is_path(entry_id)
    name = target_path.stem if is_file else entry_id
    aliases = {name, "localspec", target_path.name, target_path.stem}
    family, quant, size = "", "", 0
    if not is_file:
        from localspec.catalog import PairSpec, load_catalog

        try:
            entry = load_catalog().resolve(entry_id)
        except LocalspecError:
            entry = None
        model = entry.target if isinstance(entry, PairSpec) else entry
        if model is not None:
            aliases.add(model.id)
            family, size = model.family, model.size or 0
    family = family or engine.target.meta("general.architecture") or ""
    quant = engine.target.meta("general.file_type") or ""
    if not size and target_path.exists():
        size = target_path.stat().st_size
    served = Served(engine=engine, scheduler=Scheduler(engine, interject, batch=join), name=name,
                    aliases=frozenset(aliases), size=size,
                    temperature=temperature,
                    family=family, quantization=str(quant), created=int(time.time()))
    own = target_embeddings(served)
    served.embeddings = [own] if own is not None else []
    return served


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LocalspecError(f"Cannot listen on {host}:{port}: {exc.strerror}. Is another server running there? "
                             "Choose another --port.") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def bind_unix(path: Path) -> socket.socket:
    paths.ensure(path.parent)
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # left behind by a server that did not exit cleanly
        else:
            raise LocalspecError(f"Another localspec server is listening on {path}; stop it or use --socket.")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600: no window in which other users could connect
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise LocalspecError(f"Cannot create the socket {path}: {exc.strerror}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def snippets(url: str, name: str, api_key: str | None) -> str:
    key_vim = f", 'api_key': '{api_key}'" if api_key else ""
    key_cont = f"\n    apiKey: {api_key}" if api_key else ""
    return f"""
llama.vim (~/.vimrc):
  let g:llama_config = {{ 'endpoint_fim': '{url}/infill', 'endpoint_inst': '{url}/v1/chat/completions'{key_vim} }}
llama.vscode (settings.json):
  "llama-vscode.endpoint": "{url}"
Continue (~/.continue/config.yaml):
  models:
  - name: localspec
    provider: openai
    model: {name}
    apiBase: {url}/v1{key_cont}
    roles: [chat, edit, autocomplete]
Any OpenAI client: base_url={url}/v1   ·   any Ollama client: {url}
"""


class Running:
    """A server started in a background thread (tests, scripts): `.url`, `.socket`, `.stop()`."""

    def __init__(self, server, thread: threading.Thread, url: str, socket_path: Path | None, served: Served):
        self.server, self.thread, self.url, self.socket, self.served = server, thread, url, socket_path, served

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        if self.socket is not None:
            self.socket.unlink(missing_ok=True)


def start_in_thread(served: Served, host: str = "127.0.0.1", port: int = 0, socket_path: Path | None = None,
                    api_key: str | None = None, **app_options) -> Running:
    import uvicorn

    from localspec.server.app import create_server_app

    sockets = [bind_tcp(host, port)]
    if socket_path is not None:
        sockets.append(bind_unix(socket_path))
    app = create_server_app(served, api_key=api_key, **app_options)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=3))
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    bound_port = sockets[0].getsockname()[1]
    return Running(server, thread, f"http://{host}:{bound_port}", socket_path, served)


def serve(entry_id: str, *, host: str, port: int, socket_path: Path | None, api_key: str | None,
          n_ctx: int, drafter: str, n_gpu_layers: int | None, say: Callable[[str], None], slots: int = 4,
          temperature: float | None = None, history: str = "saved", placement: dict | None = None,
          cache_reuse: int = 16, flash_attn: bool | None = None, max_body: int | None = None,
          interject: bool = True, join: bool = True, embedding_model: str | None = None,
          mmproj: str | None = None, images_from: tuple[bool, bool] = (False, False)) -> None:
    import uvicorn

    from localspec.loader import load
    from localspec.server.app import create_server_app

    remote = not is_loopback(host)
    if remote and not api_key:
        raise LocalspecError(f"Listening on {host} exposes the models to the network; that needs --api-key.")
    tcp = bind_tcp(host, port)
    unix = bind_unix(socket_path) if socket_path else None
    say(f"Loading {entry_id}…")
    engine = load(entry_id, drafter=drafter, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, draft_gpu_layers=n_gpu_layers,
                  slots=slots, history=history, cache_reuse=cache_reuse, flash_attn=flash_attn, mmproj=mmproj,
                  **(placement or {}))
    for warning in engine.warnings:
        say(f"warning: {warning}")
    served = served_for(engine, entry_id, temperature, interject, join)
    served.images_from_files, served.images_from_urls = images_from
    if embedding_model:
        say(f"Loading {embedding_model} for embeddings…")
        try:
            served.embeddings.insert(0, load_embedding_model(embedding_model, n_gpu_layers))
        except BaseException:
            served.scheduler.close()
            raise
    app = create_server_app(served, api_key=api_key, any_host=remote,
                            **({"max_body": max_body} if max_body is not None else {}))
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{tcp.getsockname()[1]}"
    say(f"localspec is serving {served.name} ({describe_drafters(engine.drafters)}, {len(engine.slot_tokens())} slots of "
        f"{engine.n_ctx} tokens of context)")
    if served.embeddings:
        say(f"  Embeddings   from {served.embeddings[0].name} (/v1/embeddings, /api/embed, /embedding)")
    if engine.projector is not None:
        sources = ["data: URIs", *(["file://"] if images_from[0] else []), *(["http(s) URLs"] if images_from[1] else [])]
        say(f"  Images       through {engine.projector.path.name} ({', '.join(sources)}; base64 on /api and /completion)")
    say(f"  TCP          {url}")
    if unix is not None:
        say(f"  Unix socket  {socket_path}  (curl --unix-socket {socket_path} http://localhost/health)")
    if remote:
        say(f"WARNING: listening on {host}, beyond this machine; every request needs the API key.")
    say(snippets(url if not remote else url, served.name, api_key))
    say("Ctrl+C stops the server.")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5))
    # uvicorn re-raises the signal that stopped it once it has shut down: make SIGTERM unwind like Ctrl+C,
    # so the models are freed and the socket file removed.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    try:
        server.run(sockets=[s for s in (tcp, unix) if s is not None])
    finally:
        served.scheduler.close()
        if socket_path is not None:
            socket_path.unlink(missing_ok=True)
        print("Stopped.", file=sys.stderr)

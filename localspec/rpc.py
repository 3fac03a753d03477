"""RPC workers: a target's layers on llama.cpp RPC servers (`localspec rpc-worker` on other machines),
the draft kept local.

llama.cpp's RPC protocol has no authentication: whoever reaches a worker can run computations on it and
read what it holds. So workers are accepted on loopback and private addresses only unless the user
says otherwise, and each is asked for its protocol version before llama.cpp connects to it: ggml's
RPC client ends the whole process when a worker cannot be reached or speaks another version, where a
user needs a message that names the worker.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path
from typing import Callable

from localspec.errors import EngineUnavailableError, LocalspecError

DEFAULT_PORT = 50052
PROTOCOL = (7, 0)   # RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION of the vendored ggml-rpc.h
_HELLO = 14         # RPC_CMD_HELLO
_CAPS = 24          # RPC_CONN_CAPS_SIZE
TRUSTED_ONLY = ("llama.cpp's RPC protocol has no authentication: anyone who can reach a worker can run "
                "computations on it and read the model it holds. Keep workers on a trusted network")


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); raises LocalspecError for anything else."""
    host, sep, port = endpoint.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LocalspecError(f"'{endpoint}' is not an RPC worker address; write HOST:PORT, e.g. 192.168.1.20:{DEFAULT_PORT}.")
    return host, int(port)


def _addresses(host: str) -> set:
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise LocalspecError(f"Cannot resolve the RPC worker host '{host}': {exc.strerror}.") from None
    return {ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}


def is_trusted(host: str) -> bool:
    """Loopback, private (RFC 1918, ULA) or link-local: every address the name resolves to."""
    return _trusted(_addresses(host))


def _trusted(addresses: set) -> bool:
    return bool(addresses) and all(a.is_loopback or a.is_private or a.is_link_local for a in addresses)


def parse_workers(spec: str | list[str] | None, allow_public: bool = False) -> list[str]:
    """The workers of --rpc (comma-separated HOST:PORT), each checked to be on a trusted network."""
    items = spec if isinstance(spec, list) else [s for s in (spec or "").split(",") if s.strip()]
    workers = []
    for item in items:
        host, port = split_endpoint(item)
        if not allow_public and not is_trusted(host):
            raise LocalspecError(f"The RPC worker {item} is not on a loopback or private address. {TRUSTED_ONLY}; "
                                 "pass --rpc-allow-public to use it anyway.")
        workers.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if len(set(workers)) != len(workers):
        raise LocalspecError("An RPC worker is named twice in --rpc.")
    return workers


def hello(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """The worker's RPC protocol version (major, minor, patch), asked the way llama.cpp asks it."""
    host, port = split_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            size = struct.unpack("<Q", _recv(sock, 8))[0]
            if size != 4 + _CAPS:
                raise LocalspecError(f"The RPC worker {endpoint} answered, but not in llama.cpp's RPC protocol "
                                     f"as this localspec speaks it (a {size}-byte greeting).")
            major, minor, patch = _recv(sock, size)[:3]
    except socket.timeout:
        raise EngineUnavailableError(f"The RPC worker {endpoint} did not answer within {timeout:g} s (is it serving "
                             "another client? a worker serves one at a time).") from None
    except ConnectionRefusedError:
        raise EngineUnavailableError(f"The RPC worker {endpoint} is not reachable: connection refused. Start it there "
                             f"with `localspec rpc-worker --host HOST --port {port}`.") from None
    except OSError as exc:
        raise EngineUnavailableError(f"The RPC worker {endpoint} is not reachable: {exc.strerror or exc}.") from None
    return major, minor, patch


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the worker closed the connection")
        data += chunk
    return data


def check_workers(workers: list[str], timeout: float = 5.0) -> None:
    """Every worker answers and speaks this build's protocol (llama.cpp accepts the same major version
    and a minor version no newer than its own)."""
    for endpoint in workers:
        major, minor, patch = hello(endpoint, timeout)
        if major != PROTOCOL[0] or minor > PROTOCOL[1]:
            raise LocalspecError(
                f"The RPC worker {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this localspec's llama.cpp "
                f"{PROTOCOL[0]}.{PROTOCOL[1]}: run the same localspec and llama-cpp-python version on every worker.")


def reachable(endpoint: str, timeout: float = 2.0) -> bool:
    try:
        hello(endpoint, timeout)
        return True
    except LocalspecError:
        return False


def check_bind_address(host: str, allow_public: bool) -> None:
    """Where `localspec rpc-worker` may listen: loopback or a private address unless told otherwise."""
    if allow_public:
        return
    # Every spelling of "any address" ("0", "0x0", "0.0.0.0", "::") resolves to an unspecified one, which
    # Python counts as private.
    addresses = _addresses(host)
    if any(a.is_unspecified for a in addresses) or not _trusted(addresses):
        raise LocalspecError(f"Listening on {host} may expose the worker beyond a trusted network. {TRUSTED_ONLY}. "
                             "Give this machine's private address with --host, or pass --allow-public.")


def placement_options(rpc: str | None, allow_public: bool, tensor_split: str | None) -> dict:
    """load()'s rpc and tensor_split from --rpc/--tensor-split, or from settings.yaml's rpc_workers."""
    from localspec.config import load_user_config

    workers = parse_workers(rpc if rpc is not None else load_user_config().rpc_workers, allow_public)
    if not workers:
        if tensor_split:
            raise LocalspecError("--tensor-split needs --rpc workers.")
        return {}
    try:
        split = tuple(float(x) for x in tensor_split.split(",")) if tensor_split else ()
    except ValueError:
        raise LocalspecError("--tensor-split must be numbers, e.g. 3,1.") from None
    if any(x < 0 for x in split) or (split and not sum(split)):
        raise LocalspecError("--tensor-split must be shares of zero or more, not all zero.")
    return {"rpc": workers, "tensor_split": split}


def require_rpc_backend() -> None:
    """Refuse clearly when llama-cpp-python was built without llama.cpp's RPC backend."""
    from localspec.engine import backend

    if not backend.supports_rpc():
        raise LocalspecError("This llama-cpp-python was built without llama.cpp's RPC backend; rebuild it with "
                             "`bash setup.sh` (its default flags include -DGGML_RPC=ON).")


def serve_worker(host: str, port: int, threads: int | None, cache: Path | None, allow_public: bool,
                 say: Callable[[str], None]) -> None:
    """`localspec rpc-worker`: llama.cpp's RPC server until Ctrl+C. Its loop is C and never returns,
    so it runs beside the main thread, which stays free for Ctrl+C."""
    import os
    import threading

    from localspec.engine import backend

    require_rpc_backend()
    check_bind_address(host, allow_public)
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    n = threads or os.cpu_count() or 1
    say(f"localspec rpc-worker on {endpoint}, {n} threads{f', cache {cache}' if cache else ''}. "
        "Trusted networks only: the RPC protocol has no authentication. Ctrl+C stops it.")
    worker = threading.Thread(target=backend.serve_rpc, args=(endpoint, n, cache), daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.5)
    except KeyboardInterrupt:
        say("Stopped.")
        return
    raise LocalspecError(f"The RPC worker could not listen on {endpoint} (in use, or not this machine's address).")

"""A target spread over llama.cpp RPC workers on loopback: `localspec rpc-worker` processes started by
the test, the SmolLM2 test model split across two of them, and the faults a user meets."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from localspec.errors import LocalspecError
from localspec.rpc import check_bind_address, check_workers, parse_workers


def _rpc_build() -> bool:
    from localspec.engine import backend

    return backend.supports_rpc()


needs_rpc = pytest.mark.skipif(not _rpc_build(), reason="this llama-cpp-python build has no RPC backend "
                                                         "(bash setup.sh builds it with -DGGML_RPC=ON)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


class Worker:
    def __init__(self):
        self.port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "localspec.cli", "rpc-worker", "--port", str(self.port),
                                      "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while True:
            try:
                check_workers([self.endpoint], timeout=2)
                return
            except LocalspecError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"rpc-worker did not start: {self.proc.stderr.read().decode()[-500:]}")
                time.sleep(0.2)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def two_workers():
    workers = [Worker(), Worker()]
    yield workers
    for w in workers:
        w.stop()


# ----------------------------------------------------------------------------- addresses (no build needed)


def test_workers_beyond_a_trusted_network_are_refused_unless_allowed():
    assert parse_workers("127.0.0.1:50052,10.0.0.7:50053") == ["127.0.0.1:50052", "10.0.0.7:50053"]
    assert parse_workers("192.168.1.20:1, [::1]:2") == ["192.168.1.20:1", "[::1]:2"]
    with pytest.raises(LocalspecError, match="not on a loopback or private address.*no authentication"):
        parse_workers("8.8.8.8:50052")
    assert parse_workers("8.8.8.8:50052", allow_public=True) == ["8.8.8.8:50052"]
    for bad in ("localhost", "host:port", "1.2.3.4:70000", ":50052"):
        with pytest.raises(LocalspecError, match="not an RPC worker address"):
            parse_workers(bad)
    with pytest.raises(LocalspecError, match="named twice"):
        parse_workers("127.0.0.1:1,127.0.0.1:1")
    check_bind_address("127.0.0.1", False)
    check_bind_address("192.168.1.20", False)
    for anywhere in ("0.0.0.0", "0", "0x0", "::"):  # every spelling of all interfaces
        with pytest.raises(LocalspecError, match="--allow-public"):
            check_bind_address(anywhere, False)


def test_a_worker_that_is_down_is_named():
    port = _free_port()
    with pytest.raises(LocalspecError, match=f"127.0.0.1:{port} is not reachable: connection refused"):
        check_workers([f"127.0.0.1:{port}"])


def test_a_worker_of_another_llama_cpp_version_is_named():
    """A worker answering llama.cpp's HELLO with another protocol version (as an older rpc-server would)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def answer():
        conn, _ = server.accept()
        with conn:
            conn.recv(1 + 8 + 24)
            conn.sendall((28).to_bytes(8, "little") + bytes([6, 1, 2, 0]) + bytes(24))

    threading.Thread(target=answer, daemon=True).start()
    with pytest.raises(LocalspecError, match=rf"127.0.0.1:{port} speaks RPC protocol 6.1.2.*same localspec"):
        check_workers([f"127.0.0.1:{port}"])
    server.close()


# ----------------------------------------------------------------------------- real workers


@needs_rpc
@pytest.mark.model
def test_the_target_split_over_two_workers_answers_as_the_local_run(smollm2_path, two_workers):
    from localspec.engine.sampling import SamplingSettings
    from localspec.engine.events import answer_tokens
    from localspec.loader import load

    prompt = [{"role": "user", "content": "Name three colours."}]
    greedy = SamplingSettings(temperature=0)
    with load(str(smollm2_path), n_ctx=512, calibrate=False, history="off") as local:
        expected = answer_tokens(local.chat(prompt, max_tokens=24, sampling=greedy, drafter="none"))
    before = [_rss_kib(w.proc.pid) for w in two_workers]
    with load(str(smollm2_path), n_ctx=512, calibrate=False, history="off",
              rpc=[w.endpoint for w in two_workers], tensor_split=(1.0, 1.0)) as spread:
        grown = [_rss_kib(w.proc.pid) - b for w, b in zip(two_workers, before)]
        assert all(g > 20_000 for g in grown), grown  # each worker holds part of the 98 MB of weights
        for drafter in ("none", "auto"):
            assert answer_tokens(spread.chat(prompt, max_tokens=24, sampling=greedy, drafter=drafter)) == expected


@needs_rpc
@pytest.mark.model
def test_requests_from_two_threads_join_the_steps_of_the_engine_in_its_process(smollm2_path, two_workers):
    """The engine in its child process serves as one in process: two readers at once are decoded in
    the same steps, each answered as it is alone; a third finds no slot; a reader that stops early
    frees its slot."""
    from localspec.engine.events import Round, Summary, answer_tokens
    from localspec.engine.sampling import SamplingSettings
    from localspec.loader import load

    greedy = SamplingSettings(temperature=0)
    asks = [[{"role": "user", "content": "Count from one to ten."}], [{"role": "user", "content": "Name three colours."}]]
    with load(str(smollm2_path), n_ctx=1024, calibrate=False, history="off", slots=2,
              rpc=[w.endpoint for w in two_workers]) as engine:
        assert engine.concurrent and engine.free_slots() == 2
        alone = [answer_tokens(engine.chat(ask, max_tokens=24, sampling=greedy, drafter="none")) for ask in asks]
        events: dict[int, list] = {}
        started = threading.Barrier(2)

        def read(i: int) -> None:
            stream = engine.chat(asks[i], max_tokens=24, sampling=greedy, drafter="none")
            started.wait()
            events[i] = list(stream)

        readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(120)
        assert [answer_tokens(events[i]) for i in range(2)] == alone
        assert all(isinstance(events[i][-1], Summary) for i in range(2))
        assert any(e.shared for i in range(2) for e in events[i] if isinstance(e, Round))  # in the same steps

        first, second = (engine.chat(ask, max_tokens=200, drafter="none") for ask in asks)
        next(first), next(second)
        with pytest.raises(LocalspecError, match="No KV slot is free"):
            next(engine.chat(asks[0], max_tokens=4))
        first.close()  # let go early: its slot is free for the next
        assert engine.free_slots() == 1
        third = list(engine.chat(asks[0], max_tokens=4, drafter="none"))
        assert third[-1].generated_tokens == 4
        second.close()
        assert engine.free_slots() == 2


@needs_rpc
@pytest.mark.model
def test_run_with_workers_and_with_one_down(smollm2_home, two_workers):
    env = {**os.environ, "LOCALSPEC_HOME": str(smollm2_home)}
    spread = ",".join(w.endpoint for w in two_workers)
    ok = subprocess.run([sys.executable, "-m", "localspec.cli", "run", "smollm2-135m", "Say hi.", "--max-tokens", "8",
                         "--rpc", spread], capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    two_workers[1].stop()
    down = subprocess.run([sys.executable, "-m", "localspec.cli", "run", "smollm2-135m", "Say hi.", "--max-tokens", "8",
                           "--rpc", spread], capture_output=True, text=True, env=env, timeout=300)
    assert down.returncode != 0 and "Traceback" not in down.stderr
    assert f"{two_workers[1].endpoint} is not reachable" in down.stderr


@needs_rpc
@pytest.mark.model
def test_a_worker_killed_mid_answer_is_named_and_the_engine_reloads_when_it_is_back(smollm2_path, two_workers):
    """The engine runs in a child process (ggml's RPC client ends its process when a worker dies): the
    answer so far arrives, the error names the worker, the next request says it is still down, and once
    it is back the next request loads the model again and answers."""
    from localspec.engine.events import Round
    from localspec.errors import EngineUnavailableError
    from localspec.hosted import HostedEngine
    from localspec.loader import load

    endpoints = [w.endpoint for w in two_workers]
    prompt = [{"role": "user", "content": "Count from one to two hundred in words."}]
    with load(str(smollm2_path), n_ctx=512, calibrate=False, history="off", rpc=endpoints) as engine:
        assert isinstance(engine, HostedEngine) and engine.n_ctx == 512 and "ngram" in engine.drafters
        rounds = []
        with pytest.raises(EngineUnavailableError) as failure:
            for event in engine.chat(prompt, max_tokens=400, drafter="none"):
                if isinstance(event, Round):
                    rounds.append(event)
                    if len(rounds) == 3:
                        two_workers[1].stop()
        assert len(rounds) >= 3  # what was streamed before the worker died stays delivered
        assert f"The RPC worker {endpoints[1]} stopped answering in the middle of an answer" in str(failure.value)
        assert "Remote RPC server crashed" in str(failure.value)  # ggml's last words, from the engine's log
        with pytest.raises(EngineUnavailableError, match=f"{endpoints[1]} is not reachable"):
            list(engine.chat(prompt, max_tokens=4))
        revived = subprocess.Popen([sys.executable, "-m", "localspec.cli", "rpc-worker", "--port",
                                    str(two_workers[1].port), "--threads", "1"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    check_workers([endpoints[1]], timeout=2)
                    break
                except LocalspecError:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            events = list(engine.chat(prompt, max_tokens=8, drafter="none"))
            assert events[-1].generated_tokens == 8
        finally:
            revived.kill()
            revived.wait()


@needs_rpc
@pytest.mark.model
def test_the_server_answers_503_while_a_worker_is_down_and_stays_up(smollm2_path, two_workers):
    import httpx

    from localspec.loader import load
    from localspec.server.run import served_for, start_in_thread

    engine = load(str(smollm2_path), n_ctx=512, calibrate=False, history="off", rpc=[w.endpoint for w in two_workers])
    running = start_in_thread(served_for(engine, str(smollm2_path)))
    body = {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}
    try:
        first = httpx.post(running.url + "/completion", json=body, timeout=120)
        assert first.status_code == 200 and first.json()["content"]
        two_workers[0].stop()
        down = httpx.post(running.url + "/completion", json=body, timeout=120)
        assert down.status_code == 503 and two_workers[0].endpoint in down.text
        assert httpx.get(running.url + "/health", timeout=10).status_code == 200
        again = httpx.post(running.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=120)
        assert again.status_code == 503 and "not reachable" in again.text
    finally:
        running.stop()
        running.served.scheduler.close()


@needs_rpc
@pytest.mark.model
def test_the_engine_process_starts_under_a_terminal_ui(smollm2_path, two_workers, monkeypatch):
    """Textual replaces sys.stderr with an object without a file descriptor, which multiprocessing would
    hand to its helper process ("bad value(s) in fds_to_keep", seen in `chat --rpc`)."""
    import io

    from localspec.loader import load

    class Capture(io.StringIO):  # as Textual's print capture: a file descriptor of -1
        def fileno(self) -> int:
            return -1

    monkeypatch.setattr(sys, "stderr", Capture())
    with load(str(smollm2_path), n_ctx=512, calibrate=False, history="off",
              rpc=[w.endpoint for w in two_workers]) as engine:
        events = list(engine.chat([{"role": "user", "content": "Hi"}], max_tokens=4, drafter="none"))
    assert events[-1].generated_tokens == 4

"""Speculative vs plain decoding with the target on two RPC workers behind a latency-injecting relay.

Starts two `localspec rpc-worker`s on loopback (every core each: with the layers split, one computes
while the other waits), and for every round trip asked for
puts a TCP relay in front of each that delays every chunk by half the round trip in each direction.
The target's layers are split over the two workers, the draft stays local; each prompt runs plain and
`--drafter auto`, in alternating order, and the same pair runs locally for comparison. The planner
calibrates verify costs through the workers (the network included), which is what it drafts by.

    python benchmarks/rpc_bench.py --rtt 0,1,5 --suite edit,code --prompts 4 --repeat 2 --json benchmarks/results/rpc-bench.json

On one machine the workers share its cores with the client: the figures say what the network's
round trips do to plain and speculative decoding, not what two real machines would reach.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relay(listen: int, target: str, rtt_ms: float) -> None:
    """Forward TCP to `target`, each chunk delivered half a round trip after it arrived, in order."""
    host, port = target.rsplit(":", 1)
    delay = rtt_ms / 2000.0

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    writer.close()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        while data := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + delay, data))
        queue.put_nowait((0.0, None))
        await sender

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        for w in (writer, up_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer), return_exceptions=True)

    async def main() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(endpoint: str) -> None:
    from localspec.errors import LocalspecError
    from localspec.rpc import check_workers

    deadline = time.monotonic() + 30
    while True:
        try:
            check_workers([endpoint], timeout=2)
            return
        except LocalspecError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def measure(engine, prompts, max_tokens: int, repeat: int = 1) -> list[dict]:
    """Each prompt plain and `--drafter auto`, `repeat` times, the order alternating from run to run;
    a prompt's figure is the mean over its runs (through the relay the same drafts measured up to 25%
    apart from one run to the next)."""
    from localspec.engine.sampling import SamplingSettings

    rows = [{"prompt": p.id, "none_runs": [], "auto_runs": []} for p in prompts]
    # One untimed answer first: the first graphs of each batch size travel to the workers once.
    list(engine.chat([{"role": "user", "content": prompts[0].text}], max_tokens=16, drafter="auto"))
    for rep in range(repeat):
        for n, (prompt, row) in enumerate(zip(prompts, rows)):
            messages = [{"role": "user", "content": prompt.text}]
            for variant in (("none", "auto") if (n + rep) % 2 == 0 else ("auto", "none")):
                summary = list(engine.chat(messages, max_tokens=max_tokens, sampling=SamplingSettings(temperature=0),
                                           drafter=variant))[-1]
                row[f"{variant}_runs"].append(summary.tokens_per_s)
                if variant == "auto":
                    row["drafted"], row["accepted"] = summary.drafted, summary.accepted
                    row["by_drafter"] = dict(summary.drafted_by_drafter)
            row["none"], row["auto"] = statistics.mean(row["none_runs"]), statistics.mean(row["auto_runs"])
            print(f"  {prompt.id:10} plain {row['none_runs'][-1]:6.1f}  auto {row['auto_runs'][-1]:6.1f} tok/s  "
                  f"{row['auto_runs'][-1] / row['none_runs'][-1]:.2f}x  {row['accepted']}/{row['drafted']} kept "
                  f"{row['by_drafter']}", file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    rel = sub.add_parser("relay")
    rel.add_argument("listen", type=int)
    rel.add_argument("target")
    rel.add_argument("rtt_ms", type=float)
    parser.add_argument("--entry", default="qwen2.5-coder-1.5b")
    parser.add_argument("--rtt", default="0,1,5", help="round trips in ms, comma-separated")
    parser.add_argument("--suite", default="edit,code")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--first", type=int, default=0, help="skip the first N prompts of each suite (held-out runs)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant per prompt (alternating order)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    if args.command == "relay":
        relay(args.listen, args.target, args.rtt_ms)
        return

    from localspec.bench import load_suites
    from localspec.loader import load

    prompts = [p for p in load_suites(args.suite.split(",")) if args.first <= p.index < args.first + args.prompts]
    results: dict = {"entry": args.entry, "max_tokens": args.max_tokens, "repeat": args.repeat, "runs": {}}
    workers = []
    for _ in range(2):
        port = _free_port()
        workers.append((_start(["-m", "localspec.cli", "rpc-worker", "--port", str(port)]),
                        f"127.0.0.1:{port}"))
    try:
        for _proc, endpoint in workers:
            _wait_for(endpoint)
        print("local:", file=sys.stderr)
        with load(args.entry, n_ctx=2048, history="off") as engine:
            results["runs"]["local"] = {"verify_ms": _costs(engine),
                                        "prompts": measure(engine, prompts, args.max_tokens, args.repeat)}
        for rtt in (float(x) for x in args.rtt.split(",")):
            relays, endpoints = [], []
            for _proc, endpoint in workers:
                if rtt > 0:
                    port = _free_port()
                    relays.append(_start([__file__, "relay", str(port), endpoint, str(rtt)]))
                    endpoints.append(f"127.0.0.1:{port}")
                else:
                    endpoints.append(endpoint)
            try:
                for endpoint in endpoints:
                    _wait_for(endpoint)
                print(f"two RPC workers, {rtt:g} ms round trip:", file=sys.stderr)
                with load(args.entry, n_ctx=2048, history="off", rpc=endpoints, tensor_split=(1.0, 1.0),
                          isolate=False) as engine:
                    rows = measure(engine, prompts, args.max_tokens, args.repeat)
                    results["runs"][f"rpc {rtt:g} ms"] = {"verify_ms": _costs(engine), "prompts": rows}
            finally:
                for r in relays:
                    r.kill()
    finally:
        for proc, _endpoint in workers:
            proc.kill()
    print(report(results, prompts))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


def _costs(engine) -> dict[int, float]:
    return {n: round(engine.cost.verify(n) * 1000, 1) for n in sorted(engine.cost.verify_s)}


def report(results: dict, prompts) -> str:
    suites = sorted({p.suite for p in prompts})
    lines = ["| placement | verify 1 / 8 / 16 positions | suite | plain tok/s | auto tok/s | auto / plain (min-max) |",
             "|---|---|---|---|---|---|"]
    for name, run in results["runs"].items():
        v = run["verify_ms"]
        for suite in suites:
            rows = [r for r in run["prompts"] if r["prompt"].startswith(suite)]
            ratios = [r["auto"] / r["none"] for r in rows]
            lines.append(f"| {name} | {v.get(1, 0):.0f} / {v.get(8, 0):.0f} / {v.get(16, 0):.0f} ms | {suite} | "
                         f"{statistics.median(r['none'] for r in rows):.1f} | {statistics.median(r['auto'] for r in rows):.1f} | "
                         f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""Record an editor's completion requests while a file is typed, and replay them against a server.

    record: the real llama.vim plugin in vim (in tmux) types a scripted session (two files, a save, a
            switch between them) against a server behind a recording proxy; every request is written
            with its arrival time and whether the editor abandoned it (JSON lines).
    replay: sends the recorded requests with their real gaps; a new completion request abandons the
            pending one, as llama.vim does (it stops the previous curl). Reports completion latency
            p50/p90 over the completions that finished, prompt tokens evaluated vs cached, completions
            that started from an empty cache, and completions that stopped on a limit mid-line.

    python benchmarks/fim_session.py record benchmarks/prompts/llama-vim-session.jsonl --upstream http://127.0.0.1:8012
    python benchmarks/fim_session.py replay benchmarks/prompts/llama-vim-session.jsonl --url http://127.0.0.1:8012 --label localspec
    python benchmarks/fim_session.py replay benchmarks/prompts/llama-vim-session.jsonl --chat 256   # while a chat streams
    python benchmarks/fim_session.py chat --tokens 256 --answers 3                 # the chat alone

The session is scripted (SESSION below), so it is the same for every server; the
recording keeps the requests the plugin really sent, with their real gaps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLUGIN = Path(__file__).resolve().parent.parent.parent / "shared" / "clients" / "llama.vim"

SHAPES = '''import math


class Shape:
    def area(self):
        raise NotImplementedError

    def perimeter(self):
        raise NotImplementedError


class Circle(Shape):
    def __init__(self, r):
        self.r = r

    def area(self):
        return math.pi * self.r ** 2

    def perimeter(self):
        return 2 * math.pi * self.r


class Rect(Shape):
    def __init__(self, w, h):
        self.w = w
        self.h = h

    def area(self):
        return self.w * self.h

    def perimeter(self):
        return 2 * (self.w + self.h)
'''
HELPERS = '''def total_area(shapes):
    return sum(s.area() for s in shapes)


def largest(shapes):
    return max(shapes, key=lambda s: s.area())
'''
# (file, the text to type, whether to save after it)
SESSION = [
    ("shapes.py", SHAPES[:SHAPES.index("class Rect")], True),
    ("helpers.py", HELPERS, True),
    ("shapes.py", SHAPES[SHAPES.index("class Rect"):], True),
]


# ----------------------------------------------------------------------------- recording


class Recorder:
    """An HTTP/1.1 proxy that logs each request: when it came, its body, how long the answer took, and
    whether the client went away first (llama.vim stops a pending completion when the user types on)."""

    def __init__(self, upstream: str, out: Path):
        host, port = upstream.split("//", 1)[-1].rstrip("/").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.out = out.open("w", encoding="utf-8")
        self.t0 = time.monotonic()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        arrived = time.monotonic()
        lines = head.decode("latin-1").split("\r\n")
        length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), 0)
        if any(line.lower().startswith("expect:") for line in lines):  # curl waits for this before a large body
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = await reader.readexactly(length) if length else b""
        # One request per connection upstream, so that the end of the answer is the end of the stream.
        kept = [line for line in lines if line and not line.lower().startswith(("connection:", "expect:"))]
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        up_writer.write(("\r\n".join([*kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body)
        await up_writer.drain()

        async def pump() -> None:
            while data := await up_reader.read(1 << 16):
                writer.write(data)
                await writer.drain()

        forward = asyncio.create_task(pump())
        client_gone = asyncio.create_task(reader.read(1))
        done, _ = await asyncio.wait({forward, client_gone}, return_when=asyncio.FIRST_COMPLETED)
        abandoned = forward not in done
        seconds = time.monotonic() - arrived
        for task in (forward, client_gone):
            task.cancel()
        up_writer.close()
        writer.close()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        entry = {"t": round(arrived - self.t0, 3), "method": lines[0].split()[0], "path": lines[0].split()[1],
                 "body": parsed, "seconds": round(seconds, 3), "abandoned": abandoned}
        self.out.write(json.dumps(entry) + "\n")
        self.out.flush()


def record(out: Path, upstream: str, seed: int) -> None:
    for tool in ("vim", "tmux"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is needed to record (setup.sh --with-editor-tools installs it)")
    recorder = Recorder(upstream, out)
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(recorder.handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    import threading

    threading.Thread(target=loop.run_forever, daemon=True).start()
    folder = Path(tempfile.mkdtemp(prefix="fimrec"))
    vimrc = folder / "vimrc"
    vimrc.write_text("set nocompatible noswapfile shortmess+=I autoindent\nfiletype off\n"
                     f"set runtimepath^={PLUGIN}\n"
                     f"let g:llama_config = {{'endpoint_fim': 'http://127.0.0.1:{port}/infill', 'show_info': 0}}\n")
    for name in {f for f, _t, _s in SESSION}:
        (folder / name).write_text("")
    tmux = ["tmux", "-L", f"fimrec-{port}"]
    subprocess.run([*tmux, "new-session", "-d", "-s", "vim", "-x", "120", "-y", "40", "-c", str(folder),
                    f"vim -N -u {vimrc} -i NONE -n {SESSION[0][0]}"], check=True)
    rng = random.Random(seed)

    def keys(*k: str) -> None:
        subprocess.run([*tmux, "send-keys", "-t", "vim", *k], check=True)

    try:
        time.sleep(2.0)
        keys("Enter")  # vim 9.0: the plugin's "needs 9.1" message
        time.sleep(0.5)
        current = SESSION[0][0]
        for name, text, save in SESSION:
            if name != current:
                keys(":e " + name, "Enter")
                current = name
                time.sleep(1.5)
            keys("G", "A")
            for line in text.splitlines(keepends=True):
                stripped = line.lstrip(" ") if line.strip() else line
                for ch in stripped.rstrip("\n"):
                    keys("-l", ch)
                    time.sleep(rng.uniform(0.06, 0.16))  # ~9 characters a second
                if line.endswith("\n"):
                    time.sleep(rng.uniform(0.3, 1.2))    # a look at the suggestion, then on
                    keys("Enter")
                    keys("C-u")                          # autoindent's indentation is typed by hand
            keys("Escape")
            if save:
                time.sleep(0.5)
                keys(":w", "Enter")
                time.sleep(2.5)
        time.sleep(3.0)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        loop.call_soon_threadsafe(loop.stop)
        recorder.out.close()
    entries = [json.loads(line) for line in out.read_text().splitlines()]
    fim = [e for e in entries if isinstance(e["body"], dict) and e["body"].get("n_predict", 1) > 0]
    print(f"recorded {len(entries)} requests ({len(fim)} completions, {len(entries) - len(fim)} warm-ups) "
          f"over {entries[-1]['t'] if entries else 0:.0f} s into {out}")


# ----------------------------------------------------------------------------- replay


# Chat questions streamed back to back beside the replay (`--chat`): none of them was tuned on.
CHAT_QUESTIONS = [
    "Explain how a hash map handles collisions, with a short Python example.",
    "Write a bash script that backs up a directory into a dated tar.gz and keeps the last five.",
    "What is the difference between a process and a thread? Answer in a few paragraphs.",
    "Write a Python function that parses an ISO 8601 date without libraries, with tests.",
    "Describe how TCP's congestion control reacts to packet loss.",
    "Write a small Rust program that counts word frequencies in a file.",
]


async def _chat(url: str, max_tokens: int, stop: asyncio.Event, answers: list[dict]) -> None:
    """Chat answers streamed back to back (OpenAI's /v1/chat/completions, greedy) until `stop` is set."""
    import httpx

    for i in range(10**6):
        if stop.is_set():
            return
        # A connection per answer: llama-server may close a kept-alive connection after a streamed
        # answer, and the next request on it then fails ("Server disconnected without sending a response").
        async with httpx.AsyncClient(timeout=600) as client:
            body = {"model": "localspec", "stream": True, "max_tokens": max_tokens, "temperature": 0,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)]}]}
            start, first, pieces, gaps, last, tokens = time.monotonic(), None, 0, [], None, None
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
                    if delta.get("content"):
                        now = time.monotonic()
                        first = first if first is not None else now - start
                        if last is not None:
                            gaps.append(now - last)
                        last = now
                        pieces += 1
                    if stop.is_set():
                        break
            done = not stop.is_set()
            usage_s = time.monotonic() - start
            answers.append({"question": i % len(CHAT_QUESTIONS), "seconds": usage_s, "first_s": first,
                            "tokens": tokens if tokens is not None else pieces, "pieces": pieces,
                            "longest_pause_s": max(gaps, default=0.0), "complete": done})


def chat_rate(answers: list[dict]) -> dict:
    """Answer tokens per second over the complete answers (first token's wait included), the longest pause."""
    complete = [a for a in answers if a["complete"] and a["seconds"] > 0]
    tokens, seconds = sum(a["tokens"] for a in complete), sum(a["seconds"] for a in complete)
    return {"chat_answers": len(complete), "chat_tokens_per_s": round(tokens / seconds, 2) if seconds else None,
            "chat_longest_pause_s": round(max((a["longest_pause_s"] for a in complete), default=0.0), 3)}


async def chat_alone(url: str, max_tokens: int, answers_wanted: int) -> list[dict]:
    answers: list[dict] = []
    stop = asyncio.Event()
    task = asyncio.create_task(_chat(url, max_tokens, stop, answers))
    while len(answers) < answers_wanted:
        if task.done():
            task.result()  # it failed: raise its error instead of waiting for answers that never come
        await asyncio.sleep(0.1)
    stop.set()
    await task
    return answers


async def replay_session(entries: list[dict], url: str, chat_tokens: int = 0, chat: list[dict] | None = None) -> list[dict]:
    import httpx

    results: list[dict] = []
    pending: dict[str, asyncio.Task] = {}
    stop_chat = asyncio.Event()
    chatting = asyncio.create_task(_chat(url, chat_tokens, stop_chat, chat if chat is not None else [])) \
        if chat_tokens else None
    t0 = time.monotonic()

    async def send(entry: dict) -> None:
        body = entry["body"]
        if isinstance(body, dict):  # every field back, for the report (the server's work is the same)
            body = {k: v for k, v in body.items() if k != "response_fields"}
        completion = isinstance(body, dict) and body.get("n_predict", 1) > 0
        start = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                response = await client.post(url + entry["path"], json=body)
            data = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
            results.append({"t": entry["t"], "completion": completion, "status": response.status_code,
                            "seconds": time.monotonic() - start, "abandoned": False, "response": data})
        except asyncio.CancelledError:
            results.append({"t": entry["t"], "completion": completion, "abandoned": True,
                            "seconds": time.monotonic() - start})
            raise

    tasks = []
    for entry in entries:
        if entry["method"] != "POST":
            continue
        delay = entry["t"] - (time.monotonic() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        body = entry["body"]
        completion = isinstance(body, dict) and body.get("n_predict", 1) > 0
        if completion and "fim" in pending and not pending["fim"].done():
            pending["fim"].cancel()  # llama.vim stops the previous completion's curl
        task = asyncio.create_task(send(entry))
        tasks.append(task)
        if completion:
            pending["fim"] = task
    await asyncio.gather(*tasks, return_exceptions=True)
    if chatting is not None:
        stop_chat.set()
        await chatting
    return results


def summarize(results: list[dict], label: str) -> dict:
    done = [r for r in results if r["completion"] and not r["abandoned"] and r.get("status") == 200]
    latency = sorted(r["seconds"] for r in done)
    prompt = [r["response"].get("tokens_evaluated", 0) for r in done]
    evaluated = [r["response"].get("timings", {}).get("prompt_n", 0) for r in done]
    cold = sum(1 for p, e in zip(prompt, evaluated) if p > 16 and p - e <= 5)  # (nearly) nothing reused
    # Stopped on a limit with the last line unfinished (text after the last newline). The token budget
    # (n_predict) may end anywhere in llama.cpp as well; the time limit must end at a line's end.
    limited = [r["response"] for r in done if r["response"].get("stop_type") == "limit"]
    budget = [x for x in limited if x.get("timings", {}).get("predicted_n", 0) >= x.get("n_predict", 128)]
    cut = sum(1 for x in limited if x not in budget and x.get("content", "").rsplit("\n", 1)[-1].strip())
    warm = [r for r in results if not r["completion"]]
    def pct(q: float) -> float:
        return latency[min(len(latency) - 1, int(q * len(latency)))] if latency else 0.0
    return {"label": label, "completions": len(done), "abandoned": sum(1 for r in results if r["completion"] and r["abandoned"]),
            "warm_ups": len(warm), "p50_s": round(statistics.median(latency), 3) if latency else None,
            "p90_s": round(pct(0.9), 3), "prompt_tokens": sum(prompt), "evaluated": sum(evaluated),
            "cold": cold, "cut_mid_line_by_time": cut, "stopped_by_budget": len(budget), "errors": sum(1 for r in results if r.get("status", 200) != 200)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--upstream", default="http://127.0.0.1:8012")
    rec.add_argument("--seed", type=int, default=7)
    rep = sub.add_parser("replay")
    rep.add_argument("session", type=Path)
    rep.add_argument("--url", default="http://127.0.0.1:8012")
    rep.add_argument("--label", default="server")
    rep.add_argument("--json", dest="json_path", type=Path, default=None)
    rep.add_argument("--chat", type=int, default=0, metavar="TOKENS",
                     help="meanwhile stream chat answers of this many tokens back to back (/v1/chat/completions)")
    alone = sub.add_parser("chat", help="chat answers alone (the solo rate --chat is compared with)")
    alone.add_argument("--url", default="http://127.0.0.1:8012")
    alone.add_argument("--tokens", type=int, default=256)
    alone.add_argument("--answers", type=int, default=3)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, args.upstream, args.seed)
        return
    if args.command == "chat":
        print(json.dumps(chat_rate(asyncio.run(chat_alone(args.url.rstrip("/"), args.tokens, args.answers)))))
        return
    entries = [json.loads(line) for line in args.session.read_text().splitlines() if line.strip()]
    chat: list[dict] = []
    results = asyncio.run(replay_session(entries, args.url.rstrip("/"), args.chat, chat))
    summary = summarize(results, args.label) | (chat_rate(chat) if args.chat else {})
    print(json.dumps(summary))
    if args.json_path:
        args.json_path.write_text(json.dumps({"summary": summary, "results": results, "chat": chat}, indent=1))


if __name__ == "__main__":
    main()

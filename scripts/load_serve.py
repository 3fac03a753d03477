"""Load a running `localspec serve` with N concurrent short FIM requests; report requests/s and latency.

    .venv/bin/localspec serve qwen2.5-coder-1.5b &      # then:
    .venv/bin/python scripts/load_serve.py --url http://127.0.0.1:8012 --clients 4 --requests 32

Not a test: a measurement. Each request is an /infill like llama.vim's, on one of a few files, with a
prefix that grows as if the user were typing (so the prompt cache is exercised as in an editor).
"""

import argparse
import statistics
import threading
import time

import httpx

FILES = [
    ("def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n", "\n\nprint(mean([1, 2, 3]))\n"),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n", "\n"),
    ("import json\n\ndef load(path):\n    with open(path) as f:\n", "\n\nconfig = load('c.json')\n"),
    ("fn main() {\n    let v = vec![1, 2, 3];\n    for x in &v {\n", "\n    }\n}\n"),
]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:8012")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=32, help="in total")
    p.add_argument("--n-predict", type=int, default=16)
    a = p.parse_args()

    latencies: list[float] = []
    failures: list[str] = []
    counter = iter(range(a.requests))
    lock = threading.Lock()

    def client(cid: int) -> None:
        with httpx.Client(base_url=a.url, timeout=120) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                prefix, suffix = FILES[(cid + i) % len(FILES)]
                body = {"input_prefix": prefix + "    " + "x" * (i % 5), "input_suffix": suffix, "input_extra": [],
                        "n_predict": a.n_predict, "temperature": 0, "stream": False,
                        "response_fields": ["content", "timings/predicted_n", "tokens_cached"]}
                t0 = time.perf_counter()
                r = http.post("/infill", json=body)
                dt = time.perf_counter() - t0
                with lock:
                    (latencies.append(dt) if r.status_code == 200 else failures.append(r.text[:200]))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    print(f"{len(lat)} ok, {len(failures)} failed, {a.clients} concurrent clients, {wall:.1f}s")
    if lat:
        q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]  # noqa: E731
        print(f"requests/s {len(lat) / wall:.2f}   latency p50 {q(0.5) * 1000:.0f} ms   p90 {q(0.9) * 1000:.0f} ms   "
              f"max {lat[-1] * 1000:.0f} ms   mean {statistics.mean(lat) * 1000:.0f} ms")
    for f in failures[:3]:
        print("failure:", f)


if __name__ == "__main__":
    main()

"""What a large grammar costs the engine's thread per token: an enum of n strings that share a prefix
(the worst case: every member stays live until its last characters), converted from a JSON schema as a
request's would be, compiled, then fed a member's tokens one by one (engine/constraint.py,
MAX_ALTERNATIVES), and a schema nested `depth` objects deep.

    .venv/bin/python scripts/grammar_costs.py MODEL.gguf [--sizes 1000,2000,3000,4096] [--depths 64,200]

Prints, for each size, the conversion, the compile, and the slowest token's accept; one process, one
size after another (nothing else should run meanwhile: llama.cpp's threads are not involved, but a
busy core moves these figures).
"""

from __future__ import annotations

import argparse
import time

import llama_cpp  # noqa: F401  (before numpy: see localspec/engine/__init__.py)

from llama_cpp.llama_grammar import SchemaConverter

from localspec.engine.backend import VocabFile


def converted(schema: dict) -> str:
    """As structured.schema_grammar converts a request's schema, without its size limit."""
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(schema, "request"), "")
    return converter.format_grammar()


def enum_cost(vocab, n: int) -> tuple[float, float, float]:
    schema = {"type": "object", "properties": {"x": {"enum": [f"value-{i}" for i in range(n)]}}, "required": ["x"]}
    t0 = time.perf_counter()
    grammar = converted(schema)
    t1 = time.perf_counter()
    state = vocab.grammar(grammar)
    t2 = time.perf_counter()
    slowest = 0.0
    for token in vocab.tokenize('{"x": "value-1', add_special=False):
        t = time.perf_counter()
        state.accept(token)
        slowest = max(slowest, time.perf_counter() - t)
    state.close()
    return t1 - t0, t2 - t1, slowest


def depth_cost(vocab, depth: int) -> float:
    schema: dict = {"type": "object", "properties": {}, "required": ["a"]}
    inner = schema
    for _ in range(depth):
        inner["properties"]["a"] = {"type": "object", "properties": {}, "required": ["a"]}
        inner = inner["properties"]["a"]
    state = vocab.grammar(converted(schema))
    slowest = 0.0
    for token in vocab.tokenize('{"a": ' * depth, add_special=False):
        t = time.perf_counter()
        state.accept(token)
        slowest = max(slowest, time.perf_counter() - t)
    state.close()
    return slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--sizes", default="1000,2000,3000,4096")
    parser.add_argument("--depths", default="64,200")
    args = parser.parse_args()
    with VocabFile(args.model) as file:
        vocab = file.vocab
        for n in [int(x) for x in args.sizes.split(",")]:
            convert, compile_, accept = enum_cost(vocab, n)
            print(f"enum of {n:>6}: convert {convert * 1000:7.1f} ms, compile {compile_ * 1000:6.1f} ms, "
                  f"slowest token {accept * 1000:7.1f} ms")
        for depth in [int(x) for x in args.depths.split(",")]:
            slowest = depth_cost(vocab, depth)
            print(f"{depth:>4} objects deep: slowest token {slowest * 1000:.2f} ms")


if __name__ == "__main__":
    main()

"""A replay corpus of hundreds of prompts, built at run time from the Python standard library installed here.

    .venv/bin/python benchmarks/stdlib_corpus.py ~/corpus                  # writes the prompt files
    .venv/bin/python benchmarks/replay_planner.py record qwen2.5-coder-1.5b ~/corpus/answers.json \
        --prompts ~/corpus/tune-edit.yaml,~/corpus/tune-rewrite.yaml,~/corpus/tune-explain.yaml,\
~/corpus/heldout-edit.yaml,~/corpus/heldout-rewrite.yaml,~/corpus/heldout-explain.yaml --max-tokens 128
    .venv/bin/python benchmarks/replay_planner.py replay ~/corpus/answers.json --report

Functions of 6 to 30 lines are taken from pure-Python modules of the standard library (parsed with `ast`,
never copied into this repository) and each gets one instruction: rename a name it uses, add type hints,
add a parameter, fix a bug planted in it (a comparison turned around), rewrite it for readability, or
explain it. The first four are edits (the answer copies most of the prompt), rewrites copy less and
explanations hardly at all. The choice is fixed by `--seed` and the Python version, so a corpus built
again on the same Python is the same corpus. A quarter of the functions, chosen by a hash of their
names, are held out (`heldout-*.yaml`): never tune a planner on them.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import random
import sys
import sysconfig
import textwrap
from pathlib import Path

import yaml

MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "cmd", "code", "colorsys", "configparser", "contextlib",
    "copy", "csv", "dataclasses", "difflib", "dis", "email/utils", "enum", "filecmp", "fileinput", "fnmatch",
    "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "html/parser",
    "http/cookies", "imaplib", "inspect", "ipaddress", "json/decoder", "json/encoder", "locale", "logging/__init__",
    "mailbox", "mimetypes", "netrc", "ntpath", "numbers", "operator", "optparse", "pathlib", "pickletools",
    "platform", "plistlib", "posixpath", "pprint", "pydoc", "queue", "quopri", "random", "reprlib", "sched",
    "selectors", "shlex", "shutil", "smtplib", "socketserver", "statistics", "string", "subprocess", "tarfile",
    "tempfile", "textwrap", "threading", "tokenize", "trace", "traceback", "urllib/parse", "urllib/request",
    "uuid", "wave", "weakref", "zipfile", "zipimport",
)
KINDS = {"rename": 40, "types": 40, "parameter": 40, "fix": 40, "rewrite": 40, "explain": 40}
GROUP = {"rename": "edit", "types": "edit", "parameter": "edit", "fix": "edit", "rewrite": "rewrite",
         "explain": "explain"}
NEW_NAME_SUFFIXES = ("value", "item", "current", "result", "entry")
TURNED = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
          ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}


def functions(stdlib: Path) -> list[tuple[str, str, str, ast.FunctionDef]]:
    """(module, qualified name, source, node) of every function of 6-30 lines, in file order."""
    found = []
    for module in MODULES:
        path = stdlib / (module + ".py")
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for parent in [tree, *[n for n in tree.body if isinstance(n, ast.ClassDef)]]:
            for node in parent.body:
                if not isinstance(node, ast.FunctionDef) or node.end_lineno is None:
                    continue
                lines = node.end_lineno - node.lineno + 1
                source = ast.get_source_segment(text, node, padded=True)
                if source is None or not 6 <= lines <= 30 or "\t" in source:
                    continue
                source = textwrap.dedent(source)
                if source[:1].isspace() or max(map(len, source.splitlines())) > 100:
                    continue  # (a string in it less indented than the function)
                owner = f"{parent.name}." if isinstance(parent, ast.ClassDef) else ""
                found.append((module.replace("/", "."), owner + node.name, source, node))
    return found


def rename_target(node: ast.FunctionDef) -> str | None:
    """A name the function uses at least twice (a parameter or a local), not self/cls."""
    counts: dict[str, int] = {}
    for n in ast.walk(node):
        name = n.arg if isinstance(n, ast.arg) else n.id if isinstance(n, ast.Name) else None
        if name and name not in ("self", "cls") and len(name) >= 2 and not name.isupper():
            counts[name] = counts.get(name, 0) + 1
    local = sorted(name for name, count in counts.items() if count >= 2 and name not in dir(__builtins__))
    return local[0] if local else None


def plant_bug(source: str) -> str | None:
    """The source with its first comparison turned around (`<` to `<=`, `==` to `!=`), or None."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare) and type(n.ops[0]) in TURNED:
            old, new = TURNED[type(n.ops[0])]
            row = n.left.end_lineno - 1
            line = lines[row]
            at = line.find(f" {old} ", n.left.end_col_offset)
            if at == -1 or n.comparators[0].lineno - 1 != row:
                continue
            lines[row] = line[:at] + f" {new} " + line[at + len(old) + 2:]
            return "".join(lines)
    return None


def instruction(kind: str, module: str, name: str, source: str, node: ast.FunctionDef,
                rng: random.Random) -> str | None:
    code = f"```python\n{source.rstrip()}\n```"
    if kind == "rename":
        old = rename_target(node)
        if old is None:
            return None
        new = f"{old}_{rng.choice(NEW_NAME_SUFFIXES)}"
        return f"Rename `{old}` to `{new}` in this function. Reply with the whole function.\n\n{code}"
    if kind == "types":
        return f"Add type hints to this function's parameters and return value. Reply with the whole function.\n\n{code}"
    if kind == "parameter":
        return ("Add a keyword parameter `verbose: bool = False` to this function; when it is true, the "
                f"function prints what it is doing. Reply with the whole function.\n\n{code}")
    if kind == "fix":
        broken = plant_bug(source)
        if broken is None:
            return None
        return (f"This function from `{module}` has a bug in one of its comparisons. Fix it. Reply with the "
                f"whole fixed function.\n\n```python\n{broken.rstrip()}\n```")
    if kind == "rewrite":
        return f"Rewrite this function to be easier to read, keeping what it does.\n\n{code}"
    return f"Explain what this function does, step by step.\n\n{code}"


def held_out(module: str, name: str) -> bool:
    return hashlib.sha256(f"{module}.{name}".encode()).digest()[0] < 64


def build(seed: int) -> dict[str, list[str]]:
    """Prompt files' contents by name (split-group), each function used once."""
    rng = random.Random(seed)
    pool = functions(Path(sysconfig.get_paths()["stdlib"]))
    rng.shuffle(pool)
    files: dict[str, list[str]] = {}
    wanted = dict(KINDS)
    for module, name, source, node in pool:
        open_kinds = [k for k, n in wanted.items() if n > 0]
        if not open_kinds:
            break
        for kind in rng.sample(open_kinds, len(open_kinds)):
            text = instruction(kind, module, name, source, node, rng)
            if text is not None:
                wanted[kind] -= 1
                split = "heldout" if held_out(module, name) else "tune"
                files.setdefault(f"{split}-{GROUP[kind]}", []).append(text)
                break
    if any(wanted.values()):
        raise SystemExit(f"the standard library here gave too few functions: still wanted {wanted}")
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder for the prompt files (outside the repository)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, prompts in sorted(build(args.seed).items()):
        (args.out / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "prompts": prompts}, width=1000,
                                                               allow_unicode=True, sort_keys=False))
        print(f"{args.out / name}.yaml: {len(prompts)} prompts", file=sys.stderr)
    print(f"Python {sys.version.split()[0]}, seed {args.seed}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""The package's layers (docs/architecture.md): every import points down, and the types hold.

    base (errors, paths) <- engine <- services (config, catalog, pull, …, loader) <- tui | server <- cli

tui and server are siblings: neither imports the other (`chat --connect` talks to a server over its
socket, not through its modules). Function-level imports count: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "localspec"

LAYERS: dict[str, int] = {
    "localspec.errors": 0, "localspec.paths": 0, "localspec.units": 0,
    "localspec.engine": 1,
    "localspec.config": 2, "localspec.catalog": 2, "localspec.registry": 2, "localspec.pull": 2,
    "localspec.history": 2, "localspec.selfdraft": 2, "localspec.bench": 2, "localspec.benchplot": 2,
    "localspec.loader": 2, "localspec.names": 2, "localspec.structured": 2, "localspec.call_stream": 2,
    "localspec.doctor": 2, "localspec.checks": 2,
    "localspec.inventory": 2, "localspec.rpc": 2, "localspec.hosted": 2, "localspec.hosted_child": 2,
    "localspec.tui": 3, "localspec.server": 3,
    "localspec.cli": 4, "localspec.cli_bench": 4, "localspec.cli_options": 4, "localspec.cli_reference": 4,
}
SIBLINGS = {("localspec.tui", "localspec.server"), ("localspec.server", "localspec.tui")}


def _group(module: str) -> str | None:
    """The LAYERS key a module belongs to (the longest matching prefix)."""
    best = None
    for key in LAYERS:
        if module == key or module.startswith(key + "."):
            if best is None or len(key) > len(best):
                best = key
    return best


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a localspec module, at any depth of the file."""
    out = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("localspec")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("localspec"):
            for alias in node.names:  # `from localspec import paths` imports the module localspec.paths
                candidate = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or \
                    (PACKAGE.parent / Path(*candidate.split("."))).is_dir()
                out.append((node.lineno, candidate if is_module else node.module))
    return out


def test_every_module_has_a_layer():
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        assert name == "localspec" or _group(name) is not None, f"{name} has no layer in tests/test_layers.py"


def test_no_import_points_up():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name == "localspec":
            continue  # the package's facade: `localspec.load` and the version
        mine = _group(name)
        for line, imported in _imports(path):
            theirs = _group(imported)
            if theirs is None:
                continue  # the facade (`from localspec import __version__`)
            if LAYERS[theirs] > LAYERS[mine] or (mine, theirs) in SIBLINGS:
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line} {name} imports {imported}")
    assert not problems, "imports that point up a layer:\n" + "\n".join(problems)


def test_the_check_itself_sees_an_upward_import(tmp_path):
    """The walker finds function-level imports (a check that could not fail would be worthless)."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from localspec.server.run import serve\n")
    assert (2, "localspec.server.run") in _imports(sample)


def test_pure_engine_modules_import_without_llama_cpp():
    code = (
        "import sys; sys.modules['llama_cpp'] = None\n"  # any `import llama_cpp` now raises ImportError
        "import localspec.engine.events, localspec.engine.contract, localspec.engine.sampling\n"
        "import localspec.engine.kv, localspec.engine.adaptive, localspec.engine.drafters\n"
        "import localspec.engine.speculative, localspec.engine.planner, localspec.engine.parallel\n"
        "import localspec.engine.core, localspec.engine.pairing, localspec.engine.api, localspec.engine.files\n"
        "import localspec.engine.constraint, localspec.engine.model\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_types_hold_across_the_package():
    """mypy on localspec/ (strict on the engine contract and events) and the tests' scripted engine,
    which must implement the contract the chat app relies on."""
    pytest.importorskip("mypy")
    root = PACKAGE.parent
    proc = subprocess.run([sys.executable, "-m", "mypy", "localspec", "tests/fakes.py", "tests/toy.py"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _module_graph(package: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (a name that is not a module counts as its package)."""
    names = {_module_name(path, package) for path in package.rglob("*.py")}

    def module_of(name: str) -> str:
        while name not in names and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        name = _module_name(path, package)
        graph[name] = {module_of(imported) for _, imported in _imports(path)} - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's strongly
    connected components). A package's own `__init__` importing its modules is not a cycle unless
    one of them imports the package back."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    """Two modules that need each other are one module in two files: neither can be read, tested or
    replaced alone (TYPE_CHECKING and function-level imports count)."""
    assert _cycles(_module_graph(PACKAGE)) == []


def test_the_engines_step_is_layered_round_planning_step_core():
    """Bottom up: a round (engine/speculative.py: verify, settle, trees) and a request's planning
    (engine/planner.py) know nothing of steps; the one step every lane takes (engine/parallel.py) knows
    no core; the core (engine/core.py) knows no front door (the Engine, the server, the app)."""
    graph = _module_graph(PACKAGE)
    engine = "localspec.engine."
    above = {"speculative": {"parallel", "core", "api"}, "planner": {"speculative", "parallel", "core", "api"},
             "parallel": {"core", "api"}, "core": {"api"}}
    for module, forbidden in above.items():
        reached = graph[engine + module] & {engine + name for name in forbidden}
        assert not reached, (module, reached)
    assert not any(name.startswith(("localspec.server", "localspec.tui")) for name in graph[engine + "core"])


def test_the_cycle_check_sees_a_cycle(tmp_path):
    package = tmp_path / "localspec"
    (package / "tui").mkdir(parents=True)
    (package / "tui" / "app.py").write_text("from localspec.tui.chat import ChatScreen\n")
    (package / "tui" / "chat.py").write_text("from typing import TYPE_CHECKING\n"
                                             "if TYPE_CHECKING:\n    from localspec.tui.app import ChatApp\n")
    (package / "tui" / "conversations.py").write_text("")
    graph = _module_graph(package)
    assert _cycles(graph) == [["localspec.tui.app", "localspec.tui.chat"]]


def test_the_engine_reads_models_through_their_protocol():
    """engine/model.py declares what the engine needs of a model and a vocabulary, pinned against
    llama.cpp's and the toy's under mypy; a `getattr`/`hasattr` probe would go around that check.
    Only the ctypes package (engine/backend/) may look names up on llama.cpp's bindings."""
    probes = []
    for path in sorted((PACKAGE / "engine").rglob("*.py")):
        if "backend" in path.relative_to(PACKAGE / "engine").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                probes.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.func.id}")
    assert not probes, "\n".join(probes)


def test_one_thread_calls_into_the_engine_core():
    """The core is reached only through `Engine` (engine/api.py), whose every call into it runs on the
    driver's thread (engine/driver.py): no other module of the package touches `.core`, and no other
    engine module starts a thread."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "core" and name not in (
                    "localspec.engine.api", "localspec.engine.core"):
                problems.append(f"{name}:{node.lineno} reaches the core past the engine")
            if (isinstance(node, ast.Attribute) and node.attr == "Thread" and name.startswith("localspec.engine")
                    and name != "localspec.engine.driver"):
                problems.append(f"{name}:{node.lineno} starts a thread of its own")
    assert not problems, "\n".join(problems)

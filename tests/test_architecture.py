"""The layout's rules, checked on the source: imports run one way (down the layers below, never back up), and no
import cycle (function-level imports included: a lazy import is still a dependency). Modules are split by concept,
not by a line count."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "sdarflow": ROOT / "src" / "sdarflow",
    "components": ROOT / "components",
    "pipelines": ROOT / "pipelines",
}

# Lowest first; a module may import its own layer or any layer below. The key is a module's first name under
# sdarflow (its subpackage, or the module itself), or the top-level package for components and pipelines.
LAYERS: list[set[str]] = [
    {
        "sdarflow",
        "defaults",
        "errors",
        "names",
        "progress",
        "stopping",
        "report",
        "schema",
        "config",
        "storage",
        "tracking",
        "intervals",
    },
    {"algo", "envs"},
    {"models"},
    {"rollout"},
    {"skills"},
    {"teacher", "train", "evaluate"},
    {"extensions"},
    {"registry"},
    {"stages"},
    {
        "sizes",
        "model_cache",
        "pipeline_config",
        "kfp_runtime",
        "cluster_check",
        "plan",
        "study",
        "provenance",
        "study_report",
        "run_report",
        "start_point",
        "rounds",
    },
    {"components"},
    {"pipelines"},
    {"demo", "cli"},
]
LAYER = {key: i for i, keys in enumerate(LAYERS) for key in keys}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _target(name: str) -> str | None:
    """The project module ``name`` is (or is inside), None for a third-party one."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out.update(t for n in names if (t := _target(n)) and t != module)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def layer_key(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "sdarflow" and len(parts) > 1 else parts[0]


def test_every_module_has_a_layer():
    assert sorted({layer_key(m) for m in MODULES} - LAYER.keys()) == []


def test_no_import_runs_up_a_layer():
    upward = sorted(
        f"{a} -> {b}" for a, bs in GRAPH.items() for b in bs if LAYER[layer_key(b)] > LAYER[layer_key(a)]
    )
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_ships():
    """A non-editable install (the images' ``pip install .``) gets only the packages pyproject lists: a new
    subpackage missing there would pass every test here and break the image."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert packages == listed

"""The package's layers: every module's imports (at any depth, inside functions too) point
down, never up; no module imports itself back through others (no cycle, the benchmarks
included); and no benchmark ships in the package.

Layers, bottom up: ``_ops``, ``types``, ``storage``, ``stats``, ``testing`` (fault points
the kernels and the example call) and ``elastic`` (a process-group helper of the example);
``kernels``; ``sharding``; ``checkpoint`` (differential checkpoints of sharded models);
``planner`` (``hardware`` and ``model`` below its TorchRec ``adapters`` and
``planner.planner``); ``commands`` and ``cli`` on top.
"""

from __future__ import annotations

import ast
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

import torchrec_mtrains

PKG = "torchrec_mtrains"
ROOT = Path(torchrec_mtrains.__path__[0])
BENCHMARKS = ROOT.parent / "benchmarks"
_IMPORT_FUNCTIONS = {"import_module", "__import__"}


@dataclass(frozen=True)
class Rule:
    """Modules under any of ``layers`` import nothing under ``forbidden`` (a module or a
    package prefix) and none of ``forbidden_exact`` by that very name."""

    layers: Tuple[str, ...]
    forbidden: Tuple[str, ...]
    forbidden_exact: Tuple[str, ...] = ()


def _p(*names: str) -> Tuple[str, ...]:
    return tuple(f"{PKG}.{n}" for n in names)


_ABOVE_SHARDING = ("checkpoint", "planner", "commands", "cli")
RULES = [
    Rule(_p("storage", "stats", "_ops", "types", "testing", "elastic"), _p("kernels", "sharding", *_ABOVE_SHARDING)),
    Rule(_p("kernels"), _p("sharding", *_ABOVE_SHARDING)),
    Rule(_p("sharding"), _p(*_ABOVE_SHARDING)),
    Rule(_p("checkpoint"), _p("planner", "commands", "cli")),
    # The planner package's __init__ loads the adapters: model and hardware name their modules.
    Rule(_p("planner.model", "planner.hardware"), _p("planner.adapters", "planner.planner", "commands", "cli"),
         _p("planner")),
    Rule(_p("planner"), _p("commands", "cli")),
]
# ``mtrains bench`` runs the benchmarks of a source checkout (found at run time); no other
# module may reach for them.
BENCHMARK_LOADERS = {f"{PKG}.commands.bench"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, is_package: bool, level: int, target: str) -> str:
    """The absolute name of ``from <level dots><target> import ...`` in ``module``."""
    if level == 0:
        return target
    base = module.split(".")
    base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join(base + ([target] if target else []))


def _dynamic_target(call: ast.Call) -> str:
    """The module (or, for an f-string, its constant prefix) of ``import_module(...)``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in _IMPORT_FUNCTIONS or not call.args:
        return ""
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip(".")
    return ""


def _imported(module: str, path: Path) -> Iterator[Tuple[str, Tuple[str, ...]]]:
    """(module named, names imported from it) for every import in ``module``, at any depth:
    ``import a.b`` gives ("a.b", ()), ``from a import b, c`` ("a", ("b", "c")), relative
    imports resolved, ``import_module("a.b")`` ("a.b", ())."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            yield _resolve(module, is_package, node.level, node.module or ""), tuple(a.name for a in node.names)
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node)):
            yield target, ()


def imports(module: str, path: Path) -> Set[str]:
    """Every module ``module`` imports: ``import a.b``, ``from a import b`` (as ``a`` and
    ``a.b``, ``b`` may be a submodule), relative imports, and ``import_module("a.b")``."""
    out: Set[str] = set()
    for base, names in _imported(module, path):
        out.add(base)
        out.update(f"{base}.{name}" for name in names if name != "*")
    return out


def _all_modules() -> Dict[str, Path]:
    """The package's modules and the benchmarks' (``benchmarks.lib.x``)."""
    return {**_modules(), **{_module_name(p): p for p in sorted(BENCHMARKS.rglob("*.py"))}}


def module_edges(module: str, path: Path, known: Set[str]) -> Set[str]:
    """The modules of ``known`` that ``module`` imports: ``from p import m`` is an edge to
    the module ``p.m`` where that is one (Python imports it by itself, even while ``p`` is
    still initialising), else to ``p``."""
    out: Set[str] = set()
    for base, names in _imported(module, path):
        submodules = {f"{base}.{name}" for name in names} & known
        out |= submodules
        if len(submodules) < len(names) or not names:
            out.add(base)
    return {m for m in out if m in known and m != module}


def import_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative): each is a set of modules that import one another in a cycle."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _under(name: str, prefixes: Tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(rule: Rule, graph: Dict[str, Set[str]]) -> Iterator[str]:
    for module, targets in sorted(graph.items()):
        if not _under(module, rule.layers):
            continue
        for target in sorted(targets):
            if _under(target, rule.forbidden) or target in rule.forbidden_exact:
                yield f"{module} imports {target}"


@pytest.fixture(scope="module")
def graph() -> Dict[str, Set[str]]:
    return {name: imports(name, path) for name, path in _modules().items()}


def test_the_scan_sees_imports_at_any_depth(graph: Dict[str, Set[str]]) -> None:
    # A module-level import, one inside a function, and a lazy import_module of the cli.
    assert f"{PKG}.storage.types" in graph[f"{PKG}.storage.block_store"]
    assert f"{PKG}.sharding" in graph[f"{PKG}.planner.planner"]  # inside StorageAwarePlanner.plan
    assert f"{PKG}.commands" in graph[f"{PKG}.cli"]
    assert len(graph) > 50


@pytest.mark.parametrize("rule", RULES, ids=lambda r: ",".join(n.removeprefix(PKG + ".") for n in r.layers))
def test_layers_import_only_downwards(rule: Rule, graph: Dict[str, Set[str]]) -> None:
    assert list(_violations(rule, graph)) == []


def test_no_import_cycles() -> None:
    modules = _all_modules()
    graph = {name: module_edges(name, path, set(modules)) for name, path in modules.items()}
    # The scan sees edges of every kind: to a package, to a submodule named in a from-import.
    assert {f"{PKG}.checkpoint.steps", f"{PKG}.checkpoint.row_io"} <= graph[f"{PKG}.checkpoint.chain"]
    assert f"{PKG}.storage" in graph[f"{PKG}.checkpoint.steps"]
    assert "benchmarks.lib.beyond_ram_report" in graph["benchmarks.lib.beyond_ram"]
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(import_cycles(graph)) == [["a", "b", "c"], ["e", "e2"]]


def test_nothing_in_the_library_imports_the_benchmarks(graph: Dict[str, Set[str]]) -> None:
    bad = [f"{m} imports {t}" for m, targets in sorted(graph.items()) if m not in BENCHMARK_LOADERS
           for t in sorted(targets) if _under(t, ("benchmarks",))]
    assert bad == []


def test_no_benchmark_ships_in_the_package() -> None:
    names: List[str] = [m.name for m in pkgutil.walk_packages(torchrec_mtrains.__path__, f"{PKG}.")]
    assert f"{PKG}.planner.hardware.fio" in names  # the walk reaches sub-packages
    parts = {part for name in names for part in name.split(".")}
    assert not {p for p in parts if p.startswith(("benchmark", "bench_")) or p == "baselines"}, sorted(parts)

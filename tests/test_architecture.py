"""Layers point one way (DESIGN.md invariant 18, docs: /work/shared/LAYOUT.md's picture).

Every module's imports are read with ``ast`` (module-level, function-local and relative ones
alike; ``if TYPE_CHECKING:`` imports count too: none is exempt), each module is put in its
part, and two things are checked: no part imports a part above it, and no two modules import
each other through any chain (no import cycle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("streamq", "schedulers")

# part -> the parts below it that it may import (itself is always allowed)
BELOW: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "producer": frozenset({"core"}),
    "ops": frozenset({"core"}),
    "worker": frozenset({"core", "producer", "ops"}),
    "dashboard": frozenset({"core", "ops"}),
    "spark": frozenset({"core", "producer"}),
    "api": frozenset({"core", "producer", "worker"}),  # streamq/__init__.py: the public names
    "schedulers": frozenset({"core", "producer", "worker", "api"}),
    "testing": frozenset({"core", "producer", "worker", "api"}),
    "face": frozenset({"core", "producer", "ops", "worker", "dashboard", "spark", "api",
                       "schedulers"}),
}

PARTS = {  # module name prefix -> part (the longest prefix that matches wins)
    "streamq": "api",
    "streamq._version": "core",
    "streamq._core": "core",
    "streamq._producer": "producer",
    "streamq._worker": "worker",
    "streamq._ops": "ops",
    "streamq.admin": "ops",  # the public admin API over the operations
    "streamq.dashboard": "dashboard",
    "streamq.spark": "spark",
    "streamq.testing": "testing",
    "streamq.cli": "face",
    "streamq.__main__": "face",
    "schedulers": "schedulers",
}


def modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__)."""
    found: dict[str, tuple[Path, bool]] = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            package = parts[-1] == "__init__"
            if package:
                parts.pop()
            found[".".join(parts)] = (path, package)
    return found


def part_of(module: str) -> str:
    best = max((p for p in PARTS if module == p or module.startswith(p + ".")), key=len)
    return PARTS[best]


def _targets(module: str, package: bool, node: ast.Import | ast.ImportFrom,
             known: dict[str, tuple[Path, bool]]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join([*base, *([node.module] if node.module else [])])
        else:
            origin = node.module or ""
        # `from pkg import mod` names the module; `from mod import name` names mod
        names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin
                 for a in node.names]
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            yield name


def imports() -> dict[str, dict[str, int]]:
    """Module -> {imported module of this project: first line it is imported on}."""
    known = modules()
    graph: dict[str, dict[str, int]] = {}
    for module, (path, package) in known.items():
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(module, package, node, known):
                    edges.setdefault(target, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_part() -> None:
    assert {part_of(m) for m in modules()} <= set(BELOW)
    assert "streamq._core.keys" in modules() and part_of("streamq._core.keys") == "core"


def test_no_part_imports_a_part_above_it() -> None:
    wrong = sorted(
        f"{module} ({part_of(module)}) imports {target} ({part_of(target)}), line {line}"
        for module, edges in imports().items() for target, line in edges.items()
        if part_of(target) != part_of(module) and part_of(target) not in BELOW[part_of(module)])
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    assert cycles(imports()) == []


def test_the_reader_sees_relative_local_and_package_imports() -> None:
    """The check is only as good as its reading of imports: the forms it must see."""
    known = {m: (Path(), m in ("p", "p.sub")) for m in ("p", "p.a", "p.b", "p.sub", "p.sub.c")}
    source = ("from .. import a\n"  # in package p.sub: the module p.a
              "def f() -> None:\n"
              "    from .c import name\n"  # a name of the module p.sub.c
              "if TYPE_CHECKING:\n"
              "    import p.b\n")
    seen = [t for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Import | ast.ImportFrom)
            for t in _targets("p.sub", True, node, known)]
    assert sorted(seen) == ["p.a", "p.b", "p.sub.c"]
    source = "from ..b import x\nfrom . import c\n"  # in module p.sub.c: p.b, itself
    assert [t for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)
            for t in _targets("p.sub.c", False, node, known)] == ["p.b"]
    assert "streamq._worker" in imports()["streamq"]  # `from ._worker import Worker`
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]]

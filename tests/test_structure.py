"""The package's shape: no import cycles, the registry is the one place that knows system
names, and modules and functions stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bagpipe_cli.engine.registry import ALL_SYSTEMS

PACKAGE = Path(__file__).resolve().parents[1] / "bagpipe_cli"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports when it is imported (module-level statements)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        targets = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def test_no_import_cycles():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(n):] + [m, n]))
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in modules:
        if m not in state:
            visit(m, [])


def _compares_a_system_name(node: ast.Compare, source: str) -> bool:
    sides = [node.left, *node.comparators]
    consts = []
    for s in sides:
        elts = s.elts if isinstance(s, ast.Tuple | ast.List | ast.Set) else [s]
        consts += [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    others = [ast.get_source_segment(source, s) or "" for s in sides]
    return any(c in ALL_SYSTEMS for c in consts) and any("system" in o for o in others)


def test_only_the_registry_compares_system_names():
    """Modules ask the registry what a system does instead of testing its name."""
    offenders = []
    for name, path in _modules().items():
        if name == "bagpipe_cli.engine.registry":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare) and _compares_a_system_name(node, source):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not offenders, offenders


def test_the_structure_check_finds_a_name_comparison():
    src = 'if cfg.system == "bagpipe" or s.system in ("sync", "local"): pass\nif x == "bagpipe": pass\n'
    hits = [n.lineno for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.Compare) and _compares_a_system_name(n, src)]
    assert hits == [1, 1]


def test_modules_and_functions_stay_small():
    too_long = []
    for path in _modules().values():
        source = path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{path.name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.name}:{node.lineno} {node.name}: {n} lines")
    assert not too_long, too_long

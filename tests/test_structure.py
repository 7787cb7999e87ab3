"""The package's shape: no import cycles, the registry and the policy table are the only
places that know system and cache-policy names, and modules and functions stay small
enough to read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bagpipe_cli.engine.registry import ALL_SYSTEMS
from bagpipe_cli.policies.table import policy_names

PACKAGE = Path(__file__).resolve().parents[1] / "bagpipe_cli"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's own statements, with those of its `if TYPE_CHECKING:` blocks: an import that
    only a type checker makes still ties the two modules together."""
    out = []
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out += _module_level(node.body)
        else:
            out.append(node)
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports at module level, type-only imports included."""
    found = set()
    for node in _module_level(ast.parse(path.read_text()).body):
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
    """Not even through `if TYPE_CHECKING:` imports: a module names the types of modules below
    it only (a shared type lives in its owner, below its users; or a `Protocol` says what is used)."""
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


NAMES = set(ALL_SYSTEMS) | set(policy_names())  # system and cache-policy names
# The modules whose job is to say what each system and policy is.
TABLES = {"bagpipe_cli.engine.registry", "bagpipe_cli.policies.table"}


def _compares_a_name(node: ast.Compare) -> bool:
    """A comparison (==, !=, in, not in, ...) with a system's or a cache policy's name."""
    for side in (node.left, *node.comparators):
        elts = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
        if any(isinstance(e, ast.Constant) and e.value in NAMES for e in elts):
            return True
    return False


def test_only_the_registry_and_the_policy_table_compare_names():
    """Modules ask the registry (systems) or the policy table (cache policies) what a system
    or a policy does instead of testing its name."""
    offenders = []
    for name, path in _modules().items():
        if name in TABLES:
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare) and _compares_a_name(node):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                                 f"{ast.get_source_segment(source, node)}")
    assert not offenders, offenders


def test_the_structure_check_finds_a_name_comparison():
    src = ('if cfg.system == "bagpipe" or s.system in ("sync", "local"): pass\n'
           'if policy == "lfu": pass\nif "belady" in pols: pass\nif p != "fae": pass\n'
           'if x == "bagpipes" or y in ("synced",): pass\n')
    hits = [n.lineno for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.Compare) and _compares_a_name(n)]
    assert sorted(hits) == [1, 1, 2, 3, 4]


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


def _blocks(text: str) -> list[str]:
    """A page's paragraphs and table rows, each one block of text."""
    blocks, para = [], []
    for ln in text.splitlines() + [""]:
        if ln.startswith("|") or not ln.strip():
            blocks.append(" ".join(para))
            para = []
            if ln.startswith("|"):
                blocks.append(ln)
        else:
            para.append(ln)
    return [b for b in blocks if b]


def test_the_architecture_page_maps_every_file():
    """docs/architecture.md names every module of the package: by its path, or by its name
    in the paragraph or table row of its folder. A system's module that the page does not
    name is mapped by the registry entry that names it (`bagpipe systems` lists the system);
    a model's module, by its `@register` (`--model` lists the model)."""
    from bagpipe_cli.engine.registry import SYSTEMS
    from bagpipe_cli.model_names import MODEL_MODULES

    named = {str(getattr(b, "target", b)).partition(":")[0] for s in SYSTEMS.values()
             for b in (s.plan, s.build_system, s.decisions, s.volumes)}
    named |= {f"bagpipe_cli.models.{m}" for m in MODEL_MODULES.values()}
    blocks = _blocks((PACKAGE.parent / "docs" / "architecture.md").read_text())
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        full = "/".join(rel.parts)
        folder = "/".join(rel.parts[:-1]) + "/" if len(rel.parts) > 1 else "the package root"
        if ".".join(("bagpipe_cli", *rel.with_suffix("").parts)) in named:
            continue
        if not any(f"`{full}`" in b or (f"`{rel.name}`" in b and folder in b) for b in blocks):
            missing.append(full)
    assert not missing, missing


def test_no_test_reads_data_from_outside_the_repository():
    """A fresh clone has no ../shared beside it: tests read the samples in tests/data."""
    for p in sorted(Path(__file__).parent.glob("*.py")):
        if p.name == Path(__file__).name:
            continue
        text = p.read_text()
        assert '"shared"' not in text and "../shared" not in text, p.name


def test_the_cycle_check_reads_type_only_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from bagpipe_cli.engine.setup import RunSetup\n")
    assert _imports("bagpipe_cli.engine.m", src, _modules()) == {"bagpipe_cli.engine.setup"}


def _classes(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}


def test_the_runtimes_name_a_role_alike():
    """A file of `engine/local/` and its namesake in `engine/distributed/` play one role: a
    class `Local<X>` of one has its `Distributed<X>` in the other, and every such pair of files
    but the runtimes' entries (functions) has one."""
    local, dist = PACKAGE / "engine" / "local", PACKAGE / "engine" / "distributed"
    shared = sorted({p.name for p in local.glob("*.py")} & {p.name for p in dist.glob("*.py")})
    assert {"collective.py", "planner.py", "server.py", "transport.py"} <= set(shared)
    for name in shared:
        a = {c.removeprefix("Local") for c in _classes(local / name) if c.startswith("Local")}
        b = {c.removeprefix("Distributed") for c in _classes(dist / name) if c.startswith("Distributed")}
        assert a == b, f"{name}: local/ has {sorted(a)}, distributed/ has {sorted(b)}"
        assert a or name in ("__init__.py", "runtime.py"), f"{name}: no role class"


def test_the_package_names_only_files_that_exist():
    """A path a module's text names (`engine/local/runtime.py`, `relay.py`) is a file: of the
    repository, the package, its engine, or the module's own folder."""
    root = PACKAGE.parent
    stale = []
    for path in _modules().values():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for ref in re.findall(r"([\w/.-]+\.py)\b", line):
                places = (root, PACKAGE, PACKAGE / "engine", path.parent)
                if not any((p / ref).is_file() for p in places):
                    stale.append(f"{path.relative_to(root)}:{i}: {ref}")
    assert not stale, stale

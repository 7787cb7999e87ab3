"""A system and a model added the way a contributor adds them, in a copy of the tree: the
system's module, its registry entry and its test (docs/architecture.md's "How to add a system"
example); the model's module (its "Adding a model" example). Nothing else is edited: the registry-driven tests, the bench-count
tests, `profile`, `systems`, a `systems: all` bench, `simulate` and `train` must all take them.

The copy holds the package, the tests, the bench files and the docs, and runs with the copy
first on PYTHONPATH (the installed package is this tree, in editable mode). Slow: it runs a
few test files again there (make test-all).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bagpipe_cli.launch import forkserver

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("bagpipe_cli", "tests", "benchmarks", "docs", "README.md", "setup.cfg", "pyproject.toml")

# Its own test: what is its own (the order it evicts in).
TEST = '''import numpy as np

from {module} import FifoDecisions
from bagpipe_cli.policies.trace import as_trace


def test_fifo_evicts_the_row_resident_longest():
    trace = as_trace([np.array([0, 1]), np.array([2]), np.array([1, 3]), np.array([0])])
    d = FifoDecisions(trace, 3)
    fetched = [d.step(b, np.sort(trace.batch(b))) for b in range(len(trace))]
    assert [x.fetch.tolist() for x in fetched] == [[0, 1], [2], [3], [0]]
    assert [x.before.tolist() for x in fetched] == [[], [], [0], [1]]
'''

# The tests that must take a new system and model without a line more (the registry-driven
# ones that run in make test, the bench counts, the structure checks), and the system's own.
INNER_TESTS = ("tests/test_registry.py", "tests/test_structure.py",
               "tests/test_startup.py", "tests/test_cli.py", "tests/test_bench_counts.py",
               "tests/test_baselines.py", "tests/test_run_checks.py", "tests/test_models.py",
               "tests/test_definitions.py")


def _section(title: str) -> str:
    return (ROOT / "docs" / "architecture.md").read_text().split(f"\n## {title}\n")[1].split("\n## ")[0]


def _model_example() -> tuple[str, str, str]:
    """docs/architecture.md's "Adding a model": (its path, its code, its name)."""
    section = _section("Adding a model")
    path = re.search(r"`(bagpipe_cli/models/\w+\.py)`:", section).group(1)
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    return path, code, re.search(r'^@register\("(\w+)"\)', code, re.MULTILINE).group(1)


def _system_example() -> tuple[str, str, str, str]:
    """docs/architecture.md's "How to add a system" example: (its module's path, the module,
    its registry entry, its name)."""
    section = _section("How to add a system")
    path = re.search(r"`(bagpipe_cli/engine/systems/\w+\.py)`:", section).group(1)
    module, entry = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[:2]
    return path, module, entry, re.search(r'SystemSpec\("([\w-]+)"', entry).group(1)


@pytest.mark.slow
@pytest.mark.extended
def test_a_contributor_adds_a_system_and_a_model_and_edits_nothing_else(tmp_path, tiny_dataset):
    tree = tmp_path / "tree"
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, tree / name)
    before = {p.relative_to(tree): p.read_bytes() for p in tree.rglob("*") if p.is_file()}

    # The contributor's three files for the system (the docs' module and entry, at the end
    # of the registry's table, and a test), and one for the model.
    module_path, module, entry, system = _system_example()
    registry = tree / "bagpipe_cli" / "engine" / "registry.py"
    text = registry.read_text()
    at = text.index("\n)\nSYSTEMS: dict") + 1
    registry.write_text(text[:at] + entry + text[at:])
    (tree / module_path).write_text(module)
    test_path = f"tests/test_{system}.py"
    (tree / test_path).write_text(TEST.format(module=module_path[:-3].replace("/", ".")))
    model_path, model_code, model = _model_example()
    (tree / model_path).write_text(model_code)
    after = {p.relative_to(tree) for p in tree.rglob("*") if p.is_file()}
    touched = sorted(str(p) for p in after if before.get(p) != (tree / p).read_bytes())
    assert touched == sorted(["bagpipe_cli/engine/registry.py", module_path, test_path, model_path])

    env = {k: v for k, v in os.environ.items() if k != forkserver.ENV}
    env["PYTHONPATH"] = str(tree)

    def run(*args: str, timeout: int = 600) -> str:
        r = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True,
                           text=True, timeout=timeout)
        assert r.returncode == 0, " ".join(args) + "\n" + r.stdout[-4000:] + r.stderr[-3000:]
        return r.stdout

    def bagpipe(*args: str) -> str:
        return run("-m", "bagpipe_cli", *args)

    # The registry-driven tests take both (the docs example's own test refuses a tree that
    # has the example already: it is the one thing this copy has done).
    out = run("-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not extended",
              "-k", "not docs_example_model", test_path, *INNER_TESTS)
    assert re.search(r"\d+ passed", out) and "failed" not in out
    out = run("-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
              "tests/test_checkpoint.py::test_resume_equals_the_straight_run", "-k", system)
    assert "1 passed" in out

    # Every command lists or runs them.
    systems = {f["name"]: f for f in json.loads(bagpipe("systems", "--format", "json"))}
    assert systems[system]["profiled"] == system and systems[system]["simulated"] == "policy"
    data = str(tiny_dataset)
    prof = tmp_path / "profile"
    bagpipe("profile", data, "--batch-size", "256", "--lookahead", "4", "--cache-rows", "3000",
            "--policies", f"none,{system}", "--out", str(prof))
    with open(prof / "per_batch.csv") as f:
        fetched = [int(r[f"{system}_R3000"]) for r in csv.DictReader(f)]
    run_dir = tmp_path / "run"
    bagpipe("train", data, "--system", system, "--model", model, "--cache-rows", "3000",
            "--batch-size", "256", "--iterations", "12", "--eval-rows", "2000", "--out", str(run_dir))
    with open(run_dir / "metrics.csv") as f:
        engine = [int(r["rows_fetched"]) for r in csv.DictReader(f)]
    assert engine == fetched[:12]  # profile simulates the policy the engine follows
    plan = bagpipe("bench", "benchmarks/quick.yaml", "--dry-run")
    assert system in plan  # a `systems: all` bench runs it
    sim = bagpipe("simulate", data, "--systems", f"sync,{system}", "--compute-ms", "1",
                  "--batch-size", "256", "--iterations", "12", "--eval-rows", "2000",
                  "--model", model)
    assert system in sim

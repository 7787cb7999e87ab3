"""The run counts the documentation states are the planner's: every bench file in
benchmarks/ states in its header how many configurations it plans, how many repeats and
how many runs that makes, and every README line that names a bench file with a count
("N runs", "N configurations") gives that file's numbers (at the line's `--repeat R`, if it
has one). The numbers come from the project's own planner (`load_bench_config`,
`plan_runs`), as `bagpipe bench` counts its `[i/N]`. A YAML file that is not a bench file is
a `bagpipe simulate --cluster` scenario, which plans no runs and states none.

Time estimates are not checked here: they depend on the machine (docs/benchmarks.md holds
measured ones, with the commit and machine state they were measured at)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bagpipe_cli.bench.config import find_bench_file, load_bench_config
from bagpipe_cli.bench.plan import plan_runs
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.simulate.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for ext in ("yaml", "yml", "toml") for p in (ROOT / "benchmarks").glob(f"*.{ext}"))
README = ROOT / "README.md"

# "42 runs", "1 run", "22 configurations", "x 2 repeats"; numbers may have thousands commas.
COUNT = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d+)\s+(runs?|configurations?|repeats?)\b")
REPEAT_OPTION = re.compile(r"--repeat[ =](\d+)")
NAMED = re.compile(r"\b([\w.-]+)\.(?:ya?ml|toml)\b")


def _plan(path: Path) -> tuple[int, int]:
    """(configurations, repeats) of a bench file, by the planner."""
    cfg = load_bench_config(path)
    return len(plan_runs(cfg)), cfg.repeat


def _is_bench(path: Path) -> bool:
    try:
        load_bench_config(path)
    except ConfigError:
        load_cluster(path)  # not a bench file: then a simulate scenario, or the test fails
        return False
    return True


BENCH = {p.name: p for p in FILES if _is_bench(p)}


def _header(path: Path) -> list[str]:
    """The file's leading comment lines, without their `#`."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return lines


def _wrong(text: str, configurations: int, repeat: int) -> list[str]:
    """Each count `text` states that is not the planner's: configurations, the repeats
    (`repeat`) and runs (configurations x repeats)."""
    want = {"configuration": configurations, "repeat": repeat, "run": configurations * repeat}
    out = []
    for m in COUNT.finditer(text):
        n, kind = int(m[1].replace(",", "")), m[2].removesuffix("s")
        if n != want[kind]:
            out.append(f"'{m[0]}' should be {want[kind]:,} {kind}s")
    return out


def _counts(text: str) -> set[str]:
    return {m[2].removesuffix("s") for m in COUNT.finditer(text)}


def _header_problems(path: Path) -> list[str]:
    """The header's wrong counts: lines with `--repeat R` at R, the rest (joined, so that a
    statement may wrap) at the file's repeat."""
    configurations, repeat = _plan(path)
    lines = _header(path)
    at_file_repeat = " ".join(ln for ln in lines if not REPEAT_OPTION.search(ln))
    wrong = _wrong(at_file_repeat, configurations, repeat)
    for ln in lines:
        if m := REPEAT_OPTION.search(ln):
            wrong += _wrong(ln, configurations, int(m[1]))
    return wrong


def _named_benches(line: str) -> set[str]:
    """The bench files a README line names (`bench --quick` names quick.yaml)."""
    names = {f"{m[1]}.{m[0].rsplit('.', 1)[1]}" for m in NAMED.finditer(line)}
    if re.search(r"\bbench\s+--quick\b", line):
        names.add(find_bench_file("quick").name)
    return names & set(BENCH)


def _readme_problems(text: str) -> tuple[list[str], list[str]]:
    """(wrong counts, bench files checked) of the README lines that state a count and name
    one bench file; a line naming several with a count is ambiguous, and wrong too."""
    wrong, checked = [], []
    for i, line in enumerate(text.splitlines(), 1):
        names = _named_benches(line)
        if not names or not COUNT.search(line):
            continue
        if len(names) > 1:
            wrong.append(f"README.md:{i}: a count with several bench files ({', '.join(sorted(names))})")
            continue
        (name,) = names
        configurations, repeat = _plan(BENCH[name])
        if m := REPEAT_OPTION.search(line):
            repeat = int(m[1])
        wrong += [f"README.md:{i} ({name} at repeat {repeat}): {w}"
                  for w in _wrong(line, configurations, repeat)]
        checked.append(name)
    return wrong, checked


def test_every_yaml_in_benchmarks_is_a_bench_file_or_a_simulate_scenario():
    assert "quick.yaml" in BENCH and "paper.yaml" in BENCH
    for path in FILES:
        if path.name not in BENCH:
            load_cluster(path)  # a scenario: plans no runs, so states none
            assert not _counts(" ".join(_header(path))) & {"run", "configuration"}, path.name


@pytest.mark.parametrize("name", sorted(BENCH))
def test_a_bench_files_header_states_the_planners_counts(name):
    path = BENCH[name]
    header = " ".join(_header(path))
    configurations, repeat = _plan(path)
    assert {"configuration", "repeat", "run"} <= _counts(header), (
        f"{name}: the header should say '{configurations:,} configurations x {repeat} repeats "
        f"= {configurations * repeat:,} runs'")
    assert _header_problems(path) == [], name


def test_the_readmes_run_counts_are_the_planners():
    wrong, checked = _readme_problems(README.read_text())
    assert wrong == []
    assert checked  # the README names bench files with their counts: some line was read


def test_the_check_finds_the_counts_that_were_wrong():
    """The statements that once disagreed with `bench`'s own `[1/528]` are caught."""
    configurations, repeat = _plan(BENCH["paper.yaml"])
    line = ("bagpipe bench benchmarks/paper.yaml --repeat 3 --out results/paper  # 384 runs: "
            "hours on 2 cores")
    wrong, checked = _readme_problems(line)
    assert checked == ["paper.yaml"]
    assert wrong == [f"README.md:1 (paper.yaml at repeat 3): '384 runs' should be "
                     f"{configurations * 3:,} runs"]
    assert configurations * 3 == 624  # what `bench ... --repeat 3` prints: [1/624] (12 systems)
    header = "criteo-kaggle.yaml. 128 configurations x 3 repeats = 256 runs; hours on 2 CPU cores."
    assert _wrong(header, configurations, repeat) == [
        f"'128 configurations' should be {configurations} configurations",
        f"'3 repeats' should be {repeat} repeats",
        f"'256 runs' should be {configurations * repeat} runs"]
    assert _wrong("1,000 runs", 500, 2) == [] and _wrong("1 run", 1, 1) == []
    assert _readme_problems("`paper.yaml` and `quick.yaml`: 12 runs")[0] == [
        "README.md:1: a count with several bench files (paper.yaml, quick.yaml)"]

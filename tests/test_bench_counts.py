"""The run counts are the planner's, computed, never stated where they follow the registry.

`bagpipe bench CONFIG --dry-run` prints the plan `plan_runs` makes: here its "N
configurations x R repeats = M runs" is checked against the matrix's arithmetic (per
system, the product of its distinct choices of every axis and of its own axes, summed over
the systems, times the datasets and models; runs = configurations x repeats) for every bench
file in benchmarks/, at its repeat and at another --repeat.

A bench file whose systems come from a group (`all`, `simulated`, `each-model`) states no
count in its header (adding a system to the registry changes it): it says how to get it,
`bagpipe bench benchmarks/X.yaml --dry-run`. A file with a fixed system list may state its
counts, and then they are the planner's. The same holds for README lines that name a bench
file with a count ("N runs", "N configurations", at the line's `--repeat R`, if it has one).
A YAML file that is not a bench file is a `bagpipe simulate --cluster` scenario, which plans
no runs and states none.

Time estimates are not checked here: they depend on the machine (docs/benchmarks.md holds
measured ones, with the commit and machine state they were measured at)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bagpipe_cli.bench.config import find_bench_file, load_bench_config
from bagpipe_cli.bench.plan import ignored_settings, plan_runs
from bagpipe_cli.cli import cli
from bagpipe_cli.engine.registry import GROUPS
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.records import read_record
from bagpipe_cli.simulate.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for ext in ("yaml", "yml", "toml") for p in (ROOT / "benchmarks").glob(f"*.{ext}"))
README = ROOT / "README.md"

# "42 runs", "1 run", "22 configurations", "x 2 repeats"; numbers may have thousands commas.
COUNT = re.compile(r"\b(\d{1,3}(?:,\d{3})+|\d+)\s+(runs?|configurations?|repeats?)\b")
REPEAT_OPTION = re.compile(r"--repeat[ =](\d+)")
NAMED = re.compile(r"\b([\w.-]+)\.(?:ya?ml|toml)\b")
# --dry-run's total: "28 configurations x 3 repeats = 84 runs"
TOTAL = re.compile(r"^([\d,]+) configurations? x ([\d,]+) repeats? = ([\d,]+) runs?$", re.M)


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


def _groups(path: Path) -> list[str]:
    """The groups (`all`, `simulated`, `each-model`) among the file's `systems`."""
    systems = read_record(path, "bench file").get("systems")
    systems = [systems] if isinstance(systems, str) else systems
    return [s for s in systems if isinstance(s, str) and s in GROUPS]


GROUPED = {name for name, p in BENCH.items() if _groups(p)}


def _arithmetic(path: Path) -> int:
    """The configurations of a bench file, from its matrix's sizes: per system, the product
    of its distinct choices of every axis (choices alike but for settings it does not read
    are one) and of its own axes' sizes; summed over the systems; times datasets and models."""
    cfg = load_bench_config(path)
    per_system = 0
    for system in cfg.systems:
        ignored = ignored_settings(system)
        sizes = [len({json.dumps({k: v for k, v in s.items() if k not in ignored}, sort_keys=True,
                                 default=str) for _, s in axis.choices}) for axis in cfg.matrix]
        sizes += [len(axis.choices) for axis in cfg.system_axes.get(system, ())]
        per_system += math.prod(sizes)
    return per_system * len(cfg.datasets) * len(cfg.models)


def _dry_run(path: Path, *args: str) -> tuple[int, int, int, list[str]]:
    """(configurations, repeats, runs, configuration ids) as `bench --dry-run` prints them."""
    r = CliRunner().invoke(cli, ["bench", str(path), "--dry-run", *args])
    assert r.exit_code == 0, r.output
    (m,) = TOTAL.findall(r.output)
    ids = [ln.split("\t")[0] for ln in r.output.splitlines()
           if "\t" in ln and not ln.startswith("configuration\t")]
    return *(int(x.replace(",", "")) for x in m), ids


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
    one bench file; a line naming several with a count is ambiguous, and wrong too, and so is
    a count of a file whose systems are a group (it follows the registry: --dry-run gives it)."""
    wrong, checked = [], []
    for i, line in enumerate(text.splitlines(), 1):
        names = _named_benches(line)
        if not names or not COUNT.search(line) or not _counts(line) & {"run", "configuration"}:
            continue
        if len(names) > 1:
            wrong.append(f"README.md:{i}: a count with several bench files ({', '.join(sorted(names))})")
            continue
        (name,) = names
        if name in GROUPED:
            wrong.append(f"README.md:{i}: a count of {name}, whose systems are a group: say "
                         f"how to get it (bagpipe bench benchmarks/{name} --dry-run)")
            continue
        configurations, repeat = _plan(BENCH[name])
        if m := REPEAT_OPTION.search(line):
            repeat = int(m[1])
        wrong += [f"README.md:{i} ({name} at repeat {repeat}): {w}"
                  for w in _wrong(line, configurations, repeat)]
        checked.append(name)
    return wrong, checked


def test_every_yaml_in_benchmarks_is_a_bench_file_or_a_simulate_scenario():
    assert "quick.yaml" in BENCH and "paper.yaml" in BENCH
    assert {"quick.yaml", "paper.yaml"} <= GROUPED
    for path in FILES:
        if path.name not in BENCH:
            load_cluster(path)  # a scenario: plans no runs, so states none
            assert not _counts(" ".join(_header(path))) & {"run", "configuration"}, path.name


@pytest.mark.parametrize("name", sorted(BENCH))
def test_dry_run_prints_the_planners_arithmetic(name):
    path = BENCH[name]
    cfg = load_bench_config(path)
    plan = plan_runs(cfg)
    configurations, repeat, runs, ids = _dry_run(path)
    assert configurations == _arithmetic(path) == len(plan), name
    assert repeat == cfg.repeat and runs == configurations * repeat, name
    assert ids == [f"{p.slug}-{p.key}" for p in plan] and len(set(ids)) == len(ids), name
    other = cfg.repeat + 1  # --repeat applies as for a real bench
    assert _dry_run(path, "--repeat", str(other))[:3] == (configurations, other,
                                                          configurations * other), name


def test_dry_run_writes_nothing_and_applies_quick(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["bench", "--quick", "--dry-run", "--repeat", "2"])
    assert r.exit_code == 0, r.output
    configurations = _arithmetic(find_bench_file("quick"))
    assert TOTAL.findall(r.output) == [(f"{configurations:,}", "2", f"{configurations * 2:,}")]
    assert list(tmp_path.iterdir()) == []  # no bench folder, no dataset generated


def test_dry_run_checks_the_size_limits(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("name: big\ndatasets:\n  - {name: d, path: d, synth: {preset: tiny, rows: 100}}\n"
                 "systems: [sync]\nrepeat: 1\nbase: {iterations: 4, warmup: 1}\n")
    r = CliRunner().invoke(cli, ["bench", str(f), "--dry-run", "--repeat", "1001"])
    assert r.exit_code != 0 and "at most 1,000" in r.output, r.output


@pytest.mark.parametrize("name", sorted(BENCH))
def test_a_header_states_a_count_only_for_a_fixed_system_list(name):
    path = BENCH[name]
    header = " ".join(_header(path))
    if name in GROUPED:
        assert not _counts(header) & {"run", "configuration"}, (
            f"{name}: its systems are a group ({', '.join(_groups(path))}): its count follows "
            "the registry; say how to get it instead")
        assert f"bagpipe bench benchmarks/{name} --dry-run" in header, name
    else:
        assert _header_problems(path) == [], name


def test_the_readmes_run_counts_are_the_planners():
    wrong, checked = _readme_problems(README.read_text())
    assert wrong == []
    assert checked  # the README names bench files with their counts: some line was read
    assert "bagpipe bench --quick --dry-run" in README.read_text()


def test_the_check_finds_the_counts_that_were_wrong():
    """A count that disagrees with the planner's is caught, and so is any count of a file
    whose systems are a group (the README once said 384 runs where bench printed [1/528])."""
    fixed = sorted(set(BENCH) - GROUPED)[0]
    configurations, repeat = _plan(BENCH[fixed])
    wrong_runs = configurations * 3 + 1
    line = f"bagpipe bench benchmarks/{fixed} --repeat 3 --out results/x  # {wrong_runs} runs"
    wrong, checked = _readme_problems(line)
    assert checked == [fixed]
    assert wrong == [f"README.md:1 ({fixed} at repeat 3): '{wrong_runs} runs' should be "
                     f"{configurations * 3:,} runs"]
    line = "bagpipe bench benchmarks/paper.yaml --repeat 3 --out results/paper  # 384 runs"
    assert _readme_problems(line) == ([
        "README.md:1: a count of paper.yaml, whose systems are a group: say how to get it "
        "(bagpipe bench benchmarks/paper.yaml --dry-run)"], [])
    header = "x.yaml. 128 configurations x 3 repeats = 256 runs; hours on 2 CPU cores."
    assert _wrong(header, configurations, repeat) == [
        f"'128 configurations' should be {configurations} configurations",
        f"'3 repeats' should be {repeat} repeats",
        f"'256 runs' should be {configurations * repeat} runs"]
    assert _wrong("1,000 runs", 500, 2) == [] and _wrong("1 run", 1, 1) == []
    assert _readme_problems("`successors.yaml` and `torchrec.yaml`: 12 runs")[0] == [
        "README.md:1: a count with several bench files (successors.yaml, torchrec.yaml)"]

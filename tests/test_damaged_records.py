"""Damaged records: every JSON, YAML and TOML file bagpipe reads back is read with limits
(`bagpipe_cli/files/records.py`), so a file nested thousands of levels deep, one of the wrong
shape, a damaged checkpoint, a bench too large to plan or a bench whose dataset changed is
one `Error:` line and exit 2, never a traceback."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from helpers import run_cli

from bagpipe_cli.bench import runner as bench_runner
from bagpipe_cli.bench.config import load_bench_config, parse_bench_config
from bagpipe_cli.bench.plan import config_key, count_runs, plan_runs
from bagpipe_cli.data.format import open_dataset, read_meta
from bagpipe_cli.engine import TrainConfig
from bagpipe_cli.engine.records import checkpoint
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.records import KINDS, MAX_DEPTH, json_depth, nesting_exceeds, read_record
from bagpipe_cli.results import load_results

EXAMPLE = Path(__file__).resolve().parent / "data" / "bench-example"
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
DEEP = 5000  # levels: far past Python's recursion limit


def _one_error_line(r, *needles: str) -> str:
    """The command failed with exit 2 and one `Error:` line holding every needle."""
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert out.startswith("Error: "), out
    for n in needles:
        assert n in out, out
    return out


def _deep_json(**outer) -> str:
    """A JSON object with `outer`'s keys, and `deep` a list nested DEEP levels."""
    return json.dumps(outer)[:-1] + (", " if outer else "") + '"deep": ' + "[" * DEEP + "]" * DEEP + "}"


# ------------------------------------------------------------------ the reader itself


def test_the_depth_of_json_text_is_counted_outside_strings():
    assert json_depth(b"{}") == 1 and json_depth(b'[1, {"a": [2]}]') == 3
    assert json_depth(b'{"a": "[[[[\\"[[{{"}') == 1  # brackets in strings, an escaped quote
    assert json_depth(("[" * DEEP + "]" * DEEP).encode()) == DEEP


def test_walking_yaml_aliases_and_self_reference_ends():
    a: list = [1] * 10
    for _ in range(40):  # 10^40 leaves, 41 distinct lists
        a = [a] * 10
    assert not nesting_exceeds(a, MAX_DEPTH) and nesting_exceeds(a, 30)
    loop: list = []
    loop.append(loop)
    assert nesting_exceeds(loop, MAX_DEPTH)


@pytest.mark.parametrize("name, text", [
    ("deep.json", '{"schema_version": 1, "a": ' + "[" * DEEP + "]" * DEEP + "}"),
    ("deep.yaml", "a: " + "[" * DEEP + "]" * DEEP + "\n"),
    ("deep.toml", "a = " + "[" * DEEP + "]" * DEEP + "\n"),
    ("block.yaml", "".join(f"{' ' * i}k{i}:\n" for i in range(400)) + " " * 400 + "x: 1\n"),
])
def test_deep_files_of_every_syntax_are_one_error(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    kind = KINDS["bench file"] if name != "deep.json" else KINDS["run summary"]
    with pytest.raises(Exception, match=f"nested more than {MAX_DEPTH} levels deep") as e:
        read_record(tmp_path / name, kind)
    assert type(e.value) is kind.error


def test_a_record_larger_than_its_kind_allows_is_refused_unread(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"schema_version": 1, "x": "y" * 5000}))
    with pytest.raises(ValueError, match="more than the 0 MiB a run's summary.json may have"):
        read_record(tmp_path / "summary.json", "run summary", max_bytes=1000)


# ------------------------------------------------ deep records through the commands


def test_deep_meta_json_in_profile(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "meta.json").write_text(_deep_json(schema_version=1, rows=10))
    r = run_cli("profile", str(tmp_path / "ds"), "--out", str(tmp_path / "p"))
    _one_error_line(r, f"{tmp_path / 'ds' / 'meta.json'}: nested more than 64 levels deep")


@pytest.fixture
def bench_copy(tmp_path) -> Path:
    out = tmp_path / "bench"
    shutil.copytree(EXAMPLE, out)
    return out


def _first_run(bench: Path) -> Path:
    return sorted((bench / "runs").iterdir())[0]


def test_deep_summary_json_is_skipped_in_a_bench_and_refused_alone(bench_copy):
    run = _first_run(bench_copy)
    (run / "summary.json").write_text(_deep_json(schema_version=1))
    loaded = load_results(bench_copy)
    (skipped,) = loaded.attrs["skipped"]
    assert skipped.path == run and "nested more than 64 levels deep" in skipped.reason
    assert len(loaded) == 15
    _one_error_line(run_cli("report", str(run)), f"{run}/summary.json: nested more than 64")


def test_deep_bench_json_in_bench_resume_and_deep_index_json_in_report(bench_copy):
    (bench_copy / "index.json").write_text(_deep_json(schema_version=1))
    _one_error_line(run_cli("report", str(bench_copy), "--out", str(bench_copy.parent / "r")),
                    f"{bench_copy}/index.json: nested more than 64 levels deep")
    (bench_copy / "bench.json").write_text(_deep_json(schema_version=1, kind="bagpipe-bench"))
    _one_error_line(run_cli("bench", "--resume", "--out", str(bench_copy)),
                    f"{bench_copy}/bench.json: nested more than 64 levels deep")


@pytest.mark.parametrize("suffix, deep", [
    (".yaml", "[" * DEEP + "]" * DEEP), (".toml", "[" * DEEP + "]" * DEEP)])
def test_a_deep_bench_file(tmp_path, tiny_dataset, suffix, deep):
    f = tmp_path / f"deep{suffix}"
    sep = ": " if suffix == ".yaml" else " = "
    f.write_text(f"name{sep}'deep'\nmodels{sep}{deep}\n")
    _one_error_line(run_cli("bench", str(f), "--out", str(tmp_path / "b")),
                    f"{f}: nested more than 64 levels deep")


def test_a_deep_cluster_file(tmp_path, tiny_dataset):
    f = tmp_path / "cluster.yaml"
    f.write_text(f"data: {tiny_dataset}\ncompute_ms: 5\nreported: " + "{a: " * DEEP + "1" + "}" * DEEP)
    _one_error_line(run_cli("simulate", "--cluster", str(f), "--out", str(tmp_path / "s")),
                    f"--cluster {f}: nested more than 64 levels deep")


# ------------------------------------------------------------ versions and summaries


def test_a_newer_schema_version_names_the_version_needed(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "meta.json").write_text(json.dumps(
        {"schema_version": 2, "rows": 10, "bagpipe_version": "9.1.0"}))
    _one_error_line(run_cli("profile", str(tmp_path / "ds"), "--out", str(tmp_path / "p")),
                    "meta.json: schema_version 2 is not supported by this bagpipe (expects 1): it "
                    "was written by a newer bagpipe, 9.1.0; read it with bagpipe 9.1.0 or later")


@pytest.mark.parametrize("change, words", [
    ({"samples_per_s": None}, "summary.json: samples_per_s is null, not a number"),
    ({"median_iter_ms": None}, "summary.json: median_iter_ms is null, not a number"),
    ({"system": None}, "summary.json: lacks system (a string)"),
    ({"model": 3}, "summary.json: model is 3, not a string"),
])
def test_a_run_whose_summary_figures_are_null_or_missing_is_skipped(bench_copy, change, words):
    """As report treats an unreadable run: skipped with a warning naming the file and the key
    inside a folder given, refused (exit 2) when the run folder is given itself."""
    run = _first_run(bench_copy)
    s = json.loads((run / "summary.json").read_text())
    s.update(change)
    s = {k: v for k, v in s.items() if not (k == "system" and v is None)}
    (run / "summary.json").write_text(json.dumps(s))
    loaded = load_results(bench_copy)
    (skipped,) = loaded.attrs["skipped"]
    assert skipped.path == run and skipped.reason.startswith(words) and len(loaded) == 15
    assert "rerun the run" in skipped.reason
    _one_error_line(run_cli("report", str(run)), f"{run}/{words}")


# ------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_dataset) -> tuple[Path, list[str]]:
    """A run's two checkpoints (iterations 2 and 4) and the options that made them."""
    root = tmp_path_factory.mktemp("ck")
    args = ["train", str(tiny_dataset), "--batch-size", "256", "--iterations", "6",
            "--lookahead", "4", "--eval-rows", "1000", "--checkpoint-every", "2",
            "--checkpoint-dir", str(root / "ck")]
    r = run_cli(*args, "--out", str(root / "run"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p.name for p in checkpoint.list_checkpoints(root / "ck")] == \
        ["ckpt-00000004", "ckpt-00000002"]
    return root / "ck", args[:-2]


def _rewrite(ck: Path, name: str, write) -> None:
    """Write file `name` of checkpoint `ck` with `write(path)`, and its checksum to match: a
    checkpoint written so, which the checksums cannot tell from a good one."""
    write(ck / name)
    sums = json.loads((ck / "checksums.json").read_text())
    sums["sha256"][name] = hashlib.sha256((ck / name).read_bytes()).hexdigest()
    (ck / "checksums.json").write_text(json.dumps(sums))


def _state(change: dict):
    def write(path: Path) -> None:
        state = json.loads(path.read_text())
        state.update(change)
        path.write_text(json.dumps({k: v for k, v in state.items() if v is not None}))
    return write


def _tables(rows_less: int = 0, dim_less: int = 0):
    def write(path: Path) -> None:
        t = torch.load(path, weights_only=True)
        torch.save({"weight": t["weight"][rows_less:, dim_less:], "state": t["state"][rows_less:]},
                   path)
    return write


DAMAGE = {  # what is done to the newest checkpoint -> (its file, the problem named)
    "no iteration": ("state.json", _state({"iteration": None}), "lacks iteration (an integer)"),
    "no config": ("state.json", _state({"config": None}), "lacks config (a JSON object)"),
    "no dataset": ("state.json", _state({"dataset": None}), "lacks dataset (a JSON object)"),
    "config a list": ("state.json", _state({"config": [1, 2]}), "config is [1, 2], not a JSON object"),
    "deep state": ("state.json", lambda p: p.write_text(_deep_json(
        **json.loads(p.read_text()))), "nested more than 64 levels deep"),
    "metrics text": ("metrics.json", lambda p: p.write_text('"iteration,loss\\n0,0.69"'),
                     "not a list"),
    "metrics value text": ("metrics.json", lambda p: p.write_text(json.dumps(
        [[{"iteration": 0, "loss": "0.69"}]])), "record 0 of metrics stream 0: loss is '0.69', not a number"),
    "tables rows": ("tables.pt", _tables(rows_less=7),
                    "weight is a [{less:,}, 16] table, but this run's is [{rows:,}, 16]"),
    "tables dim": ("tables.pt", _tables(dim_less=3),
                   "weight is a [{rows:,}, 13] table, but this run's is [{rows:,}, 16]"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_checkpoint_is_one_line_naming_the_previous(checkpoints, tiny_dataset,
                                                               tmp_path, case):
    root, args = checkpoints
    ck = tmp_path / "ck"
    shutil.copytree(root, ck)
    name, damage, problem = DAMAGE[case]
    rows = sum(read_meta(tiny_dataset).cardinalities)  # every table's rows, stacked
    problem = problem.format(rows=rows, less=rows - 7)
    _rewrite(ck / "ckpt-00000004", name, damage)
    r = run_cli(*args, "--iterations", "8", "--out", str(tmp_path / "run"), "--resume", str(ck))
    _one_error_line(r, f"--resume {ck / 'ckpt-00000004' / name}: {problem}",
                    f"the checkpoint cannot be resumed; resume from the previous one: --resume "
                    f"{ck / 'ckpt-00000002'}")
    assert not (tmp_path / "run").exists()
    # Without an earlier checkpoint, the line says so.
    shutil.rmtree(ck / "ckpt-00000002")
    r = run_cli(*args, "--iterations", "8", "--out", str(tmp_path / "run"), "--resume", str(ck))
    _one_error_line(r, problem, "no earlier checkpoint is kept")


def test_a_good_checkpoint_passes_every_check(checkpoints, tiny_dataset):
    """What the checkpoint writer writes, the reader's limits and checks accept."""
    root, _ = checkpoints
    ck = checkpoint.find_checkpoint(root)
    assert ck.path.name == "ckpt-00000004" and ck.iteration == 4 and not ck.skipped
    cfg = TrainConfig(data=str(tiny_dataset), batch_size=256, iterations=8, lookahead=4,
                      eval_rows=1000, checkpoint_every=2)
    checkpoint.check_compatible(cfg, ck, checkpoint.dataset_identity(open_dataset(tiny_dataset)))


# ------------------------------------------------------------------- bench size


def _matrix_file(tmp_path: Path, data: Path, systems: str, seeds: int, lrs: int) -> Path:
    f = tmp_path / "huge.yaml"
    f.write_text(f"name: huge\ndatasets: [{{name: t, path: {data}}}]\nsystems: {systems}\n"
                 "profile: false\nbase: {batch_size: 256, iterations: 4, warmup: 1}\nmatrix:\n"
                 f"  seed: {list(range(seeds))}\n"
                 f"  lr: {[round(0.001 * (i + 1), 3) for i in range(lrs)]}\n")
    return f


@pytest.mark.parametrize("systems, repeat, words", [
    ("[sync, local]", None, "200,000 runs x 1 repeats = 200,000 runs, more than 100,000"),
    ("[sync]", "2", "100,000 runs x 2 repeats = 200,000 runs, more than 100,000"),
])
def test_a_bench_too_large_is_refused_before_it_is_planned(tmp_path, tiny_dataset, systems,
                                                           repeat, words):
    f = _matrix_file(tmp_path, tiny_dataset, systems, 1000, 100)
    t = time.perf_counter()
    r = run_cli("bench", str(f), "--out", str(tmp_path / "b"), *(["--repeat", repeat] if repeat else []))
    _one_error_line(r, words)
    assert time.perf_counter() - t < 10, "planned before refusing"
    assert not (tmp_path / "b").exists()


def test_the_run_count_is_the_planned_count(tiny_dataset, tmp_path):
    """Counted from the matrix's sizes, settings a system does not read collapsing (sync
    ignores the lookahead): what plan_runs finds, on the benches of benchmarks/ too."""
    cfg = parse_bench_config({
        "name": "c", "datasets": [{"name": "t", "path": str(tiny_dataset)}],
        "systems": ["sync", {"name": "bagpipe", "round": [1, 2]}, "lru"],
        "base": {"batch_size": 256, "iterations": 4, "warmup": 1},
        "matrix": {"lookahead": [4, 8, 16], "net": [{"label": "a"}, {"label": "b", "net_gbps": 1}],
                   "lr": [0.1, 0.2]}})
    assert count_runs(cfg) == len(plan_runs(cfg)) == 2 * 2 * (1 + 3 * 2 + 3)
    for f in sorted(BENCHMARKS.glob("*.yaml")):
        try:
            cfg = load_bench_config(f)
        except ConfigError:
            continue  # a `simulate --cluster` scenario
        assert count_runs(cfg) == len(plan_runs(cfg)), f.name


def test_run_ids_are_those_of_the_config_as_a_dict(tiny_dataset):
    """A bench's run ids (the hash of the effective config) stay what they were, so that
    --resume finds the runs of benches started before planning was made faster."""
    cfg = TrainConfig(data=str(tiny_dataset), system="bagpipe", lookahead=8, bottom_mlp=(8, 4))
    blob = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
    assert config_key(cfg) == hashlib.sha1(blob.encode()).hexdigest()[:8]


# --------------------------------------------------------------- bench --resume


def test_bench_resume_refuses_a_changed_dataset_or_code(tmp_path, tiny_dataset, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(tiny_dataset, data)
    f = tmp_path / "b.yaml"
    f.write_text(f"name: b\ndatasets: [{{name: t, path: {data}}}]\nsystems: [local]\n"
                 "profile: false\nbase: {batch_size: 256, iterations: 3, warmup: 1, "
                 "eval_rows: 1000}\nmatrix: {seed: [0, 1]}\n")
    out = tmp_path / "bench"
    real = bench_runner.run
    monkeypatch.setattr(bench_runner, "run", lambda *a, **k: real(*a, **k) if not (
        out / "runs").is_dir() or not any((out / "runs").iterdir()) else 1 / 0)
    r = run_cli("bench", str(f), "--out", str(out))  # the second run fails: an interrupted bench
    assert r.returncode != 0 and len(list((out / "runs").iterdir())) == 1
    monkeypatch.setattr(bench_runner, "run", lambda *a, **k: pytest.fail("ran after a refusal"))
    # The dataset re-created with another seed: the same shape, other arrays.
    from bagpipe_cli.data.synth import SynthConfig, generate

    shutil.rmtree(data)
    generate(SynthConfig(preset="tiny", rows=20_000, seed=1), data)
    _one_error_line(run_cli("bench", "--resume", "--out", str(out)),
                    f"--resume: dataset t ({data}) changed since {out} was started: the "
                    "checksums of cat_000.npy, cat_001.npy, cat_002.npy ... differ",
                    "its runs would mix two datasets in one table")
    # The dataset back as it was, the code changed: refused too, naming the revision.
    shutil.rmtree(data)
    shutil.copytree(tiny_dataset, data)
    env = bench_runner.environment()
    monkeypatch.setattr(bench_runner, "environment", lambda: {**env, "git_revision": "f00d"})
    _one_error_line(run_cli("bench", "--resume", "--out", str(out)),
                    "was started by git revision", "this is f00d",
                    "its runs would mix two versions of the code")

"""`bagpipe bench`: config validation, planning, end-to-end runs, resume and interrupts."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bagpipe_cli.bench import load_bench_config, parse_bench_config, plan_runs
from bagpipe_cli.bench import runner as bench_runner
from bagpipe_cli.cli import cli
from bagpipe_cli.engine.registry import ENGINE_SYSTEMS as SYSTEMS
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.results import load_metrics, load_results

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _config(tmp_path: Path, data: Path, extra: str = "", systems: str = "[sync, bagpipe]",
            base: str = "", matrix: str = "  lookahead: [4, 8]") -> Path:
    p = tmp_path / "tiny.yaml"
    p.write_text(f"""
name: tiny
datasets:
  - {{name: tiny, path: {data}}}
models: [dlrm]
systems: {systems}
repeat: 1
base: {{batch_size: 256, iterations: 8, warmup: 2, eval_rows: 1000{base}}}
matrix:
{matrix}
{extra}""")
    return p


def _index(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())


def test_bench_end_to_end(tmp_path, tiny_dataset):
    cfg = _config(tmp_path, tiny_dataset)
    out = tmp_path / "bench"
    r = CliRunner().invoke(cli, ["bench", str(cfg), "--out", str(out), "--repeat", "2"])
    assert r.exit_code == 0, r.output
    idx = _index(out)
    # sync ignores the lookahead: 1 sync + 2 bagpipe configurations, twice.
    assert idx["planned"] == idx["completed"] == 6
    assert idx["schema_version"] == 1 and idx["name"] == "tiny"
    runs = idx["runs"]
    assert [x["repeat"] for x in runs] == [1, 1, 1, 2, 2, 2]  # repeats interleaved
    assert [x["system"] for x in runs[:3]] == ["sync", "bagpipe", "bagpipe"]
    assert {x["variant"] for x in runs if x["system"] == "bagpipe"} == {"L4", "L8"}
    for x in runs:
        assert x["status"] == "done" and x["samples_per_s"] > 0
        assert x["run_id"].endswith(f"-r{x['repeat']}")
        assert (out / x["path"] / "summary.json").is_file()
    assert (out / "index.csv").read_text().count("\n") == 7
    bench = json.loads((out / "bench.json").read_text())
    assert bench["config"]["systems"] == ["sync", "bagpipe"] and len(bench["planned_runs"]) == 6
    assert "torch" in json.loads((out / "environment.json").read_text())
    assert (out / "profiles" / "tiny" / "access_cdf.csv").is_file()
    # The bench's profile records its dataset as `bagpipe profile` does (simulate reads it).
    prof = json.loads((out / "profiles" / "tiny" / "profile.json").read_text())["dataset"]
    assert prof["path"] == str(Path(tiny_dataset).resolve()) and prof["given"] == str(tiny_dataset)
    # The loader: one row per run, config and summary flattened.
    df = load_results(out)
    assert len(df) == 6 and set(df["system"]) == {"sync", "bagpipe"}
    assert {"lookahead", "net_gbps", "samples_per_s", "median_ms_forward", "repeat", "run_path",
            "env_torch", "bench"} <= set(df.columns)
    assert (df["bench"] == "tiny").all()
    assert sorted(df.loc[df["system"] == "bagpipe", "lookahead"].unique()) == [4, 8]
    m = load_metrics(out / "runs" / runs[0]["run_id"])
    assert len(m) == 8 and m["measured"].sum() == 6
    # "live" output: one line per finished run and the summary table, then the verdict in
    # words (as `report` gives it) and the small-data fact: these tables fit many times.
    assert runs[0]["run_id"] in r.output and "bagpipe report" in r.output
    closing = r.stdout[r.stdout.index("median over repeats"):]
    # the fastest named with its lead, or a lead within the noise said in words
    assert (("was fastest" in closing and "the best other system" in closing)
            or "are within the noise of each other" in closing)
    assert "`local` (every table on each trainer: no fetches" in closing and "can run" in closing
    assert "is the answer" not in closing and "mean ms" in closing


@pytest.mark.slow
@pytest.mark.extended  # make test-all
def test_bench_runs_over_torch_distributed(tmp_path, tiny_dataset):
    """`transport: torch` in a bench: each run is spawned as real ranks (1 + K + N processes)."""
    p = _config(tmp_path, tiny_dataset, "profile: false", base=", trainers: 2, transport: torch",
                matrix="  lookahead: [4]")
    out = tmp_path / "bench"
    r = CliRunner().invoke(cli, ["bench", str(p), "--out", str(out)])
    assert r.exit_code == 0, r.output
    df = load_results(out)
    assert sorted(df["system"]) == ["bagpipe", "sync"] and (df["transport"] == "torch").all()
    for run in _index(out)["runs"]:
        s = json.loads((out / run["path"] / "summary.json").read_text())
        assert s["world_size"] == 4 and set(s["roles"]) == {"planner", "server0", "trainer0", "trainer1"}
    # the same parameters: bagpipe's loss curve is sync's
    losses = [load_metrics(out / "runs" / r)["loss"].tolist() for r in sorted(df["run_path"])]
    assert losses[0] == losses[1]


def test_resume_skips_complete_runs(tmp_path, tiny_dataset, monkeypatch):
    cfg = _config(tmp_path, tiny_dataset)
    out = tmp_path / "bench"
    assert CliRunner().invoke(cli, ["bench", str(cfg), "--out", str(out)]).exit_code == 0
    # Without --resume an existing bench folder is refused.
    r = CliRunner().invoke(cli, ["bench", str(cfg), "--out", str(out)])
    assert r.exit_code == 2 and "--resume" in r.output

    def boom(*a, **k):
        raise AssertionError("a complete run was run again")

    monkeypatch.setattr(bench_runner, "run", boom)
    r = CliRunner().invoke(cli, ["bench", "--resume", "--out", str(out)])  # config from bench.json
    assert r.exit_code == 0, r.output
    idx = _index(out)
    assert idx["completed"] == 3 and {x["status"] for x in idx["runs"]} == {"kept"}


def test_resume_with_another_config_is_refused(tmp_path, tiny_dataset, monkeypatch):
    """A bench folder resumed with another config is refused in one line naming each
    differing key with both values (its runs would mix two configs); another --repeat and
    the same config from another file are accepted."""
    from bagpipe_cli.results import write_bench

    first = load_bench_config(_config(tmp_path, tiny_dataset, "profile: false"))
    out = tmp_path / "bench"
    (out / "runs").mkdir(parents=True)
    write_bench(out, first.to_json(), [])
    ran = []
    monkeypatch.setattr(bench_runner, "run", lambda *a, **k: ran.append(1) or 1 / 0)
    other = _config(tmp_path, tiny_dataset, "profile: false", systems="[sync, lru]",
                    base=", lr: 0.5", matrix="  lookahead: [4, 16]")
    r = CliRunner().invoke(cli, ["bench", str(other), "--out", str(out), "--resume"])
    assert r.exit_code == 2
    line = r.output.strip()
    assert "\n" not in line and "--overwrite" not in line
    bench_json = out / "bench.json"
    assert f"systems: [sync, bagpipe] in {bench_json}, [sync, lru] in {other}" in line
    assert f"base.lr: unset in {bench_json}, 0.5 in {other}" in line
    assert f"matrix.lookahead: [4, 8] in {bench_json}, [4, 16] in {other}" in line
    assert "bagpipe bench --resume --out" in line
    assert {p.name for p in out.iterdir()} == {"bench.json", "runs"} and not ran  # nothing done
    # The same config with another --repeat passes the check (and goes on to run).
    same = _config(tmp_path, tiny_dataset, "profile: false")
    r = CliRunner().invoke(cli, ["bench", str(same), "--out", str(out), "--resume", "--repeat", "2"])
    assert "another config" not in r.output and ran


@pytest.mark.parametrize("damage,needle", [
    ("schema", "summary.json: schema_version 2 is not supported by this bagpipe (expects 1)"),
    ("truncated", "metrics.csv: 5 rows, but summary.json counts 8 iterations"),
])
def test_resume_checks_the_runs_it_keeps(tmp_path, tiny_dataset, monkeypatch, damage, needle):
    """A kept run is read through the results store: one it cannot read stops --resume with
    one line naming the file (instead of indexing an unchecked summary)."""
    cfg = _config(tmp_path, tiny_dataset, "profile: false", matrix="  lookahead: [4]")
    out = tmp_path / "bench"
    assert CliRunner().invoke(cli, ["bench", str(cfg), "--out", str(out)]).exit_code == 0
    run = out / _index(out)["runs"][0]["path"]
    if damage == "schema":
        s = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**s, "schema_version": 2}))
    else:
        lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
        (run / "metrics.csv").write_text("".join(lines[:-3]))
    monkeypatch.setattr(bench_runner, "run", lambda *a, **k: pytest.fail("ran a kept run"))
    r = CliRunner().invoke(cli, ["bench", "--resume", "--out", str(out)])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == f"Error: {run}/{needle}" + (
        "; use the bagpipe version that wrote it, or rerun the benchmark with this one"
        if damage == "schema" else "; the file is truncated or damaged, rerun the run")


def test_interrupted_bench_keeps_finished_runs(tmp_path, tiny_dataset, monkeypatch):
    cfg = _config(tmp_path, tiny_dataset)
    out = tmp_path / "bench"
    real = bench_runner.run
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(bench_runner, "run", flaky)
    r = CliRunner().invoke(cli, ["bench", str(cfg), "--out", str(out)])
    assert r.exit_code == 130
    assert "1 finished run kept" in r.output and "--resume" in r.output
    idx = _index(out)
    assert idx["completed"] == 1 and idx["planned"] == 3
    first = idx["runs"][0]["run_id"]
    assert [p.name for p in (out / "runs").iterdir()] == [first]  # no half-written run
    assert not [p for p in (out / "runs").iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(bench_runner, "run", real)
    r = CliRunner().invoke(cli, ["bench", str(cfg), "--out", str(out), "--resume"])
    assert r.exit_code == 0, r.output
    idx = _index(out)
    assert idx["completed"] == 3
    assert [x["status"] for x in idx["runs"]] == ["kept", "done", "done"]


@pytest.mark.parametrize("extra,systems,needle", [
    ("  frobnicate: [1, 2]", "[sync, bagpipe]", "frobnicate"),
    ("", "[sync, warp]", "unknown system 'warp'"),
    # a setting given to one system that never reads it (a matrix's or base's is reset instead)
    ("", "[sync, {name: prefetch, lookahead: [1, 2]}]",
     "systems[1].lookahead: prefetch does not read it (read by bagpipe, lru"),
    ("", "[{name: hotline, staleness: 2}]", "systems[0].staleness: hotline does not read it (read by het)"),
    ("unknown_top: 1", "[sync, bagpipe]", "unknown key 'unknown_top'"),
    ("  net: [{label: a, net_gbps: fast}]", "[sync]", "matrix.net[0].net_gbps"),
    ("  master: ['10.0.0.1:29500']", "[sync]", "a bench starts every rank of its runs on this machine"),
])
def test_bad_config_is_one_line_exit_2(tmp_path, tiny_dataset, extra, systems, needle):
    cfg = _config(tmp_path, tiny_dataset, extra, systems)
    r = CliRunner().invoke(cli, ["bench", str(cfg), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert needle in r.output and str(cfg) in r.output
    assert r.output.strip().count("\n") == 0
    assert not (tmp_path / "o").exists()


def test_missing_config_and_missing_dataset(tmp_path):
    r = CliRunner().invoke(cli, ["bench", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "nope.yaml does not exist" in r.output
    cfg = _config(tmp_path, tmp_path / "no-data")
    r = CliRunner().invoke(cli, ["bench", str(cfg), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no-data does not exist" in r.output and "preprocess" in r.output
    # Nothing is left behind (no bench.json, no environment.json) that would refuse the
    # corrected rerun with the same --out.
    assert not (tmp_path / "o").exists()


def test_plan_dedups_settings_a_system_ignores(tmp_path):
    cfg = parse_bench_config({
        "datasets": [{"name": "d", "path": str(tmp_path)}], "systems": list(SYSTEMS),
        "base": {"iterations": 10, "warmup": 2, "cache_rows": 5000},
        "matrix": {"lookahead": [4, 16], "net": [{"label": "a"}, {"label": "b", "net_gbps": 1.0}]},
    }, "t.yaml")
    plan = plan_runs(cfg)
    per = {s: sum(p.config.system == s for p in plan) for s in SYSTEMS}
    assert per["bagpipe"] == 4  # 2 lookaheads x 2 networks
    assert per["sync"] == 2  # the lookahead does not multiply sync
    for p in plan:
        if p.config.system == "sync":
            assert p.config.lookahead == 16 and p.config.cache_rows is None  # reset to defaults
    assert len({p.key for p in plan}) == len(plan)


def test_toml_config(tmp_path, tiny_dataset):
    p = tmp_path / "b.toml"
    p.write_text(f'name = "t"\nsystems = ["sync", "bagpipe"]\n[[datasets]]\npath = "{tiny_dataset}"\n'
                 '[base]\niterations = 6\nwarmup = 1\n[matrix]\nnet = [{label = "none"}, '
                 '{label = "slow", net_gbps = 0.5}]\n')
    cfg = load_bench_config(p)
    assert len(plan_runs(cfg)) == 4


@pytest.mark.parametrize("name", ["quick", "paper", "criteo-kaggle", "distributed"])
def test_shipped_configs_are_valid(name):
    cfg = load_bench_config(BENCHMARKS / f"{name}.yaml")
    plan = plan_runs(cfg)
    assert plan and cfg.repeat >= 1
    if name == "distributed":
        assert {p.config.system for p in plan} == set(SYSTEMS)
        assert all(p.config.transport == "torch" and p.config.trainers == 2 for p in plan)
    if name == "quick":
        assert {"sync", "bagpipe"} <= {p.config.system for p in plan}
        assert any(p.config.net_gbps for p in plan) and any(p.config.net_gbps is None for p in plan)


def test_bench_help_has_example():
    r = CliRunner().invoke(cli, ["bench", "--help"])
    assert r.exit_code == 0 and "Example" in r.output


def test_unknown_key_error_names_file(tmp_path):
    with pytest.raises(ConfigError, match="x.yaml: unknown key 'base.lookahed'"):
        parse_bench_config({"datasets": ["d"], "systems": ["sync"], "base": {"lookahed": 3}}, "x.yaml")


def test_one_table_of_short_names_with_no_name_twice():
    """bench's run ids and labels, the report's variants and simulate's labels share `SHORT`:
    `K` is the servers (N trainers, K servers), not also slipstream's snapshot interval."""
    import pandas as pd

    from bagpipe_cli.bench.plan import SHORT, train_fields, value_label
    from bagpipe_cli.engine.registry import SYSTEMS as REGISTRY
    from bagpipe_cli.report.analysis import annotate

    assert len(set(SHORT.values())) == len(SHORT), SHORT
    # every name is a setting's, and no short name is another setting's own name
    assert set(SHORT) <= set(train_fields()) and not set(SHORT.values()) & set(train_fields())
    assert value_label("servers", 2) == "K2" and value_label("snapshot_every", 5) == "snap5"
    system = next(n for n, s in REGISTRY.items() if "snapshot_every" in s.reads)
    runs = pd.DataFrame({"system": [system] * 2, "snapshot_every": [5, 10], "servers": [2, 2]})
    assert annotate(runs)["variant"].tolist() == [f"{system} snap=5", f"{system} snap=10"]

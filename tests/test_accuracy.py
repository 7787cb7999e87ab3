"""Accuracy over time: --eval-every's evaluations (metrics_eval.csv), time to a target AUC,
and the report's figures of them; neither tracing nor evaluating changes a parameter."""

import shutil

import pandas as pd
import pytest
from click.testing import CliRunner
from helpers import assert_same_parameters, one_per_volumes

from bagpipe_cli.bench.config import parse_bench_config
from bagpipe_cli.bench.runner import run_bench
from bagpipe_cli.cli import cli
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.engine.trainer.evaluation import accuracy_summary, time_to_target
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.report import ReportConfig, build_report
from bagpipe_cli.results import load_runs, open_run

PNG = b"\x89PNG\r\n\x1a\n"


# One system per traffic model that keeps copies of rows to flush (sync and local keep none).
CACHING = [s for s in one_per_volumes() if spec(s).reads]


@pytest.mark.parametrize("system", CACHING)
def test_tracing_and_evaluating_change_no_parameter(tiny_dataset, system):
    """Evaluations settle pending sums and flush write-backs mid-round (every 3 iterations,
    rounds of 2): bitwise the parameters and losses of the run that did neither. A system
    exact only at some setting (het) runs away from it."""
    inexact = spec(system).exact_only_if
    extra = {inexact[0]: inexact[1] + 2} if inexact else {}
    kw = dict(data=str(tiny_dataset), batch_size=256, iterations=20, lookahead=8,
              optimizer="adagrad", trainers=2, servers=2, eval_rows=1000, seed=3,
              dense_optimizer="adam", dense_lr=0.01, net_gbps=2.0, **extra)
    plain = train(TrainConfig(system=system, **kw))
    both = train(TrainConfig(system=system, trace="t.json", eval_every=3, **kw))
    assert_same_parameters(plain, both)
    assert both.evals["iteration"].tolist() == [3, 6, 9, 12, 15, 18]
    assert both.trace is not None and plain.trace is None and plain.evals is None
    if spec(system).is_exact(TrainConfig(system=system, **kw)):
        assert_same_parameters(train(TrainConfig(system="sync", **kw)), both)


def test_last_evaluation_equals_the_summary(tiny_dataset, tmp_path):
    args = ["train", str(tiny_dataset), "--batch-size", "256", "--iterations", "20", "--lookahead",
            "8", "--trainers", "2", "--optimizer", "adagrad", "--lr", "0.05", "--eval-rows", "2000"]
    r = CliRunner().invoke(cli, [*args, "--eval-every", "5", "--target-auc", "0.55",
                                 "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    run = open_run(tmp_path / "a")  # metrics_eval.csv read and checked through results
    e, s = run.evals, run.summary
    assert e.columns.tolist() == ["iteration", "wall_s", "auc", "logloss"]
    assert e["iteration"].tolist() == [5, 10, 15, 20] and s["evaluations"] == 4
    # The last evaluation (after iteration 20: the tables' true values with the cache's rows
    # laid over the servers') is the final evaluation of the run, to the last bit.
    assert e["auc"].iloc[-1] == s["eval_auc"] and e["logloss"].iloc[-1] == s["eval_logloss"]
    assert e["wall_s"].is_monotonic_increasing and e["wall_s"].iloc[-1] <= s["wall_s"]
    assert s["eval_s"] > 0 and s["best_eval_auc"] == e["auc"].max()
    assert (s["time_to_target_s"], s["iterations_to_target"]) == time_to_target(e, 0.55)
    assert "time to AUC 0.55" in r.output
    r = CliRunner().invoke(cli, [*args, "--eval-every", "6", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    b = open_run(tmp_path / "b")
    assert b.evals["iteration"].tolist() == [6, 12, 18] and b.summary["target_auc"] is None
    assert b.evals["auc"].iloc[-1] != b.summary["eval_auc"]  # 18 is not the end
    assert open_run(tmp_path / "a").evals is not None
    plain = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "c")])
    assert plain.exit_code == 0 and open_run(tmp_path / "c").evals is None


def test_time_to_target_on_a_hand_made_curve():
    e = pd.DataFrame({"iteration": [40, 10, 20, 30], "wall_s": [4.2, 1.0, 2.5, 3.0],
                      "auc": [0.75, 0.6, 0.7, 0.69], "logloss": [0.4, 0.6, 0.5, 0.5]})
    assert time_to_target(e, 0.7) == (2.5, 20)  # reaching it exactly counts
    assert time_to_target(e, 0.72) == (4.2, 40)  # the first evaluation above it, not interpolated
    assert time_to_target(e, 0.6) == (1.0, 10)  # in iteration order, whatever the row order
    assert time_to_target(e, 0.8) is None and time_to_target(e, None) is None
    s = accuracy_summary(e, 0.72, 1.5)
    assert s == {"evaluations": 4, "eval_s": 1.5, "best_eval_auc": 0.75, "target_auc": 0.72,
                 "time_to_target_s": 4.2, "iterations_to_target": 40}
    assert accuracy_summary(None, None, 0.0)["best_eval_auc"] is None


@pytest.mark.parametrize("extra, option", [({"target_auc": 0.7}, "--eval-every"),
                                           ({"target_auc": 1.5, "eval_every": 2}, "--target-auc")])
def test_bad_accuracy_options(tiny_dataset, extra, option):
    with pytest.raises(ConfigError, match=option):
        TrainConfig(data=str(tiny_dataset), **extra)


BENCH = {
    "name": "acc", "datasets": [], "models": ["dlrm"], "trace": True, "profile": False,
    "systems": ["sync", "bagpipe", {"name": "het", "staleness": [0, 4]}], "repeat": 1,
    "base": {"batch_size": 512, "iterations": 24, "warmup": 4, "lookahead": 8,
             "optimizer": "adagrad", "lr": 0.05, "eval_rows": 2000, "eval_every": 6,
             "target_auc": 0.6, "net_gbps": 0.2, "net_latency_us": 50},
}


@pytest.fixture(scope="module")
def bench(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("acc") / "bench"
    cfg = parse_bench_config({**BENCH, "datasets": [{"name": "tiny", "path": str(tiny_dataset)}]})
    run_bench(cfg, out)
    return out


def test_report_draws_the_timeline_and_accuracy_over_time(bench, tmp_path):
    for run in (bench / "runs").iterdir():
        assert (run / "trace.json").is_file() and (run / "metrics_eval.csv").is_file()
    rep = build_report(ReportConfig(results=(bench,), out=tmp_path / "rep", formats=("png", "md")))
    for name in ("timeline", "overlap", "auc"):
        assert name in rep.figures
        assert (rep.out / f"{name}.png").read_bytes()[:8] == PNG
    acc = pd.read_csv(rep.out / "accuracy.csv")
    assert acc["variant"].tolist() == ["sync", "bagpipe", "het s=0", "het s=4"]
    runs = load_runs(bench).runs.set_index("system")
    sync_t = runs.loc["sync", "time_to_target_s"]
    bag = acc[acc["variant"] == "bagpipe"].iloc[0]
    assert bag["time_to_target_s"] == pytest.approx(runs.loc["bagpipe", "time_to_target_s"])
    assert bag["tta_speedup"] == pytest.approx(sync_t / bag["time_to_target_s"])
    assert acc[acc["variant"] == "sync"].iloc[0]["tta_speedup"] == pytest.approx(1.0)
    assert any("bagpipe, het s=0 equal sync's at every evaluation" in n for n in rep.notes)
    page = (rep.out / "report.md").read_text()
    assert "Accuracy and time to target" in page and "timeline.png" in page
    overlap = pd.read_csv(rep.out / "overlap.csv").set_index("variant")["overlap"]
    assert overlap["bagpipe"] > overlap["sync"]


def test_report_says_when_an_exact_curve_differs_from_sync(bench, tmp_path):
    copy = tmp_path / "bench"
    shutil.copytree(bench, copy)
    path = next((copy / "runs").glob("bagpipe-*")) / "metrics_eval.csv"
    e = pd.read_csv(path)
    e.loc[1, "auc"] += 0.01
    e.to_csv(path, index=False)
    rep = build_report(ReportConfig(results=(copy,), out=tmp_path / "rep", formats=("md",)))
    assert any("bagpipe (max |ΔAUC| 0.01) differs from sync's" in n for n in rep.notes)


def test_damaged_metrics_eval_skips_the_run(bench, tmp_path):
    copy = tmp_path / "bench"
    shutil.copytree(bench, copy)
    path = next((copy / "runs").glob("het-*")) / "metrics_eval.csv"
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")  # one row short
    res = load_runs(copy)
    assert len(res.runs) == 3 and len(res.skipped) == 1
    assert "metrics_eval.csv" in res.skipped[0].reason and "evaluations" in res.skipped[0].reason


@pytest.mark.slow
def test_procs_evaluations_equal_in_process(tiny_dataset, tmp_path):
    """Over torch.distributed rank 0 gathers the true tables as a checkpoint does (trainer
    0's resident rows over the servers' shards) and evaluates them: bitwise the in-process
    evaluations, every one."""
    from helpers import run_cli

    kw = dict(batch_size=256, iterations=16, lookahead=8, optimizer="adagrad", trainers=2,
              servers=2, eval_rows=2000, eval_every=3, seed=5)
    args = ["train", str(tiny_dataset), "--procs", "5", "--out", str(tmp_path / "d")]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    p = run_cli(*args)
    assert p.returncode == 0, p.stderr[-2000:]
    dist = open_run(tmp_path / "d")
    inproc = train(TrainConfig(data=str(tiny_dataset), **kw))
    assert dist.evals["iteration"].tolist() == [3, 6, 9, 12, 15]
    assert dist.evals["auc"].tolist() == inproc.evals["auc"].tolist()
    assert dist.evals["logloss"].tolist() == inproc.evals["logloss"].tolist()
    assert dist.summary["evaluations"] == 5 and dist.summary["eval_s"] > 0

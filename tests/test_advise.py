"""`bagpipe advise`: one answer for the user's cluster (bagpipe_cli/advise/): the verdict
agrees with the model's predictions it comes from, names what it measured, and the scaled
log keeps the tables' skew; bad input is one line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from helpers import run_cli

from bagpipe_cli.advise.scale import scale_ids, write_scaled
from bagpipe_cli.advise.verdict import confidence, ranges, verdict
from bagpipe_cli.data.format import open_dataset


def test_advise_names_the_fastest_of_the_model_and_writes_its_page(tiny_dataset, tmp_path):
    """On the log twice as large (--scale 2)."""
    out, scaled = tmp_path / "advice", tmp_path / "x2"
    r = run_cli("advise", str(tiny_dataset), "--trainers", "2", "--net-gbps", "1",
                "--systems", "sync,bagpipe,local", "--iterations", "6", "--warmup", "1",
                "--scale", "2", "--scaled-data", str(scaled), "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert open_dataset(scaled).rows == 2 * open_dataset(tiny_dataset).rows
    a = json.loads((out / "advice.json").read_text())
    preds = pd.read_csv(out / "simulation" / "predictions.csv").set_index("system")
    assert set(preds.index) == {"sync", "bagpipe", "local"}
    assert a["fastest"] == preds["mean_ms"].idxmin()
    assert a["speedup_over_sync"] == pytest.approx(preds.loc["sync", "mean_ms"] / preds["mean_ms"].min())
    runs = pd.read_csv(out / "bench" / "index.csv")
    assert sorted(runs["status"]) == ["done"] * 6  # each system on one trainer and on two
    assert a["details"]["validated"]["runs"] == 6
    assert a["verdict"][0] in r.stdout and "Confidence:" in r.stdout
    page = (out / "advice.md").read_text()
    assert "simulation/speedup_vs_trainers.png" in page and (out / "simulation" / "speedup_vs_trainers.png").is_file()
    again = run_cli("advise", str(tiny_dataset), "--trainers", "2", "--net-gbps", "1", "--out", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr and len(again.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,says", [
    (["--trainers", "3", "--batch-size", "100"], "not divisible by --trainers 3"),
    (["--trainers", "2", "--net-gbps", "0"], "--net-gbps"),
    (["--trainers", "2", "--scale", "20000"], "--scale 20000"),
    (["--trainers", "2", "--systems", "sync,slipstream"], "slipstream has no performance model"),
    (["--trainers", "2", "--systems", "nosuch"], "unknown system 'nosuch'"),
])
def test_bad_settings_are_one_line(tiny_dataset, tmp_path, args, says):
    args = args if "--net-gbps" in args else [*args, "--net-gbps", "1"]
    r = run_cli("advise", str(tiny_dataset), *args, "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "a").exists()


def test_the_scaled_log_has_k_siblings_of_each_id_and_the_same_samples(tiny_dataset, tmp_path):
    k = 3
    out = write_scaled(tiny_dataset, k, tmp_path / "x3")
    a, b = open_dataset(tiny_dataset), open_dataset(out)
    assert b.rows == k * a.rows
    assert b.meta.cardinalities == [(c - 1) * k + 1 for c in a.meta.cardinalities]
    for t in range(a.meta.num_tables):
        ids, big = np.asarray(a.sparse(t)), np.asarray(b.sparse(t)).reshape(k, -1)
        back = np.where(big > 0, (big - 1) // k + 1, 0)
        assert (back == ids[None]).all()  # every pass is the log, each id one of its siblings
        assert set(np.unique((big[big > 0] - 1) % k)) == set(range(k))
    assert (np.asarray(b.dense).reshape(k, a.rows, -1) == np.asarray(a.dense)[None]).all()
    assert (np.asarray(b.labels).reshape(k, -1) == np.asarray(a.labels)[None]).all()


def test_a_hot_id_keeps_its_share_spread_over_its_siblings():
    rng = np.random.default_rng(0)
    ids = np.repeat(np.array([0, 1, 2, 3]), [10, 6000, 3000, 1000])
    out = np.concatenate([scale_ids(ids, 4, rng) for _ in range(4)])
    counts = np.bincount(out, minlength=13)
    assert counts[0] == 40  # missing stays missing
    assert counts[1:5].sum() == 4 * 6000 and abs(counts[1:5] / 6000 - 1).max() < 0.1


def test_ranges_say_where_the_answer_changes():
    assert ranges([(1, "local"), (2, "local"), (4, "bagpipe"), (8, "bagpipe"), (16, "sharded")],
                  "trainers", "trainer count") == "local up to 2 trainers, bagpipe from 4 to 8, sharded from 16"
    assert ranges([(1, "bagpipe"), (64, "bagpipe")], "trainers", "trainer count") == \
        "bagpipe at every trainer count from 1 to 64 trainers"


def test_confidence_is_the_share_of_runs_within_the_tolerance():
    assert confidence([0.1, -0.05, 0.3, 0.0, 0.01], 0.2)[0] == "high"
    assert confidence([0.1, -0.5, 0.3, 0.0], 0.2)[0] == "medium"
    assert confidence([0.5, float("nan")], 0.2)[0] == "low"
    assert confidence([], 0.2)[0] == "unknown"


def _pred(system, mean, speedup):
    return SimpleNamespace(system=system, mean_ms=mean, speedup=speedup, compute_ms=mean / 2,
                           exposed_fetch_ms=0.0, exposed_sync_ms=mean / 2, exposed_plan_ms=0.0)


def test_a_lead_within_the_models_error_has_no_headline_multiplier():
    sweep = pd.DataFrame([{"sweep": "trainers", "system": "bagpipe", "trainers": 4, "net_gbps": 10,
                           "mean_ms": 9.0, "speedup": 2.0}])
    preds = [_pred("bagpipe", 9.0, 2.0), _pred("fae", 9.5, 1.9), _pred("sync", 18.0, 1.0)]
    v = verdict(preds, sweep, [0.10, -0.12, 0.08], 0.2, 4, 10)
    assert v.within_error and v.fastest == "bagpipe" and v.runner_up == "fae"
    assert "within the model's error" in v.lines[0] and "x sync" not in v.lines[0]
    clear = verdict(preds, sweep, [0.01, -0.02, 0.01], 0.2, 4, 10)
    assert not clear.within_error and "2.00x sync" in clear.lines[0]


@pytest.mark.extended
def test_a_scaled_log_is_written_once_and_reused(tiny_dataset, tmp_path):
    scaled = tmp_path / "x2"
    args = ["advise", str(tiny_dataset), "--trainers", "2", "--net-gbps", "1", "--systems", "sync",
            "--iterations", "4", "--warmup", "1", "--scale", "2", "--scaled-data", str(scaled)]
    assert run_cli(*args, "--out", str(tmp_path / "a1")).returncode == 0
    written = (scaled / "meta.json").stat().st_mtime_ns
    r2 = run_cli(*args, "--out", str(tmp_path / "a2"))
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert (scaled / "meta.json").stat().st_mtime_ns == written  # reused, not written again
    assert json.loads((tmp_path / "a2" / "advice.json").read_text())["data"] == str(scaled)


def test_one_trainer_is_singular():
    assert ranges([(1, "local"), (2, "bagpipe")], "trainers", "trainer count") == "local at 1 trainer, bagpipe from 2"


def test_without_sync_the_verdict_names_no_speed_up_over_it():
    sweep = pd.DataFrame([{"sweep": "trainers", "system": "bagpipe", "trainers": 2, "net_gbps": 1,
                           "mean_ms": 9.0, "speedup": float("nan")}])
    v = verdict([_pred("bagpipe", 9.0, float("nan")), _pred("local", 12.0, float("nan"))], sweep,
                [0.01], 0.2, 2, 1)
    assert v.lines[0] == "On 2 trainers at 1 Gbit/s: bagpipe is fastest, 1.33x the best other (local)."


def test_a_cluster_file_gives_only_its_cluster_and_network():
    """The paper's scenario file: its servers, links, latency and collective are taken; its
    dataset, batch, model, lookahead and fixed compute are not (the runs measure those)."""
    from pathlib import Path

    from bagpipe_cli.advise import cluster_part
    from bagpipe_cli.simulate.cluster import load_cluster

    cf = cluster_part(load_cluster(Path(__file__).resolve().parents[1] / "benchmarks" / "paper-scenario.yaml"))
    assert {"servers", "trainer_gbps", "net_latency_us", "collective", "runtime"} <= set(cf.settings)
    assert not {"data", "batch_size", "emb_dim", "lookahead", "compute_ms", "systems"} & set(cf.settings)
    assert cf.synth is None

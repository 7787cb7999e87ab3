"""The systems that came after Bagpipe and beside it: prefetch (one batch ahead), hotline
(popular samples first) and slipstream (stale samples skipped), each against its definition."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from helpers import ROUNDING_TOLERANCE, assert_same_parameters, max_difference, run_cli

from bagpipe_cli.data import open_dataset
from bagpipe_cli.data.format import table_offsets
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.systems.slipstream import threshold
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.models import MODELS
from bagpipe_cli.profile import ProfileConfig, run_profile

KW = dict(batch_size=256, iterations=30, optimizer="adagrad", servers=2, seed=3,
          dense_optimizer="adam", dense_lr=0.01, eval_rows=2000)


def _batches(data, batch, n):
    ds = open_dataset(data)
    off = table_offsets(ds.meta.cardinalities)
    return [set((ds.sparse_block(b * batch, (b + 1) * batch) + off).ravel().tolist()) for b in range(n)]


@pytest.mark.parametrize("trainers", [2])
def test_prefetch_equals_sync_and_fetches_what_the_last_batch_did_not_use(tiny_dataset, trainers):
    kw = dict(data=str(tiny_dataset), trainers=trainers, **KW)
    sync, pre = train(TrainConfig(system="sync", **kw)), train(TrainConfig(system="prefetch", **kw))
    assert_same_parameters(sync, pre)
    sets = _batches(tiny_dataset, 256, 30)
    expected = [len(s - (sets[b - 1] if b else set())) for b, s in enumerate(sets)]
    assert pre.metrics["rows_fetched"].tolist() == expected
    assert pre.summary["rows_fetched"] < sync.summary["rows_fetched"]
    assert pre.metrics["sync_now"].tolist() == [len(s) for s in sets]  # no LRPP: every row summed


def test_profile_lists_prefetch_fetches_per_batch_as_train_fetches(tiny_dataset):
    run = train(TrainConfig(data=str(tiny_dataset), system="prefetch", **KW))
    prof = run_profile(ProfileConfig(data=str(tiny_dataset), batch_size=256, lookaheads=(5,),
                                     policies=("prefetch",)))
    (res,) = [p for p in prof.policies if p.policy == "prefetch"]
    assert res.lookahead == 1
    assert run.metrics["rows_fetched"].tolist() == res.fetched_per_batch[:30].tolist()


@pytest.mark.parametrize("trainers,model", [(1, "dlrm"), (2, "dcn")])
def test_hotline_equals_sync_up_to_the_order_of_summation(tiny_dataset, trainers, model):
    kw = dict(data=str(tiny_dataset), trainers=trainers, model=model, **KW)
    sync, fae = train(TrainConfig(system="sync", **kw)), train(TrainConfig(system="fae", **kw))
    hot = train(TrainConfig(system="hotline", **kw))
    worst = max_difference(sync, hot)
    print(f"hotline vs sync, {trainers} trainer(s), {model}: largest parameter difference {worst:.3g}")
    assert worst < ROUNDING_TOLERANCE
    # The same hot set as fae: the same rows fetched, iteration by iteration.
    assert hot.metrics["rows_fetched"].tolist() == fae.metrics["rows_fetched"].tolist()
    popular = hot.metrics["popular_samples"]
    assert popular.iloc[0] == 0  # nothing is hot before the first batch's rows arrive
    assert 0 < popular.iloc[1:].min() and popular.iloc[1:].max() < 256  # a real split
    assert hot.summary["popular_share"] == pytest.approx(popular.sum() / (256 * 30))
    assert hot.summary["fetch_overlap_s"] > 0 and fae.summary["popular_share"] is None


def test_a_sample_is_popular_exactly_when_every_row_it_reads_is_hot(tiny_dataset):
    """fae's definition (README): the R most-accessed rows of the run (ties: the smaller key)
    are hot, loaded with the first batch; from then on a sample is popular iff all its rows are."""
    run = train(TrainConfig(data=str(tiny_dataset), system="hotline", trainers=2, **KW))
    ds = open_dataset(tiny_dataset)
    keys = ds.sparse_block(0, 256 * 30) + table_offsets(ds.meta.cardinalities)
    rows, counts = np.unique(keys, return_counts=True)
    order = np.lexsort((rows, -counts))  # by count, descending; ties: the smaller key
    hot = rows[order[:run.summary["cache_rows"]]]
    popular = np.isin(keys, hot).all(axis=1).reshape(30, 256).sum(axis=1)
    popular[0] = 0  # the hot rows arrive with the first batch
    assert run.metrics["popular_samples"].tolist() == popular.tolist()


def test_threshold_skips_the_drop_target_share():
    kth = np.array([0.5, 0.1, np.inf, 0.3, 0.2, 0.4, 0.6, np.inf, 0.7, 0.8])
    assert threshold(kth, 0.0) == 0.0
    t = threshold(kth, 0.3)
    assert (kth < t).sum() == 3 and t == 0.4
    t = threshold(kth, 1.0)  # every sample whose rows have a known drift
    assert (kth < t).sum() == 8
    ties = np.array([0.2, 0.2, 0.2, 0.5])
    assert (ties < threshold(ties, 0.5)).sum() == 3  # ties go together
    assert threshold(np.full(4, np.inf), 0.5) == 0.0


def test_slipstream_at_drop_target_zero_is_fae_bitwise(tiny_dataset):
    kw = dict(data=str(tiny_dataset), trainers=2, snapshot_every=4, **KW)
    fae = train(TrainConfig(system="fae", **kw))
    slip = train(TrainConfig(system="slipstream", drop_target=0.0, **kw))
    assert_same_parameters(fae, slip)
    assert slip.summary["samples_skipped"] == 0 and slip.summary["stale_thresholds"] is None


@pytest.mark.parametrize("model", ["wdl"])
def test_slipstream_skips_about_the_drop_target_and_records_each_threshold(tiny_dataset, model):
    K, D = 5, 0.25
    kw = dict(data=str(tiny_dataset), trainers=2, snapshot_every=K, model=model,
              **{**KW, "iterations": 40})
    slip = train(TrainConfig(system="slipstream", drop_target=D, **kw))
    m = slip.metrics
    # No drift is known before the second snapshot (after iteration 2K-1): nothing skipped.
    assert m["samples_skipped"][:2 * K].sum() == 0 and m["stale_threshold"][:2 * K].isna().all()
    # At each snapshot's first iteration T is set so that at least D of each trainer's
    # samples are skipped (ties can add more).
    firsts = m.iloc[2 * K::K]
    assert (firsts["samples_skipped"] >= math.ceil(D * 128) * 2).all()
    assert (firsts["samples_skipped"] <= 256 * 0.5).all()
    t = m["stale_threshold"][2 * K:]
    assert t.notna().all() and (t > 0).all()
    assert all(t.iloc[i] == t.iloc[i - i % K] for i in range(len(t)))  # held between snapshots
    s = slip.summary
    assert s["samples_skipped"] == int(m["samples_skipped"].sum()) > 0
    assert s["skipped_share"] == pytest.approx(s["samples_skipped"] / (256 * 40))
    assert [x["iteration"] for x in s["stale_thresholds"]][0] == 2 * K
    assert math.isfinite(slip.summary["final_loss"])


def test_slipstream_options_are_checked(tiny_dataset):
    kw = dict(data=str(tiny_dataset), system="slipstream")
    with pytest.raises(ConfigError, match=r"--drop-target must be in \[0, 1\]"):
        TrainConfig(drop_target=1.5, **kw)
    with pytest.raises(ConfigError, match=r"--stale-share must be in \(0, 1\]"):
        TrainConfig(stale_share=0, **kw)
    with pytest.raises(ConfigError, match="--snapshot-every must be >= 1"):
        TrainConfig(snapshot_every=0, **kw)
    with pytest.raises(ConfigError, match="cannot be resumed exactly"):
        TrainConfig(drop_target=0.2, checkpoint_every=5, **kw)
    TrainConfig(drop_target=0.0, checkpoint_every=5, **kw)  # fae's run: resumable
    TrainConfig(data=str(tiny_dataset), system="hotline", checkpoint_every=5)  # deterministic


@pytest.mark.slow
def test_slipstream_skipping_over_procs_equals_in_process(tiny_dataset, tmp_path):
    """Each trainer rank decides what to skip from its own samples as the in-process runtime
    does for its slice: the same bits (hotline, and slipstream at its default D = 0, are in
    test_distributed's test of every system)."""
    args = ["--batch-size", "256", "--iterations", "12", "--trainers", "2", "--servers", "1",
            "--optimizer", "adagrad", "--seed", "1", "--eval-rows", "1000", "--procs", "4"]
    kw = dict(batch_size=256, iterations=12, trainers=2, servers=1, optimizer="adagrad", seed=1,
              eval_rows=1000)
    for system, extra in (("slipstream", {"drop_target": 0.3, "snapshot_every": 3}),):
        opts = [x for k, v in extra.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        r = run_cli("train", str(tiny_dataset), "--system", system, *args, *opts,
                    "--out", str(tmp_path / system), "--save-model", str(tmp_path / f"{system}.pt"))
        assert r.returncode == 0, r.stderr[-2000:]
        inproc = train(TrainConfig(data=str(tiny_dataset), system=system, **kw, **extra))
        assert_same_parameters(tmp_path / f"{system}.pt", inproc)
        m = pd.read_csv(tmp_path / system / "metrics.csv")
        for col in ("samples_skipped", "popular_samples", "stale_threshold"):
            assert m[col].fillna(-1).tolist() == inproc.metrics[col].fillna(-1).tolist(), col
        s = json.loads((tmp_path / system / "summary.json").read_text())
        assert s["samples_skipped"] == inproc.summary["samples_skipped"] > 0


@pytest.mark.parametrize("system,extra", [("hotline", {}),
                                          ("slipstream", {"drop_target": 0.3, "snapshot_every": 3})])
def test_tracing_and_evaluating_change_no_parameter_of_the_phased_systems(tiny_dataset, system, extra):
    """Evaluations every 4 iterations, a trace and an emulated network: the same bits."""
    kw = dict(data=str(tiny_dataset), system=system, trainers=2, net_gbps=2.0, **extra,
              **{**KW, "iterations": 16})
    plain = train(TrainConfig(**kw))
    both = train(TrainConfig(trace="t.json", eval_every=4, **kw))
    assert_same_parameters(plain, both)
    assert both.evals["iteration"].tolist() == [4, 8, 12, 16]
    names = {e.get("name") for e in both.trace["traceEvents"]}
    if system == "hotline":
        assert "fetch issued" in names


@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_new_system_trains_every_model(tiny_dataset, model):
    """prefetch = sync bitwise, hotline = sync up to rounding, slipstream skips, on every model."""
    kw = dict(data=str(tiny_dataset), model=model, trainers=2, **{**KW, "iterations": 8})
    sync = train(TrainConfig(system="sync", **kw))
    assert_same_parameters(sync, train(TrainConfig(system="prefetch", **kw)))
    assert max_difference(sync, train(TrainConfig(system="hotline", **kw))) < ROUNDING_TOLERANCE
    slip = train(TrainConfig(system="slipstream", drop_target=0.3, snapshot_every=2, **kw))
    assert slip.summary["samples_skipped"] > 0 and math.isfinite(slip.summary["final_loss"])


def test_the_registry_says_what_each_new_system_trains_against_sync():
    from bagpipe_cli.engine.registry import spec
    from bagpipe_cli.report.accuracy import fidelity

    assert spec("prefetch").fidelity(TrainConfig(data="d", system="prefetch")) == "exact"
    assert spec("hotline").fidelity(TrainConfig(data="d", system="hotline")) == "rounding"
    assert spec("slipstream").fidelity(TrainConfig(data="d", system="slipstream")) == "exact"  # D = 0
    assert spec("slipstream").fidelity(TrainConfig(data="d", system="slipstream", drop_target=0.1)) == "approximate"
    row = pd.Series({"system": "slipstream", "drop_target": 0.2, "staleness": 0})
    assert fidelity(row) == "approximate" and fidelity(pd.Series({"system": "nope"})) == ""


def test_every_system_setting_has_a_short_name_in_the_report():
    from bagpipe_cli.bench.plan import SHORT
    from bagpipe_cli.engine.registry import SYSTEM_SETTINGS

    assert set(SYSTEM_SETTINGS) <= set(SHORT)  # "slipstream D=0.1" in every table

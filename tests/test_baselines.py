"""Baselines in the same engine: lru, lfu, fae, het, local (issue 6)."""

import pytest
import torch
from click.testing import CliRunner
from helpers import assert_same_parameters, policy_replay

from bagpipe_cli.cli import cli
from bagpipe_cli.data import open_dataset
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.registry import ENGINE_SYSTEMS, REFERENCE, spec
from bagpipe_cli.profile import batch_trace, simulate_fae

EXACT = [s for s in ENGINE_SYSTEMS if spec(s).exact and s != REFERENCE]  # enrolled from the registry
# The fixed-capacity caches, each following a cache policy (lru's, ...; hotline's is fae's); not
# sharded-hot, whose capacity is its hot set's (no cache).
CAPACITY_SYSTEMS = [s for s in ENGINE_SYSTEMS if spec(s).capacity_from_peak and spec(s).replicated]


@pytest.mark.parametrize("optimizer,trainers,servers", [("sgd", 1, 1), ("adagrad", 2, 3)])
def test_every_exact_system_equals_sync(tiny_dataset, optimizer, trainers, servers):
    """Every system the registry calls exact (at its exact settings: het's staleness 0) gives
    bitwise the parameters and loss curve of sync; a new system is enrolled by its entry."""
    kw = dict(data=str(tiny_dataset), batch_size=256, iterations=30, lookahead=4, optimizer=optimizer,
              trainers=trainers, servers=servers, eval_rows=2000, dense_optimizer="adam", dense_lr=0.01)
    sync = train(TrainConfig(system=REFERENCE, **kw))
    assert {"bagpipe", "lru", "lfu", "fae", "het", "local"} <= set(EXACT)
    for system in EXACT:
        s = spec(system)
        r = train(TrainConfig(system=system, **kw, **s.exact_settings()))
        assert_same_parameters(sync, r)
        if "cache_rows" in s.reads and s.replicated:
            # a cache's every fetched row goes back to the servers, during training or at its
            # end, once (rows_fetched counts each trainer's fetch of it)
            sm = r.summary
            assert sm["rows_written_back"] + sm["rows_written_back_at_end"] == sm["rows_fetched_once"]
            assert 0 < sm["rows_fetched"] < sync.summary["rows_fetched"]
    assert train(TrainConfig(system="local", **kw)).summary["rows_fetched"] == 0


def test_baselines_below_their_default_capacity_still_equal_sync(tiny_dataset):
    kw = dict(data=str(tiny_dataset), batch_size=256, iterations=30, lookahead=4, eval_rows=2000)
    sync = train(TrainConfig(system="sync", **kw))
    for system in (s for s in CAPACITY_SYSTEMS if spec(s).is_exact(TrainConfig(system=s, **kw))):
        rows = {"fae": 800}.get(spec(system).policy, 2500)
        assert_same_parameters(sync, train(TrainConfig(system=system, cache_rows=rows, **kw)))


@pytest.mark.parametrize("system", CAPACITY_SYSTEMS)
def test_fetch_counts_equal_profile(tiny_dataset, system):
    """A fixed-capacity system fetches what the profile's simulator of its policy says (a
    policy of its own: what its decisions say)."""
    B, eval_rows = 256, 20_000 - 70 * 256  # the run covers exactly the first 70 batches
    capacity = {"fae": 600}.get(spec(system).policy, 2000)  # a hot set well below the rows used
    r = train(TrainConfig(data=str(tiny_dataset), system=system, batch_size=B, iterations=70,
                          cache_rows=capacity, eval_rows=eval_rows))
    trace = batch_trace(open_dataset(tiny_dataset), B, rows=70 * B)
    fetched, _ = policy_replay(system, trace, capacity)
    assert r.metrics["rows_fetched"].tolist() == fetched
    assert r.summary["rows_fetched"] == sum(fetched)


def test_het_staleness_trades_accuracy_for_fetches(tiny_dataset):
    kw = dict(data=str(tiny_dataset), system="het", batch_size=256, iterations=40, trainers=2,
              optimizer="adagrad", eval_rows=2000)
    exact = train(TrainConfig(staleness=0, **kw))
    stale = train(TrainConfig(staleness=4, **kw))
    assert exact.metrics["stale_reads"].sum() == 0
    assert stale.metrics["stale_reads"].sum() > 0
    assert stale.summary["rows_fetched"] < exact.summary["rows_fetched"]
    assert not torch.equal(stale.tables[0], exact.tables[0])
    assert stale.summary["eval_auc"] > 0.5  # still learns


def test_baseline_cli_and_bad_capacity(tiny_dataset, tmp_path):
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--system", "lru", "--batch-size", "256",
                                 "--iterations", "5", "--cache-rows", "10", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--cache-rows" in r.output and not (tmp_path / "o").exists()
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--system", "het", "--staleness", "-1",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--staleness" in r.output
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--system", "fae", "--batch-size", "256",
                                 "--iterations", "6", "--eval-rows", "1000", "--out", str(tmp_path / "f")])
    assert r.exit_code == 0, r.output


def test_fae_hot_set_from_a_sample(tiny_dataset):
    """--hot-sample: FAE picks its hot rows from the first part of the run; still exact."""
    from bagpipe_cli.policies.simulators import trace_row_counts

    B, n, R = 256, 40, 600
    kw = dict(data=str(tiny_dataset), batch_size=B, iterations=n, eval_rows=20_000 - n * B)
    sync = train(TrainConfig(system="sync", **kw))
    r = train(TrainConfig(system="fae", cache_rows=R, hot_sample=0.25, **kw))
    assert_same_parameters(sync, r)
    tr = batch_trace(open_dataset(tiny_dataset), B, rows=n * B)
    sample = batch_trace(open_dataset(tiny_dataset), B, rows=10 * B)  # ceil(0.25 * 40) batches
    expected = simulate_fae(tr, R, row_counts=trace_row_counts(sample))
    assert r.metrics["rows_fetched"].tolist() == expected.fetched_per_batch.tolist()
    full = simulate_fae(tr, R)
    assert expected.fetched_rows != full.fetched_rows  # the sample's hot set is not the run's

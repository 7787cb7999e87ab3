"""sharded and sharded-hot: the tables row-wise across the trainers (sharded-hot: its hot
rows replicated), bitwise sync's parameters.

The registry-driven tests enrol it too (in-process and over torch.distributed at 2 trainers,
checkpoint and resume, the memory estimate). Here: more trainers over `--procs`, every
model, a real log, and what the all-to-alls move.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from helpers import assert_same_parameters

from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.systems import sharded_hot
from bagpipe_cli.engine.systems.sharded import owner, requests
from bagpipe_cli.engine.systems.sharded_hot import pays, rows_that_pay
from bagpipe_cli.models import MODELS

KW = dict(batch_size=256, iterations=8, eval_rows=2000, servers=2, optimizer="adagrad")


def test_requests_go_to_the_rows_owners_and_never_to_oneself():
    keys = np.array([0, 1, 2, 5, 6, 7, 9])
    req = requests(keys, 3, me=1)
    assert [r.tolist() for r in req] == [[0, 6, 9], [], [2, 5]]
    assert (owner(np.concatenate(req), 3) != 1).all()


@pytest.mark.parametrize("system,trainers", [pytest.param("sharded", 4, marks=pytest.mark.extended),
                                            pytest.param("sharded-hot", 4, marks=pytest.mark.extended),
                                            pytest.param("sharded", 8, marks=pytest.mark.extended),
                                            pytest.param("sharded-hot", 8, marks=pytest.mark.extended)])
def test_more_trainers_over_procs_equal_sync(tiny_dataset, system, trainers):
    kw = dict(data=str(tiny_dataset), trainers=trainers, **KW)
    sync = train(TrainConfig(system="sync", **kw))
    inproc = train(TrainConfig(system=system, **kw))
    procs = train(TrainConfig(system=system, transport="torch", procs=1 + 2 + trainers, **kw))
    assert_same_parameters(sync, inproc)
    assert_same_parameters(sync, procs)
    # every row a trainer's samples read from another trainer's shard came through the
    # all-to-all: as many rows in both runtimes
    assert procs.metrics["rows_fetched"].tolist() == inproc.metrics["rows_fetched"].tolist()
    roles = procs.summary["roles"]
    sent = [roles[f"trainer{i}"]["collective_bytes_sent"] for i in range(trainers)]
    # in-process counts the busiest trainer's share of each all-to-all: no trainer sent more
    # than it, and the sums of the losses (a float a trainer) are the rest
    assert max(sent) <= inproc.summary["roles"]["trainers"]["collective_bytes_sent"] * 1.05


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.extended) for m in sorted(MODELS)])
def test_every_model_in_process_equals_sync(tiny_dataset, model):
    kw = dict(data=str(tiny_dataset), trainers=2, model=model, lr=0.01, dense_lr=0.001, **KW)
    sync = train(TrainConfig(system="sync", **kw))
    for system in ("sharded", "sharded-hot"):
        assert_same_parameters(sync, train(TrainConfig(system=system, **kw)))


@pytest.mark.extended  # make test's budget; the registry's tests run both over --procs
def test_a_real_log_over_procs_equals_sync(real_data, tmp_path):
    data = tmp_path / "criteo"
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "preprocess", "criteo",
                        str(real_data / "criteo_kaggle_train_head1999.tsv"), "--out", str(data)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    kw = dict(data=str(data), batch_size=100, iterations=10, trainers=2, servers=1, eval_rows=0)
    procs = train(TrainConfig(system="sharded", transport="torch", procs=4, **kw))
    assert_same_parameters(train(TrainConfig(system="sync", **kw)), procs)
    assert procs.summary["rows_fetched"] > 0


def test_the_hot_set_keeps_hot_rows_out_of_the_all_to_alls(tiny_dataset):
    """sharded-hot's all-to-alls carry only cold rows: of the rows a trainer reads from
    another's shard, the hot set (at 2 trainers nearly every row the other trainer reads:
    its sum moves a row a trainer, the all-to-alls a row and 4 bytes) takes most."""
    kw = dict(data=str(tiny_dataset), trainers=2, **KW)
    plain, hot = (train(TrainConfig(system=s, **kw)) for s in ("sharded", "sharded-hot"))
    assert 0 < hot.summary["rows_fetched"] < plain.summary["rows_fetched"] / 2


def test_one_trainer_over_procs_holds_every_row_and_equals_sync(tiny_dataset):
    """One trainer rank is every trainer, but holds no in-process servers: it fetches every
    row as its shard, and its all-to-alls are with itself alone. One torch thread in both
    runtimes (docs/architecture.md, "Which runs give the same bits": a trainer rank computes on
    its share of the cores, the in-process one on them all)."""
    kw = dict(data=str(tiny_dataset), trainers=1, threads=1, **{**KW, "servers": 1})
    procs = train(TrainConfig(system="sharded", transport="torch", procs=3, **kw))
    assert_same_parameters(train(TrainConfig(system="sync", **kw)), procs)
    assert procs.summary["rows_fetched"] == 0  # every row is its own


def test_the_hot_set_is_the_rows_whose_sum_costs_less_than_their_all_to_alls():
    """3 trainers, rows of 1 float (G = 4 B): a row pays when (8 + 2G) sum_b m_b > 2 (N-1) G
    n, i.e. 16 m > 16 n. Rows 0-2 are read by every trainer (m = 2): hot. Row 3 (trainer
    0's) is read by trainer 1 alone (m = 1): 16 = 16, the boundary, cold. Row 4 by its
    owner alone (m = 0): cold. Row 5, read by every trainer in the second batch, is past the
    profiled half (--hot-sample 0.5): cold."""
    first = np.array([0, 1, 2, 0, 1] + [0, 1, 2, 3, 4] + [0, 1, 2, 2, 2])
    batches = [first, np.full(15, 5)]
    hot = rows_that_pay(lambda: iter(batches), 2, 0.5, 3, 1, 8)
    assert np.flatnonzero(hot).tolist() == [0, 1, 2]
    m, n = np.array([2, 2, 2, 1, 0]), np.ones(5, int)
    assert pays(m, n, 3, 4).tolist() == [16, 16, 16, 0, -16]
    # at 2 trainers one reader other than the owner pays (the sum moves G a trainer, the
    # all-to-alls G + 4); at 3, with rows of 2 floats, one reader is below the boundary
    assert pays(np.array([1]), np.array([1]), 2, 4).item() > 0
    assert pays(np.array([1]), np.array([1]), 3, 8).item() < 0
    assert not rows_that_pay(lambda: iter(batches), 2, 1.0, 1, 1, 8).any()  # one trainer: none


def test_the_engine_and_the_model_pick_the_same_hot_set(tiny_dataset, monkeypatch):
    """One function picks the hot set for both, from the same batches: the set a run's
    trainers hold is the one `bagpipe simulate` models."""
    from bagpipe_cli.simulate import sharded as model
    from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

    assert model.rows_that_pay is sharded_hot.rows_that_pay
    picked = []

    def spy(*args):
        picked.append(rows_that_pay(*args))
        return picked[-1]

    monkeypatch.setattr(sharded_hot, "rows_that_pay", spy)
    monkeypatch.setattr(model, "rows_that_pay", spy)
    kw = dict(batch_size=256, iterations=8, eval_rows=2000, servers=2)
    train(TrainConfig(system="sharded-hot", data=str(tiny_dataset), trainers=4, **kw))
    trace_volumes(TraceConfig(data=str(tiny_dataset), trainers=4, row_dim=16, **kw), ["sharded-hot"])
    engine, simulated = picked
    assert engine.any() and np.array_equal(engine, simulated)

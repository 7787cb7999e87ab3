"""Real multi-process runs over torch.distributed (gloo on loopback)."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import (
    assert_same_parameters,
    bagpipe,
    communicate_all,
    hang_guard,
    run_cli,
    wait_until,
)

from bagpipe_cli.data import DatasetWriter, TableSpec, open_dataset
from bagpipe_cli.data.format import table_offsets
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.comm.traffic import KINDS
from bagpipe_cli.engine.distributed import Layout, trainer_devices
from bagpipe_cli.engine.distributed.layout import check_datasets, dataset_fact
from bagpipe_cli.engine.distributed.rounds import PlanWire
from bagpipe_cli.engine.planning.feed import key_batches
from bagpipe_cli.engine.planning.partition import flows
from bagpipe_cli.engine.registry import ENGINE_SYSTEMS, spec
from bagpipe_cli.engine.setup import prepare
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.atomic import atomic_dir
from bagpipe_cli.launch.processes import free_port
from bagpipe_cli.models import build_model
from bagpipe_cli.report.analysis import annotate, traffic_table
from bagpipe_cli.results import load_runs

pytestmark = pytest.mark.slow  # every test here starts real processes

ARGS = ["--batch-size", "256", "--iterations", "16", "--lookahead", "4", "--optimizer", "adagrad",
        "--trainers", "2", "--servers", "1", "--eval-rows", "2000", "--seed", "5"]
KW = dict(batch_size=256, iterations=16, lookahead=4, optimizer="adagrad", trainers=2, servers=1,
          eval_rows=2000, seed=5)
NO_CUDA = not torch.cuda.is_available()
HANG_S = 120  # a hang guard, not a speed limit: these jobs take seconds on an idle machine


def _run(tmp_path, data, name, *extra, env=None) -> subprocess.CompletedProcess:
    """`bagpipe train DATA ARGS EXTRA --out NAME --save-model NAME.pt`, its launcher in this
    process (`helpers.run_cli`)."""
    return run_cli("train", str(data), *ARGS, *extra, "--out", str(tmp_path / name),
                   "--save-model", str(tmp_path / f"{name}.pt"), env=env)


def s_model(cfg: TrainConfig):
    """The ModelConfig a run of `cfg` builds."""
    return prepare(cfg).mcfg


def _slice_rows(data, trainers):
    """Per iteration: the sum over trainers of the unique rows of their slices."""
    ds = open_dataset(data)
    off = table_offsets(ds.meta.cardinalities)
    out = []
    for b in range(16):
        keys = ds.sparse_block(b * 256, (b + 1) * 256) + off
        out.append(sum(len(np.unique(part)) for part in np.split(keys, trainers)))
    return out


@pytest.mark.parametrize("model", [pytest.param("wdl", marks=pytest.mark.extended), "deepfm"])
def test_odd_trainer_slices_of_a_first_order_model_equal_in_process(real_data, tmp_path, model):
    """Criteo's 26 tables, rows of E + 1 = 17 floats, 49 samples a trainer: in-process, trainer
    1's rows start 8 bytes off a 32-byte boundary, where a vectorised kernel may sum in another
    order than on the tensor of its own that a trainer process has (it did: the wide part's
    sum over tables, by an ulp, from the first iteration on)."""
    src = real_data / "criteo_kaggle_train_head1999.tsv"
    data = tmp_path / "criteo"
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "preprocess", "criteo", str(src),
                        "--out", str(data)], capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stderr[-2000:]
    kw = dict(model=model, batch_size=98, iterations=8, trainers=2, servers=1, lr=0.01,
              dense_lr=0.001, eval_rows=0)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "train", str(data), *args,
                        "--procs", "4", "--out", str(tmp_path / "run"), "--save-model",
                        str(tmp_path / "run.pt")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_parameters(tmp_path / "run.pt", train(TrainConfig(data=str(data), **kw)))


@pytest.mark.parametrize("system", ENGINE_SYSTEMS)
def test_every_system_over_torch_distributed_equals_in_process(tiny_dataset, tmp_path, system):
    """Bitwise: the same parameters, loss curve and traffic totals as the in-process engine,
    for every system of the registry (het with staleness 2 too: the same stale reads), and
    rank 0's plan bytes are those the in-process planner counts."""
    r = _run(tmp_path, tiny_dataset, system, "--system", system, "--staleness", "2", "--procs", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    inproc = train(TrainConfig(data=str(tiny_dataset), system=system, staleness=2, **KW))
    assert_same_parameters(tmp_path / f"{system}.pt", inproc)
    m = pd.read_csv(tmp_path / system / "metrics.csv")
    assert m["loss"].tolist() == inproc.metrics["loss"].tolist()
    sp = spec(system)
    if sp.holds_tables == "shard":  # the gradients of the rows it asked go to their owners
        assert m["rows_written_back"].tolist() == m["rows_fetched"].tolist()
    elif not sp.replicated:  # each trainer pushes the gradients of its slice's rows
        slice_rows = _slice_rows(tiny_dataset, 2)
        assert m["rows_written_back"].tolist() == slice_rows
        if sp.role == "reference":  # and fetches them every iteration
            assert m["rows_fetched"].tolist() == slice_rows
    else:  # one writer per evicted row: the same as in-process
        assert m["rows_written_back"].tolist() == inproc.metrics["rows_written_back"].tolist()
    assert m["stale_reads"].tolist() == inproc.metrics["stale_reads"].tolist()
    if "staleness" in sp.reads:
        assert m["stale_reads"].sum() > 0
    s = json.loads((tmp_path / system / "summary.json").read_text())
    assert s["transport"] == "torch" and s["backend"] == "gloo"
    assert s["trainer_devices"] == ["cpu", "cpu"]
    assert set(s["roles"]) == {"planner", "trainer0", "trainer1", "server0"}
    # rank 0 sent the plans the in-process planner counted (engine/comm/traffic.py)
    plan = [x["roles"]["planner"]["traffic"]["sent"]["plan"] for x in (s, inproc.summary)]
    assert plan[0] == plan[1] > 0
    t = [_traffic(s, f"trainer{i}") for i in range(2)]
    if sp.partitioned:  # each trainer its own plan, from rank 0
        assert t[0]["received"]["plan"] + t[1]["received"]["plan"] == plan[0]
        assert t[0]["sent"]["plan"] == t[1]["sent"]["plan"] == 0
    else:  # one plan down the relay tree: trainer 0 passes it on to trainer 1
        assert t[0]["received"]["plan"] == t[0]["sent"]["plan"] == t[1]["received"]["plan"] == plan[0]
    for role in s["roles"].values():  # per role: busy, waiting, bytes sent
        assert role["busy_s"] > 0 and role["waiting_s"] >= 0 and role["bytes_sent"] > 0
    server = s["roles"]["server0"]
    # what the trainers received is what the server sent
    assert server["bytes_sent"] == sum(s["roles"][f"trainer{i}"]["bytes_received"] for i in range(2))
    if sp.holds_tables:  # the tables before training (every trainer all, or its shard), nothing during it
        rows = int(sum(open_dataset(tiny_dataset).meta.cardinalities))
        tables, row = rows * (16 + 1) * 4, (16 + 1) * 4
        if sp.holds_tables == "all":
            assert server["bytes_sent"] == 2 * tables
        else:  # each row once, to its owner; replicated hot rows (sharded-hot) to the others too
            assert server["bytes_sent"] >= tables and (server["bytes_sent"] - tables) % row == 0
        if sp.holds_tables == "all":
            assert m["rows_fetched"].sum() == 0
    else:
        assert server["bytes_sent"] == m["rows_fetched"].sum() * (16 + 1) * 4  # row + Adagrad state


@pytest.mark.parametrize("trainers,servers", [(4, 2), pytest.param(4, 1, marks=pytest.mark.extended),
                                              pytest.param(2, 2, marks=pytest.mark.extended)])
def test_bagpipe_moves_each_row_to_its_readers_only(tiny_dataset, tmp_path, trainers, servers):
    """Bitwise equal to in-process sync, and each trainer moved exactly the rows the plan's
    partition gives it (engine/planning/partition.py): from the servers, the rows fetched for an
    iteration it reads them at; among the trainers, the rows delivered from their homes and
    the partial gradients sent to them, beside the dense model's sum."""
    n = trainers
    args = ["--trainers", str(n), "--servers", str(servers), "--optimizer", "sgd", "--lookahead", "6"]
    r = _run(tmp_path, tiny_dataset, "bag", "--system", "bagpipe", *args, "--procs", str(1 + servers + n))
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = TrainConfig(data=str(tiny_dataset), **{**KW, "trainers": n, "servers": servers,
                                                 "optimizer": "sgd", "lookahead": 6})
    assert_same_parameters(tmp_path / "bag.pt", train(TrainConfig(**{**cfg.__dict__, "system": "sync"})))

    s = prepare(cfg)
    rows, moved = np.zeros(n, np.int64), np.zeros(n, np.int64)
    logical = 0
    for rp in s.spec.plan(s, 0).planner.plan(key_batches(s.ds, cfg, s.train_rows, s.offsets)):
        logical += len(rp.fetch_keys)
        for p in rp.iters:
            f = flows(p.part, p.row_class, n)
            rows += f.fetched
            moved += f.delivered_sent + f.now_sent + f.later_sent
    s = json.loads((tmp_path / "bag" / "summary.json").read_text())
    got = [s["roles"][f"trainer{i}"]["bytes_received"] // (16 * 4) for i in range(n)]
    assert got == rows.tolist()
    assert rows.sum() < n * logical  # physically partitioned, not replicated
    assert sum(s["roles"][f"server{k}"]["bytes_sent"] for k in range(servers)) == rows.sum() * 16 * 4
    m = pd.read_csv(tmp_path / "bag" / "metrics.csv")
    assert m["rows_fetched"].sum() == rows.sum()
    # The dense model's exact sum moves a ring's bytes: per trainer 2(N-1)/N of its vector,
    # and DDP's buckets' padding; the rows move by need, the losses with the sync_now
    # partials (a row to every other trainer, every iteration).
    dense = sum(p.numel() for p in build_model(s_model(cfg)).parameters())
    vectors = 4 * len(m) * dense
    for i in range(n):
        ring = s["roles"][f"trainer{i}"]["collective_bytes_sent"] - 16 * 4 * (moved[i] + (n - 1) * len(m))
        assert 2 * (n - 1) / n * vectors <= ring <= 1.01 * 2 * (n - 1) / n * vectors


def _one_trainer_alone_has_new_rows(path):
    """Batches of 4 samples, 2 trainers: trainer 0's samples always read row 0 of table a
    (cached after the first batch); each of trainer 1's reads a row of its own, once
    (private: trainer 1 alone fetches it). So in every round after the first only trainer 1
    has rows to fetch (the shape of the OBD log whose --procs run aborted out of step)."""
    n, bs = 48, 4
    a = np.zeros(n, np.int64)
    b = np.zeros(n, np.int64)
    for r in range(n):
        batch, k = divmod(r, bs)
        if k >= bs // 2:  # trainer 1's samples
            a[r] = 1 + batch * 2 + (k - bs // 2)
        b[r] = r % 2
    with atomic_dir(path) as tmp:
        w = DatasetWriter(tmp, [TableSpec("a", int(a.max()) + 1), TableSpec("b", 2)], ["x"], "y")
        w.write(np.linspace(0, 1, n, dtype=np.float32)[:, None], np.stack([a, b], axis=1),
                (np.arange(n) % 3 == 0).astype(np.float32))
        w.finish(name="one-alone", source={"kind": "test"})


def test_a_round_in_which_one_trainer_alone_has_new_rows_keeps_every_trainer_in_step(tmp_path):
    data = tmp_path / "alone"
    _one_trainer_alone_has_new_rows(data)
    kw = dict(data=str(data), batch_size=4, iterations=12, lookahead=3, trainers=2, servers=1,
              eval_rows=0, lr=0.1)
    s = prepare(TrainConfig(system="bagpipe", **kw))
    rounds = list(s.spec.plan(s, 0).planner.plan(key_batches(s.ds, s.cfg, s.train_rows, s.offsets)))
    alone = [rp.r for rp in rounds if len(rp.fetch_for(1)[0]) and not len(rp.fetch_for(0)[0])]
    assert len(alone) >= 8, alone  # the case this test is about
    args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items() if k != "data"]
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "train", str(data), *args,
                        "--system", "bagpipe", "--procs", "4", "--out", str(tmp_path / "run"),
                        "--save-model", str(tmp_path / "run.pt")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_parameters(tmp_path / "run.pt", train(TrainConfig(system="sync", **kw)))


def _traffic(summary, role):
    return summary["roles"][role]["traffic"]


@pytest.mark.slow
@pytest.mark.extended  # make test-all: tests/test_trainer_plans.py checks every trainer's plan
def test_eight_trainers_over_procs_equal_sync_and_each_receives_only_its_plan(tiny_dataset, tmp_path):
    """Bitwise sync at 8 trainers (10 processes). Rank 0 sends no samples, and each trainer of
    the partitioned cache its own plan, point to point: the bytes the in-process planner
    counts, each a share of the whole plan, and no trainer passes any on; what the trainers
    sent the servers is what the servers received, kind by kind."""
    n = 8
    args = ["--trainers", str(n), "--iterations", "8", "--optimizer", "sgd", "--lookahead", "4"]
    r = _run(tmp_path, tiny_dataset, "bag", "--system", "bagpipe", *args, "--procs", str(n + 2))
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = TrainConfig(data=str(tiny_dataset), **{**KW, "trainers": n, "iterations": 8,
                                                 "optimizer": "sgd", "lookahead": 4})
    assert_same_parameters(tmp_path / "bag.pt", train(TrainConfig(**{**cfg.__dict__, "system": "sync"})))
    s = json.loads((tmp_path / "bag" / "summary.json").read_text())
    oracle = _traffic(s, "planner")
    trainers = [_traffic(s, f"trainer{i}") for i in range(n)]
    assert oracle["sent"]["samples"] == 0 and oracle["sent"]["plan"] > 0
    received = [t["received"]["plan"] for t in trainers]
    assert sum(received) == oracle["sent"]["plan"]  # each its own ...
    assert all(t["sent"]["plan"] == 0 for t in trainers)  # ... passed on to no one
    st = prepare(cfg)
    wire = PlanWire.of(st, True)
    rounds = st.spec.plan(st, 0).planner.plan(key_batches(st.ds, cfg, st.train_rows, st.offsets))
    assert oracle["sent"]["plan"] == sum(wire.nbytes(rp) for rp in [*rounds, None])
    assert max(received) < oracle["sent"]["plan"] / 4, received  # a share of the plan, not all of it
    server = _traffic(s, "server0")
    for kind in ("rows", "gradients"):
        assert server["received"][kind] == sum(t["sent"][kind] for t in trainers), kind
    assert server["sent"]["rows"] == sum(t["received"]["rows"] for t in trainers)
    assert oracle["sent_per_iteration"]["plan"] == oracle["sent"]["plan"] / 8
    # The report's table of bytes by role reads the same counts: rank 0, the busiest trainer.
    loaded = load_runs(tmp_path / "bag")
    table = traffic_table(annotate(loaded.runs), loaded.traffic).set_index("role")
    assert table.loc["rank 0 (planner)", "plan_mb"] == pytest.approx(
        oracle["sent_per_iteration"]["plan"] / 1e6)
    busiest = max(sum(t["sent_per_iteration"].values()) for t in trainers)
    assert table.loc["trainer (busiest)", "sent_mb"] == pytest.approx(busiest / 1e6)


@pytest.mark.slow
@pytest.mark.extended  # make test-all: test_simulate checks the model's sync plan bytes
def test_sync_rank_0_sends_nothing_that_grows_with_the_batch(tiny_dataset, tmp_path):
    """Sync's trainers read their own samples and fetch their own rows: rank 0 sends each
    only |U_b| a batch, the same bytes at 4x the batch."""
    per_iteration = []
    for bs in (128, 512):
        r = _run(tmp_path, tiny_dataset, f"sync{bs}", "--system", "sync", "--batch-size", str(bs),
                 "--procs", "4")
        assert r.returncode == 0, r.stderr[-2000:]
        s = json.loads((tmp_path / f"sync{bs}" / "summary.json").read_text())
        per_iteration.append(_traffic(s, "planner")["sent_per_iteration"]["plan"])
    assert per_iteration[1] <= per_iteration[0] * 1.05, per_iteration
    assert per_iteration[1] < 1500  # bytes: a few numbers an iteration


@pytest.mark.parametrize("system", ["sync", pytest.param("bagpipe", marks=pytest.mark.extended)])
def test_in_process_counts_the_traffic_a_procs_run_sends(tiny_dataset, tmp_path, system):
    """One trainer, two servers, the same run in-process and over --procs: `roles.*.traffic`
    of the planner, the trainer process (in-process `trainers`, over --procs `trainer0`) and
    each server has the same kinds, and the same bytes of every kind but `control`: `plan`
    (each round as the planner encodes it, and the end of the plans), `rows` (fetches: the
    requests' headers and keys, the rows served; bagpipe's write-backs), `gradients` (sync's
    pushes), `samples` and `collective` (none: one trainer has no one to sum with).

    `control` differs by nature: over --procs it is what only crosses between processes (rank
    0's start-up state to every rank, the DONE requests that end a trainer's requests),
    while in-process the planner, trainer and servers share it in memory: 0 there (several
    trainers: tests/test_runtime_figures.py). The report's bytes-by-role table stays a table
    of ranks: an in-process run has no rows in it."""
    args = ["--system", system, "--trainers", "1", "--servers", "2", "--iterations", "6",
            "--batch-size", "128", "--eval-rows", "0"]
    r = [_run(tmp_path, tiny_dataset, name, *args, *extra)
         for name, extra in (("in", ()), ("procs", ("--procs", "4")))]
    assert all(x.returncode == 0 for x in r), r[0].stderr[-1000:] + r[1].stderr[-1000:]
    inproc, procs = (json.loads((tmp_path / n / "summary.json").read_text())["roles"]
                     for n in ("in", "procs"))
    pairs = {"planner": "planner", "trainers": "trainer0", "server0": "server0", "server1": "server1"}
    assert {k for k, v in inproc.items() if "traffic" in v} == set(pairs)
    moved = {"plan", "rows"} | ({"gradients"} if system == "sync" else set())
    for a, b in pairs.items():
        ta, tb = inproc[a]["traffic"], procs[b]["traffic"]
        assert list(ta) == list(tb) and ta["iterations"] == tb["iterations"] == 6, a
        for way in ("sent", "received", "sent_per_iteration", "received_per_iteration"):
            assert list(ta[way]) == list(tb[way]) == list(KINDS), (a, way)
            same = {k: ta[way][k] for k in KINDS if k != "control"}
            assert same == {k: tb[way][k] for k in same}, (a, way)
            assert ta[way]["control"] == 0, (a, way)
    assert procs["planner"]["traffic"]["sent"]["control"] > 0
    assert procs["trainer0"]["traffic"]["sent"]["control"] > 0  # its DONE requests
    t, servers = inproc["trainers"]["traffic"], [inproc[f"server{k}"]["traffic"] for k in range(2)]
    # the kinds compared above are not 0 = 0: the trainer process moved these, and only these
    assert {k for k in KINDS if t["sent"][k] + t["received"][k]} == moved
    for kind in ("rows", "gradients"):  # what the trainer process sent, the servers received
        assert t["sent"][kind] == sum(sv["received"][kind] for sv in servers), kind
        assert t["received"][kind] == sum(sv["sent"][kind] for sv in servers), kind
    assert t["received"]["plan"] == inproc["planner"]["traffic"]["sent"]["plan"]
    assert load_runs(tmp_path / "in").traffic.empty and not load_runs(tmp_path / "procs").traffic.empty


@pytest.mark.extended  # failure handling: make test-all
def test_every_rank_must_see_the_same_dataset(tiny_dataset, tmp_path):
    """Every rank reads the dataset itself: a rank that cannot read it, or sees another one at
    the same path, stops every rank alike, naming it and what to do."""
    cfg = TrainConfig(data=str(tiny_dataset), trainers=2, servers=1)
    lay = Layout.of(cfg)
    good = dataset_fact(str(tiny_dataset))
    assert set(good) == {"meta_sha256"}
    facts = [{"host": f"h{r}", "dataset": good} for r in range(lay.world)]
    check_datasets(cfg, lay, facts)  # all alike: nothing to say
    facts[3] = {"host": "h3", "dataset": dataset_fact(str(tmp_path / "missing"))}
    with pytest.raises(ConfigError, match=r"^trainer 1 \(rank 3\) on h3 cannot read the dataset .*"
                                          r"no such directory; every rank .* shared file system"):
        check_datasets(cfg, lay, facts)
    facts[3] = {"host": "h3", "dataset": {"meta_sha256": "0" * 64}}
    with pytest.raises(ConfigError, match=r"trainer 1 \(rank 3\) on h3 has another dataset .* "
                                          r"than rank 0 \(its meta.json differs\)"):
        check_datasets(cfg, lay, facts)
    # A torchrun rank started where the dataset is missing says so before it joins.
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "train", str(tmp_path / "missing"),
                        "--transport", "torch", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "no such directory; every rank of a distributed job reads the dataset" in r.stderr


@pytest.mark.extended  # failure handling: make test-all
def test_a_killed_server_stops_the_job_with_a_clear_error(tiny_dataset, tmp_path):
    """The server is killed mid-run: right after its part of the first checkpoint (iteration
    5 of 400), a point in the run, not a time, which a loaded machine would move before the
    job has started or after it has ended."""
    with hang_guard(HANG_S, "the job with a killed server"):
        r = _run(tmp_path, tiny_dataset, "dead", "--system", "bagpipe", "--procs", "4",
                 "--iterations", "400", "--timeout", "20", "--checkpoint-every", "5",
                 "--checkpoint-dir", str(tmp_path / "ck"),
                 env={"BAGPIPE_FAULT": "rank=1,after_checkpoints=1"})
    assert r.returncode != 0
    # one line: the rank that died, and what a surviving rank saw
    assert r.stderr.startswith("Error: server 0 (rank 1) exited with code -9; "), r.stderr
    assert "lost contact with server 0 (rank 1): connection closed" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "dead").exists()


@pytest.mark.extended  # failure handling: make test-all
def test_a_rank_that_never_joins_stops_the_others_within_the_timeout(tiny_dataset, tmp_path):
    """Trainer 1 dies before it connects: the others give up after --timeout, in one line."""
    with hang_guard(HANG_S, "the job whose trainer never joins"):
        r = _run(tmp_path, tiny_dataset, "nojoin", "--procs", "4", "--timeout", "5",
                 env={"BAGPIPE_FAULT": "rank=3,after_s=0"})
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: trainer 1 (rank 3) exited with code -9; ")
    assert "the job did not start: " in lines[0] and "within --timeout 5 s" in lines[0]
    assert not (tmp_path / "nojoin").exists()


@pytest.mark.extended  # failure handling: make test-all
def test_an_error_on_one_rank_is_the_one_line_reported(tiny_dataset, tmp_path):
    """rank 0 refuses the cache size; the others lose contact with it: the user sees the cause."""
    r = _run(tmp_path, tiny_dataset, "small", "--system", "bagpipe", "--procs", "4", "--cache-rows", "10")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"Error: cache capacity 10 rows is below the lookahead's "
                                            r"need of at least \d+ rows \(round 0\); raise "
                                            r"--cache-rows or lower --lookahead", lines[0])
    assert not (tmp_path / "small").exists()


def test_layout_and_bad_options(tiny_dataset, tmp_path):
    lay = Layout(servers=2, trainers=3)
    assert lay.world == 6 and lay.role(0) == ("planner", 0) and lay.role(2) == ("server", 1)
    assert lay.role(3) == ("trainer", 0) and lay.trainer_rank(2) == 5
    r = _run(tmp_path, tiny_dataset, "x", "--procs", "3")
    assert r.returncode == 2 and "--procs 3" in r.stderr
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "train", str(tiny_dataset), "--transport",
                        "torch", "--out", str(tmp_path / "z")], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_ADDR")},
                       timeout=HANG_S)
    assert r.returncode == 2 and "torchrun" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--backend", "nccl", "--procs", "4"], "--backend nccl: NCCL connects GPUs"),
    pytest.param(["--device", "cuda"], "--device cuda: this machine has no CUDA device",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present")),
    (["--device", "gpu", "--procs", "4"], "--device 'gpu': choose auto, cpu, cuda or cuda:K"),
    pytest.param(["--device", "cuda", "--procs", "4"], "--device cuda: trainer 0 (rank 2) on "
                 f"{socket.gethostname()} has no CUDA device",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")),
])
def test_device_and_backend_errors(tiny_dataset, tmp_path, args, message):
    r = _run(tmp_path, tiny_dataset, "o", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def _facts(host, cuda, nccl=True):
    return {"host": host, "cuda": cuda, "nccl": nccl}


def test_trainer_devices():
    cfg = TrainConfig(data="x", transport="torch", device="cuda", trainers=4, servers=2,
                      backend="nccl", batch_size=1024)
    lay = Layout(2, 4)
    # oracle + 2 servers on a CPU machine, two trainers on each of two 2-GPU machines
    facts = [_facts("cpu0", 0)] * 3 + [_facts("a", 2), _facts("a", 2), _facts("b", 2), _facts("b", 2)]
    assert trainer_devices(cfg, lay, facts) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    one_gpu = [_facts("h", 1)] * 7
    with pytest.raises(ConfigError, match="trainer 1 \\(rank 4\\) on h and trainer 0 \\(rank 3\\) on h "
                                          "would share cuda:0"):
        trainer_devices(cfg, lay, one_gpu)
    gloo = TrainConfig(**{**cfg.__dict__, "backend": "gloo"})
    assert trainer_devices(gloo, lay, one_gpu) == ["cuda:0"] * 4  # gloo collectives go via the CPU
    with pytest.raises(ConfigError, match="has 1 CUDA device"):
        trainer_devices(TrainConfig(**{**gloo.__dict__, "device": "cuda:1"}), lay, one_gpu)
    with pytest.raises(ConfigError, match="trainer 0 \\(rank 3\\) on cpu0 has no CUDA device"):
        trainer_devices(cfg, lay, [_facts("cpu0", 0)] * 7)
    with pytest.raises(ConfigError, match="has no NCCL"):
        trainer_devices(cfg, lay, [_facts(f"h{r}", 1, nccl=False) for r in range(7)])
    cpu = TrainConfig(data="x", transport="torch", trainers=4, servers=2, batch_size=1024,
                      device="cpu")
    assert trainer_devices(cpu, lay, one_gpu) == ["cpu"] * 4
    auto = TrainConfig(**{**cpu.__dict__, "device": "auto"})  # a GPU where a host has one
    assert trainer_devices(auto, lay, facts) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert trainer_devices(auto, lay, [_facts("cpu0", 0)] * 7) == ["cpu"] * 4


@pytest.mark.extended  # torchrun's launcher; --procs runs the same ranks in make test
def test_two_node_torchrun_launch_equals_in_process_sync(tiny_dataset, tmp_path):
    """The README's two-node launch, both nodes on loopback: two torchrun agents rendezvous,
    and bagpipe over them gives sync's parameters bitwise."""
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port)]
    train_args = ["-m", "bagpipe_cli", "train", str(tiny_dataset), *ARGS, "--system", "bagpipe",
                  "--transport", "torch", "--out", str(tmp_path / "dist"),
                  "--save-model", str(tmp_path / "dist.pt")]
    nodes = [subprocess.Popen([*cmd, "--node-rank", str(n), *train_args], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for n in range(2)]
    logs = [out for out, _ in communicate_all(nodes, 120)]
    assert [p.returncode for p in nodes] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    sync = train(TrainConfig(data=str(tiny_dataset), system="sync", **KW))
    assert_same_parameters(tmp_path / "dist.pt", sync)
    s = json.loads((tmp_path / "dist" / "summary.json").read_text())
    assert s["transport"] == "torch" and s["world_size"] == 4
    assert set(s["roles"]) == {"planner", "trainer0", "trainer1", "server0"}


@pytest.mark.extended  # failure handling: make test-all
def test_two_machines_started_by_procs_and_master_equal_in_process_sync(tiny_dataset, tmp_path):
    """The README's launch on two machines, both on loopback: each `bagpipe train --procs 2
    --master ... --node-rank R` starts its half of the 4 ranks; the ranks meet at --master
    and train sync's parameters bitwise; the machine without rank 0 writes nothing."""
    master = f"127.0.0.1:{free_port()}"
    nodes = [subprocess.Popen([sys.executable, "-m", "bagpipe_cli", "train", str(tiny_dataset), *ARGS,
                               "--system", "bagpipe", "--procs", "2", "--master", master,
                               "--node-rank", str(n), "--out", str(tmp_path / f"dist{n}"),
                               "--save-model", str(tmp_path / f"dist{n}.pt")],
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in (1, 0)]  # the machine without rank 0 may start first
    (_, err1), (_, err0) = communicate_all(nodes, 120)
    assert [p.returncode for p in nodes] == [0, 0], err0[-2000:] + err1[-2000:]
    assert_same_parameters(tmp_path / "dist0.pt", train(TrainConfig(data=str(tiny_dataset), system="sync", **KW)))
    s = json.loads((tmp_path / "dist0" / "summary.json").read_text())
    assert s["world_size"] == 4 and set(s["roles"]) == {"planner", "trainer0", "trainer1", "server0"}
    assert f"--node-rank 0 (at {master}) writes the run" in err1
    assert not (tmp_path / "dist1").exists() and not (tmp_path / "dist1.pt").exists()


def test_a_launch_on_several_machines_is_checked_before_it_starts(tiny_dataset):
    kw = dict(data=str(tiny_dataset), trainers=2, servers=1, transport="torch")  # 4 ranks
    for bad, match in [(dict(master="h:1"), "--master: each machine starts its ranks with --procs"),
                       (dict(procs=3, master="h:1"), "--procs 3: the job's 1 \\+ 1 \\+ 2 = 4 ranks do not split"),
                       (dict(procs=2, master="h:1", node_rank=2), "--node-rank 2: 4 ranks at --procs 2 make 2 machines"),
                       (dict(procs=2, master="10.0.0.1"), "--master '10.0.0.1': give HOST:PORT"),
                       (dict(procs=2, master="h:70000"), "give HOST:PORT"),
                       (dict(procs=4, node_rank=1), "--node-rank: a job on several machines needs --master")]:
        with pytest.raises(ConfigError, match=match):
            TrainConfig(**kw, **bad)
    assert TrainConfig(**kw, procs=2, master="[::1]:29500", node_rank=1).master_address == ("::1", 29500)
    assert TrainConfig(**kw, procs=4).master_address is None


@pytest.mark.extended  # failure handling: make test-all
def test_a_master_that_never_answers_ends_the_launch_within_the_timeout(tiny_dataset, tmp_path):
    """Nothing listens at --master: the launch ends with one line naming the address once
    --timeout has passed (the line is `_reach`'s, whose own deadline is --timeout: not c10d's
    retries, about twice it; see the test below), and Ctrl-C stops it at once."""
    master = f"127.0.0.1:{free_port()}"
    args = ["train", str(tiny_dataset), *ARGS, "--procs", "2", "--master", master, "--node-rank",
            "1", "--out", str(tmp_path / "o")]
    t0 = time.monotonic()
    r = bagpipe(*args, "--timeout", "3", timeout=HANG_S)
    took = time.monotonic() - t0
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0] == (f"Error: the job did not start: nothing answered at {master} within "
                        "--timeout 3 s (Connection refused); start the machine with rank 0 first, "
                        "at that address")
    assert took >= 3, took  # it kept trying for --timeout (an upper bound is start-up's speed)
    # Ctrl-C while the ranks wait: signalled once a rank is seen connecting, to a master that
    # never answers (its accept queue is kept full, so each connection hangs in SYN_SENT),
    # with --timeout 300 so that only the interrupt can end it within the hang guard.
    with _silent_master() as (host, port):
        p = subprocess.Popen([sys.executable, "-m", "bagpipe_cli", *args[:-4], "--master",
                              f"{host}:{port}", "--node-rank", "1", "--out", str(tmp_path / "o"),
                              "--timeout", "300"], text=True, stderr=subprocess.PIPE)
        try:
            wait_until(p, lambda: _connecting_to(port), "a rank connecting", HANG_S)
            p.send_signal(signal.SIGINT)
            err = communicate_all([p], HANG_S)[0][1]
        except subprocess.TimeoutExpired:
            raise AssertionError(f"Ctrl-C did not end the launch in {HANG_S} s") from None
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 130 and "interrupted" in err, err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


@contextlib.contextmanager
def _silent_master():
    """(host, port) of a listener that never answers: its accept queue (backlog 0) is full
    with one connection of ours, so the kernel drops every further connection's SYN."""
    srv = socket.socket()
    filler = socket.socket()
    try:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        filler.connect(srv.getsockname())
        yield srv.getsockname()
    finally:
        filler.close()
        srv.close()


def _connecting_to(port: int) -> bool:
    """Whether some socket on this machine is connecting to 127.0.0.1:`port` (SYN_SENT)."""
    rows = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
    return any(r[2] == f"0100007F:{port:04X}" and r[3] == "02" for r in rows)


def test_reach_gives_up_once_its_timeout_has_passed(monkeypatch):
    """`_reach` on a clock of its own: it retries until --timeout has passed, then raises the
    one line, at most one retry's pause (0.2 s) after the deadline."""
    from types import SimpleNamespace

    from bagpipe_cli.engine.distributed import runtime

    now = [0.0]
    tries: list[tuple[float, float]] = []

    def connect(address, timeout):
        tries.append((now[0], timeout))
        now[0] += 0.001  # refused at once
        raise ConnectionRefusedError(111, "Connection refused")

    def sleep(s):
        now[0] += s

    monkeypatch.setattr(runtime, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    monkeypatch.setattr(runtime, "socket", SimpleNamespace(create_connection=connect))
    with pytest.raises(runtime.RankFailure, match=r"^the job did not start: nothing answered at "
                       r"h:1 within --timeout 3 s \(Connection refused\); start the machine"):
        runtime._reach("h", 1, 3.0)
    assert 3.0 <= now[0] < 3.0 + 0.2 + 0.01, now[0]
    assert len(tries) > 10 and all(0.05 <= t <= 1.0 for _, t in tries)


@pytest.mark.extended  # failure handling: make test-all
@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_torchrun_ranks_all_stop_alike_when_a_trainer_has_no_gpu(tiny_dataset, tmp_path):
    """Launched like torchrun (one process per rank, no launcher to check first): every rank
    learns that a trainer cannot run on CUDA and exits with the same one-line error."""
    port = free_port()
    procs = []
    for rank in range(4):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "bagpipe_cli", "train", str(tiny_dataset),
                                       *ARGS, "--transport", "torch", "--device", "cuda",
                                       "--out", str(tmp_path / "o")], env=env, text=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    errs = [err for _, err in communicate_all(procs, HANG_S)]
    assert [p.returncode for p in procs] == [2, 2, 2, 2]
    for e in errs:
        assert "--device cuda: trainer 0 (rank 2)" in e and "has no CUDA device" in e
        assert "Traceback" not in e
    assert not (tmp_path / "o").exists()


SCHEDULE_PROBE = """
import os, sys, time
import numpy as np, torch, torch.distributed as dist
from bagpipe_cli.engine.distributed import Layout
from bagpipe_cli.engine.distributed.faults import Faults
from bagpipe_cli.engine.distributed.server import DistributedServer
from bagpipe_cli.engine.distributed.transport import DistributedTransport
from bagpipe_cli.engine.distributed.wire import ScheduleError
from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.engine.comm.shards import init_shards
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=4)
lay = Layout(servers=1, trainers=2)
if rank == 1:
    server = init_shards([50], 4, 1, 0, RowOptimizer().init_state)[0]
    try:
        DistributedServer(server, lay, NetworkModel(), RowOptimizer(), Faults()).serve()
    except ScheduleError as e:
        print(e, flush=True)
        open(os.environ["SERVER_DONE"], "w").close()
        sys.exit(3)
elif rank >= 2:
    t = DistributedTransport(lay, 4, 0, NetworkModel())
    if rank == 2:
        t.fetch(np.array([1, 2]))           # trainer 0: a fetch ...
    else:
        t.write_back(np.array([1]), torch.zeros(1, 4), torch.zeros(1, 0))  # trainer 1: a write-back
# The others stay connected until the server has answered (however long a loaded machine
# makes that), or for at most a minute (then the test fails: the server did not refuse).
end = time.monotonic() + 60
while not os.path.exists(os.environ["SERVER_DONE"]) and time.monotonic() < end:
    time.sleep(0.05)
"""


def start_ranks(script: str, world: int, stderr: int,
                env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """`world` processes running `script`, as the ranks of one job on a free port."""
    port = free_port()
    return [subprocess.Popen([sys.executable, "-c", script], text=True,
                             stdout=subprocess.PIPE, stderr=stderr,
                             env={**os.environ, **(env or {}), "RANK": str(r),
                                  "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                                  "MASTER_PORT": str(port)})
            for r in range(world)]


@pytest.mark.extended  # failure handling: make test-all
def test_a_server_refuses_trainers_out_of_step(tmp_path):
    """The servers' lockstep is what orders one trainer's write-back before another's fetch:
    a server that gets different requests at the same step stops instead of serving."""
    procs = start_ranks(SCHEDULE_PROBE, 4, stderr=subprocess.DEVNULL,
                        env={"SERVER_DONE": str(tmp_path / "server-done")})
    out = communicate_all(procs, HANG_S)[1][0]
    assert procs[1].returncode == 3
    assert ("server 0: request 0 of trainer 1 is WRITEBACK #0, trainer 0's is FETCH #0; "
            "the trainers are out of step") in out


WIRE_PROBE = """
import os, numpy as np, torch, torch.distributed as dist
from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.engine.distributed.wire import send_obj, recv_obj
dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
lay = Layout(servers=0, trainers=1)
big = torch.arange(40000, dtype=torch.float32).reshape(100, 400)
obj = {"w": big[:, ::2], "small": torch.ones(3), "keys": np.arange(30000, dtype=np.int64)[::-1],
       "ro": np.frombuffer(np.arange(20000, dtype=np.int32).tobytes(), np.int32), "n": [1, "x"],
       "empty": torch.zeros(0, 400)}
if dist.get_rank() == 0:
    print(send_obj(obj, 1, lay))
else:
    got = recv_obj(0, lay)
    assert torch.equal(got["w"], big[:, ::2]) and torch.equal(got["small"], torch.ones(3))
    assert isinstance(got["keys"], np.ndarray) and (got["keys"] == np.arange(30000)[::-1]).all()
    assert (got["ro"] == np.arange(20000)).all() and got["n"] == [1, "x"]
    assert got["empty"].shape == (0, 400)
    print("ok")
dist.destroy_process_group()
"""


def test_objects_cross_with_their_large_tensors_raw():
    """send_obj/recv_obj: tensors and arrays of any layout come back equal; the large ones
    travel raw, so the bytes sent are their sizes plus a small pickle."""
    procs = start_ranks(WIRE_PROBE, 2, stderr=subprocess.PIPE)
    (sent, err0), (got, err1) = communicate_all(procs, HANG_S)
    assert got.strip() == "ok", err1
    raw = 100 * 200 * 4 + 30000 * 8 + 20000 * 4
    assert raw < int(sent) < raw + 4096, err0


def _rank_0(monkeypatch, events: list, fail_at: int = -1):
    """A DistributedPlanner over 4 one-iteration rounds, nothing but its feed real: each
    send (slow; round 0's waits, up to 5 s, for round 1 to be planned) and checkpoint
    (every 2) in `events`."""
    import threading
    from types import SimpleNamespace as NS

    from bagpipe_cli.engine.distributed import planner as mod
    from bagpipe_cli.engine.records.trace import NO_TRACE

    ahead = threading.Event()

    def planned_rounds(*_a, **_k):
        for r in range(4):
            events.append(("planned", r))
            if r == 1:
                ahead.set()
            yield NS(r=r, iters=[NS(b=r)], fetch_keys=[]), None

    def send(enc, dst, kind, group):
        time.sleep(0.02)
        if enc == 0:
            ahead.wait(5)
        if enc == fail_at:
            raise RuntimeError("the link broke")
        events.append(("sent", enc, threading.current_thread().name.startswith("plan-sender")))

    wire = NS(encoded=lambda rp: [(0, None if rp is None else rp.r)])
    monkeypatch.setattr(mod, "planned_rounds", planned_rounds)
    monkeypatch.setattr(mod, "PlanWire", NS(of=lambda s, cached: wire))
    p = mod.DistributedPlanner.__new__(mod.DistributedPlanner)
    cfg = NS(loader_workers=1, iterations=4, checkpoint_every=2, eval_every=0)
    p.s = NS(cfg=cfg, ds=None, train_rows=0, offsets=None)
    p.placements, p.tracer, p.progress = [{"compute": [0]}], NO_TRACE, None
    p.layout, p.plans, p.ckpt = NS(trainer_rank=lambda j: j + 1), None, NS(start=0)
    p.start, p.iterations, p._sending = 0, 0, None
    p._send, p._checkpoint = send, lambda b: events.append(("checkpoint", b))
    return p, NS(slots=None, planner=None)


def test_rank_0_plans_while_its_sender_thread_sends_in_order(monkeypatch):
    """Rank 0 plans round r + 1 while one sender thread sends round r: rounds in order, the
    end of the plans last, the checkpoint inside round 2 once round 3 has gone out; an error
    on the sender is raised on the main thread, and no sender thread is left running."""
    import threading

    events: list = []
    p, planning = _rank_0(monkeypatch, events)
    p._feed(planning, 0)
    sent = [e for e in events if e[0] == "sent"]
    assert [e[1] for e in sent] == [0, 1, 2, 3, None] and [e[2] for e in sent] == [True] * 4 + [False]
    assert events.index(("checkpoint", 2)) > events.index(("sent", 3, True))
    assert events.index(("planned", 1)) < events.index(("sent", 0, True))  # planned meanwhile
    assert p.iterations == 4
    events.clear()
    p, planning = _rank_0(monkeypatch, events, fail_at=1)
    with pytest.raises(RuntimeError, match="the link broke"):
        p._feed(planning, 0)
    assert ("sent", 2, True) not in events and ("checkpoint", 2) not in events
    assert not [t for t in threading.enumerate() if t.name.startswith("plan-sender")]


@pytest.mark.skipif(NO_CUDA, reason="no CUDA device")
def test_cuda_trainers_match_the_cpu_engine(tiny_dataset, tmp_path):
    """On GPUs (gloo collectives, and NCCL where there is a GPU per trainer): bagpipe equals
    sync on the same devices bitwise (tests/test_cuda.py); both are within float tolerance of
    the CPU engine (GEMMs differ between cuBLAS and the CPU)."""
    backends = ["gloo"] + (["nccl"] if torch.cuda.device_count() >= 2 else [])
    cpu = train(TrainConfig(data=str(tiny_dataset), system="sync", device="cpu", **KW))
    for backend in backends:
        for system in ("bagpipe", "sync"):
            r = _run(tmp_path, tiny_dataset, f"{system}-{backend}", "--system", system, "--procs", "4",
                     "--device", "cuda", "--backend", backend)
            assert r.returncode == 0, r.stderr[-2000:]
        a = torch.load(tmp_path / f"bagpipe-{backend}.pt")
        b = torch.load(tmp_path / f"sync-{backend}.pt")
        for t, name in enumerate(a["tables"]):
            torch.testing.assert_close(a["tables"][name], cpu.tables[t], rtol=1e-4, atol=1e-5)
            assert torch.equal(a["tables"][name], b["tables"][name])
        s = json.loads((tmp_path / f"bagpipe-{backend}" / "summary.json").read_text())
        assert all(d.startswith("cuda:") for d in s["trainer_devices"])


@pytest.mark.parametrize("system", ["bagpipe", "het"])
def test_a_run_records_the_same_columns_and_keys_in_process_and_over_procs(tiny_dataset, tmp_path, system):
    """One schema for every runner: metrics.csv columns, summary.json and config.json keys."""
    inproc = _run(tmp_path, tiny_dataset, "in", "--system", system)
    procs = _run(tmp_path, tiny_dataset, "procs", "--system", system, "--procs", "4")
    assert inproc.returncode == 0 and procs.returncode == 0, inproc.stderr[-1000:] + procs.stderr[-1000:]
    a, b = (pd.read_csv(tmp_path / n / "metrics.csv") for n in ("in", "procs"))
    assert list(a.columns) == list(b.columns)
    assert a["loss"].tolist() == b["loss"].tolist()
    for name in ("summary.json", "config.json"):
        ja, jb = (json.loads((tmp_path / n / name).read_text()) for n in ("in", "procs"))
        assert list(ja) == list(jb), name
    sa = json.loads((tmp_path / "in" / "summary.json").read_text())
    sb = json.loads((tmp_path / "procs" / "summary.json").read_text())
    assert (sa["runner"], sa["world_size"], sa["transport"]) == ("inproc", 1, "inproc")
    assert (sb["runner"], sb["world_size"], sb["transport"]) == ("distributed", 4, "torch")
    # The memory estimate counts every rank, and the peak beside it is every rank's summed.
    assert (sa["memory"]["processes"], sb["memory"]["processes"]) == (1, 4)
    peaks = [r["peak_rss_mb"] for r in sb["roles"].values()]
    assert len(peaks) == 4 and sb["memory"]["peak_bytes"] == int(sum(peaks) * 2**20)
    assert sb["memory"]["estimate_bytes"] > 3 * sa["memory"]["estimate_bytes"] / 2


def _can_shape() -> bool:
    import shutil

    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


@pytest.mark.extended  # failure handling: make test-all
@pytest.mark.skipif(not _can_shape(), reason="--net-shape needs root, ip and tc")
def test_a_kernel_shaped_network_gives_the_same_parameters(tiny_dataset, tmp_path):
    """--net-shape: every rank in its own network namespace behind a rate-limited link; the
    job is the same job (sync's parameters), and its namespaces are gone afterwards."""
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    r = _run(tmp_path, tiny_dataset, "shaped", "--system", "bagpipe", "--procs", "4",
             "--net-gbps", "1", "--net-shape")
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_parameters(tmp_path / "shaped.pt", train(TrainConfig(data=str(tiny_dataset),
                                                                     system="sync", **KW)))
    s = json.loads((tmp_path / "shaped" / "summary.json").read_text())
    assert s["network_shaping"] == "kernel" and s["network_emulated"] is True
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == before


def test_net_shape_is_refused_clearly(tiny_dataset, tmp_path, monkeypatch):
    r = _run(tmp_path, tiny_dataset, "x", "--net-shape", "--net-gbps", "1")
    assert r.returncode == 2 and "--net-shape shapes the links of the local processes" in r.stderr
    from click.testing import CliRunner

    from bagpipe_cli.cli import cli

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    out = CliRunner().invoke(cli, ["train", str(tiny_dataset), *ARGS, "--procs", "4", "--net-shape",
                                   "--net-gbps", "1", "--out", str(tmp_path / "y")])
    assert out.exit_code == 2 and "--net-shape needs root" in out.output
    assert not (tmp_path / "y").exists()

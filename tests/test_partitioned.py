"""Bagpipe's physically partitioned cache (engine/planning/partition.py, engine/systems/partitioned.py):
the partition's definitions on random batches, the same plan in any number of slices
(--planners), and runs bitwise equal to sync on data made to have rows read by one trainer,
by a few and by all, and a row whose home moves from round to round."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_same_parameters, run_cli

from bagpipe_cli.data import DatasetWriter, TableSpec
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.planning.feed import key_batches
from bagpipe_cli.engine.planning.oracle import Oracle
from bagpipe_cli.engine.planning.partition import flows
from bagpipe_cli.engine.planning.plans import NO_SYNC, SYNC_LATER, SYNC_NOW
from bagpipe_cli.engine.planning.slices import ACCESSES_PER_PLANNER, default_planners
from bagpipe_cli.engine.setup import prepare
from bagpipe_cli.files.atomic import atomic_dir


def _plans(batches, rows, n, lookahead=8, round_len=2):
    return [p for rp in Oracle(rows, lookahead, round_len, n, None, grow=True).plan(batches)
            for p in rp.iters]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_the_partition_follows_its_definitions(n):
    """Per row of U_b: its writers are the trainers whose samples read it, in order; its
    home is one of them, one that reads it at b+1 too where there is one; its source is its
    home at its last use, or the servers where it was fetched; what a trainer sends, another
    receives; a no_sync row's home is its one user and moves nothing."""
    rng = np.random.default_rng(n)
    per, tables, rows = 16, 3, 400
    batches = [(rng.zipf(1.2, size=per * n * tables) % rows).astype(np.int64) for _ in range(30)]
    home, last = {}, {}
    for p in _plans(batches, rows, n, lookahead=8):
        part = p.part
        trainer = np.arange(len(p.inverse)) // (per * tables)
        nxt = batches[p.b + 1].reshape(n, -1) if p.b + 1 < len(batches) else None
        at = 0
        for pos, key in enumerate(p.uniq):
            writers = sorted(set(trainer[p.inverse == pos].tolist()))
            assert part.writers[at:at + part.count[pos]].tolist() == writers
            at += part.count[pos]
            assert part.home[pos] in writers
            again = [t for t in writers if nxt is not None and key in nxt[t]]
            if again:
                assert part.home[pos] in again
            fetched = key not in last or p.b - last[key] > 8  # the oracle's fetch rule
            assert part.src[pos] == (-1 if fetched else home[key])
            home[key], last[key] = part.home[pos], p.b
        f = flows(part, p.row_class, n)
        for a, b in [(f.delivered_sent, f.delivered_received), (f.now_sent, f.now_received),
                     (f.later_sent, f.later_received)]:
            assert a.sum() == b.sum()
        solo = p.row_class == NO_SYNC
        assert (part.count[solo] == 1).all() and (part.home[solo] == p.owner[solo]).all()
        assert f.now_sent.sum() == (part.count - 1)[p.row_class == SYNC_NOW].sum()
        assert f.later_sent.sum() == (part.count - 1)[p.row_class == SYNC_LATER].sum()


def _facts(p, i: int, n: int) -> dict:
    """What trainer i's PartitionedCache reads of an iteration's plan, by key: its rows with
    their sources, homes and classes, the rows it was home of, the (row, writer) pairs it
    delivers and those it sums, its evictions, each of its accesses' row, and the counts."""
    part, row = p.part, p.part.pair_row
    mine = part.rows_of(i)
    out = np.flatnonzero((part.src[row] == i) & (part.writers != i))
    summed = np.flatnonzero(part.home[row] == i)
    evicted = p.evict_keys[part.home[np.searchsorted(p.uniq, p.evict_keys)] == i]
    facts = {"reads": p.uniq[mine], "src": part.src[mine], "home": part.home[mine],
             "class": p.row_class[mine], "homed": p.uniq[part.src == i],
             "delivered": p.uniq[row[out]], "to": part.writers[out], "summed": p.uniq[row[summed]],
             "from": part.writers[summed], "summed class": p.row_class[row[summed]],
             "evicts": evicted, "accesses": p.uniq[p.accesses_of(i, 1, n)]}
    return {k: v.tolist() for k, v in facts.items()} | {
        "counts": (p.unique_rows, p.fetched, p.sync_now, p.sync_later, p.no_sync)}


def _homed(p, i: int) -> np.ndarray:
    """Keys of the rows trainer i is home of before or after b."""
    return p.uniq[(p.part.src == i) | (p.part.home == i)]


@pytest.mark.parametrize("n", [2, 5])
def test_a_trainer_receives_only_its_rows_and_reads_what_the_whole_plan_says(n):
    """Rank 0 sends trainer i of a partitioned cache only the rows it reads or is home of
    (distributed/rounds.py's `trainer_round`), and of those it reads not even the keys: its
    samples have them. Once `RoundMaker` has put them back, everything its PartitionedCache
    reads of the plan is what the whole plan says (so the run stays bitwise: the --procs
    tests here and in test_distributed.py), and the round's counts are the global ones."""
    from bagpipe_cli.engine.distributed.rounds import PlanWire, RoundMaker, shared_round
    from bagpipe_cli.engine.distributed.shares import trainer_sizes
    from bagpipe_cli.engine.distributed.wire import decode, encode

    rng = np.random.default_rng(n)
    per, tables, rows = 16, 3, 400
    batches = [(rng.zipf(1.2, size=per * n * tables) % rows).astype(np.int64) for _ in range(12)]
    width = per * tables  # a trainer's accesses of a batch
    wire = PlanWire(True, True, rows, trainers=n)
    for rp in Oracle(rows, 6, 2, n, None, grow=True).plan(batches):
        sent = wire.sends(rp)
        assert [j for j, _ in sent] == list(range(n))
        assert wire.nbytes(rp) == sum(encode(x).nbytes for _, x in sent)
        whole = encode(shared_round(rp, True, True, np.int32)).nbytes
        sizes = [trainer_sizes(p, n) for p in rp.iters]
        for i, plan in sent:
            got = decode(encode(plan))
            assert encode(got).nbytes < whole
            assert not len(got.fetch_keys) and got.fetch_count == len(rp.fetch_keys)
            for k, (p, q) in enumerate(zip(rp.iters, got.iters, strict=True)):
                # on the wire: the keys of the rows it is home of and does not read, nothing more
                assert q.uniq.tolist() == np.setdiff1d(_homed(p, i), p.uniq[p.part.rows_of(i)]).tolist()
                assert [len(q.row_class), len(q.uniq), len(q.part.writers), len(q.evict_keys)] == \
                    [int(x[i]) for x in sizes[k]]
                assert q.part.home.dtype == np.int8 and not len(q.slots) and not len(q.inverse)
            made = RoundMaker(lambda b, i=i: (batches[b][i * width:(i + 1) * width], None, None), i, rows)(got)
            for p, q in zip(rp.iters, made.plan.iters, strict=True):
                assert q.uniq.tolist() == np.union1d(p.uniq[p.part.rows_of(i)], _homed(p, i)).tolist()
                assert _facts(q, i, n) == _facts(p, i, n)


def test_the_rows_every_trainer_reads_spread_their_homes_over_the_trainers():
    """The hot head (every row read by every trainer at every iteration) is homed at
    key mod N, as a sum's chunks spread: each trainer homes a quarter of it, and no row moves."""
    n, keys = 4, np.arange(64)
    batches = [np.tile(keys, n) for _ in range(6)]
    for p in _plans(batches, 64, n):
        assert (p.part.home == p.uniq % n).all()
        if p.b:
            assert (p.part.src == p.part.home).all()


def _same_rounds(a, b) -> None:
    """Two planners' rounds are equal in every field, the Partitions' dtypes included."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in ("r", "fetch_keys", "fetch_slots", "fetch_owner", "resident_after_insert", "capacity"):
            assert np.array_equal(getattr(x, f), getattr(y, f)), f
        for p, q in zip(x.iters, y.iters, strict=True):
            for f in ("b", "uniq", "inverse", "slots", "fetched", "evict_keys", "evict_slots",
                      "sync_now", "sync_later", "no_sync", "no_sync_owner_rows", "row_class",
                      "owner", "private_fetched"):
                u, v = getattr(p, f), getattr(q, f)
                assert (u is None) == (v is None) and np.array_equal(u, v), f
            assert (p.part is None) == (q.part is None)
            for f in ("count", "writers", "home", "src") if p.part is not None else ():
                u, v = getattr(p.part, f), getattr(q.part, f)
                assert u.dtype == v.dtype and np.array_equal(u, v), f


@pytest.mark.parametrize("n,lookahead,round_len,capacity,lrpp", [
    (1, 4, 1, None, True), (2, 8, 2, None, True), (3, 6, 3, 5000, True), (8, 16, 4, None, True),
    (4, 1, 1, None, False)])
def test_the_plan_is_the_same_in_any_number_of_slices(n, lookahead, round_len, capacity, lrpp):
    """--planners K: K workers each plan the rows of (key // 32) mod K == s (engine/planning/slices.py),
    on a thread pool or one after the other; every array of every round is the one worker's."""
    rng = np.random.default_rng(n)
    rows = 6000
    batches = [np.minimum((rng.pareto(1.0, 96 * n) * 8).astype(np.int64), rows - 1) for _ in range(24)]

    def rounds(k, threads=True):
        o = Oracle(rows, lookahead, round_len, n, capacity, grow=capacity is None, lrpp=lrpp,
                   planners=k, threads=threads)
        out = list(o.plan(iter(batches)))
        assert o.planners == k and (o.workers.cpu > 0).all() and o.serial_cpu > 0
        return out

    one = rounds(1)
    for k, threads in [(2, True), (3, False), (4, True), (7, False)]:
        _same_rounds(one, rounds(k, threads))


def test_the_default_number_of_planners_grows_with_the_batch_and_stops_at_the_cores():
    assert default_planners(4 * 2048 * 26) == 1  # 4 trainers of 2,048 samples, 26 tables
    assert default_planners(ACCESSES_PER_PLANNER) == 1
    assert default_planners(ACCESSES_PER_PLANNER + 1) == 2
    assert [default_planners(n * 2048 * 26) for n in (8, 16, 32, 64)] == [2, 4, 7, 13]
    assert default_planners(64 * 2048 * 26, cores=2) == 2


def test_bagpipe_with_sliced_planning_equals_sync_and_resumes_bitwise(tmp_path):
    """In-process, --planners 3 at 3 trainers: sync's parameters bitwise; its summary names the
    workers and their CPU time; a checkpoint made with 3 workers resumes with 2, bitwise."""
    data = tmp_path / "shapes"
    _shapes(data, 3, 16)
    kw = dict(data=str(data), batch_size=6, iterations=16, lookahead=4, round=2, trainers=3,
              servers=2, eval_rows=0, optimizer="adagrad", lr=0.1, seed=3)
    a = train(TrainConfig(system="bagpipe", planners=3, checkpoint_every=8,
                          checkpoint_dir=str(tmp_path / "ck"), **kw))
    assert_same_parameters(a, train(TrainConfig(system="sync", **kw)))
    planner = a.summary["roles"]["planner"]
    assert planner["planners"] == 3 and len(planner["worker_cpu_ms_per_batch"]) == 3
    assert min(planner["worker_cpu_ms_per_batch"]) > 0 and planner["serial_cpu_ms_per_batch"] > 0
    b = train(TrainConfig(system="bagpipe", planners=2, resume=str(tmp_path / "ck" / "ckpt-00000008"), **kw))
    assert_same_parameters(a, b)


def _shapes(path, n: int, batches: int) -> None:
    """2 samples a trainer. Table `hot`: row 0, read by every sample (every trainer). Table
    `few`: a row per pair of trainers, new every 3 batches. Table `own`: a row per sample,
    read once (no_sync). Table `moving`: row 0 read by one trainer alone, which changes
    every 2 batches (a round), else a row of its own per sample."""
    bs = 2 * n
    rows = batches * bs
    trainer = (np.arange(rows) % bs) // 2
    batch = np.arange(rows) // bs
    hot = np.zeros(rows, np.int64)
    few = (trainer // 2) + (n // 2 + 1) * (batch // 3)
    own = np.arange(rows)
    moving = np.where(trainer == (batch // 2) % n, 0, 1 + np.arange(rows))
    sparse = np.stack([hot, few, own, moving], axis=1)
    with atomic_dir(path) as tmp:
        w = DatasetWriter(tmp, [TableSpec(t, int(sparse[:, k].max()) + 1) for k, t in
                                enumerate(["hot", "few", "own", "moving"])], ["x"], "y")
        w.write(np.linspace(-1, 1, rows, dtype=np.float32)[:, None], sparse,
                (np.arange(rows) % 3 == 0).astype(np.float32))
        w.finish(name="shapes", source={"kind": "test"})


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.extended),
                               pytest.param(8, marks=pytest.mark.extended)])
def test_partitioned_rows_read_by_one_few_and_all_trainers_equal_sync(tmp_path, n):
    """--procs with the plan in min(n, 4) slices (--planners): sync's parameters bitwise."""
    data = tmp_path / "shapes"
    _shapes(data, n, 12)
    kw = dict(data=str(data), batch_size=2 * n, iterations=12, lookahead=4, round=2,
              trainers=n, servers=2, eval_rows=0, optimizer="adagrad", lr=0.1, seed=3)
    s = prepare(TrainConfig(system="bagpipe", **kw))
    plans = [p for rp in s.spec.plan(s, 0).planner.plan(
        key_batches(s.ds, s.cfg, s.train_rows, s.offsets)) for p in rp.iters]
    counts = np.concatenate([p.part.count for p in plans])
    assert (counts == 1).any() and (counts == n).any()
    if n > 2:
        assert ((counts > 1) & (counts < n)).any()
    moving = int(s.offsets[3])  # the key of table `moving`'s row 0
    homes = [int(p.part.home[np.searchsorted(p.uniq, moving)]) for p in plans]
    assert homes[0] == 0 and homes[2] == 1 and homes[4] == 2 % n  # it moves round to round
    args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items() if k != "data"]
    r = run_cli("train", str(data), *args, "--system", "bagpipe", "--procs", str(n + 3),
                "--threads", "1", "--planners", str(min(n, 4)), "--out", str(tmp_path / "run"), "--save-model",
                str(tmp_path / "run.pt"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_parameters(tmp_path / "run.pt", train(TrainConfig(system="sync", **kw)))


@pytest.fixture(scope="module")
def criteo_log(tmp_path_factory):
    """The real Criteo Kaggle log's first 1,999 rows, preprocessed."""
    src = Path(__file__).resolve().parent / "data" / "real" / "criteo_kaggle_train_head1999.tsv"
    out = tmp_path_factory.mktemp("criteo") / "criteo"
    r = run_cli("preprocess", "criteo", str(src), "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.mark.parametrize("n,k,procs", [(3, 4, False), pytest.param(2, 2, False, marks=pytest.mark.extended),
                                       pytest.param(3, 2, True, marks=[pytest.mark.slow, pytest.mark.extended]),
                                       pytest.param(4, 4, True, marks=[pytest.mark.slow, pytest.mark.extended])])
def test_sliced_planning_on_a_real_log_equals_sync(criteo_log, tmp_path, n, k, procs):
    """A real log's 26 tables, 33 samples a trainer, bagpipe planned by k workers: sync's
    parameters bitwise, in-process and over --procs (one torch thread in both)."""
    kw = dict(batch_size=33 * n, iterations=10, lookahead=4, trainers=n, servers=2, eval_rows=0,
              threads=1, seed=5)
    sync = train(TrainConfig(data=str(criteo_log), system="sync", **kw))
    if not procs:
        assert_same_parameters(train(TrainConfig(data=str(criteo_log), system="bagpipe", planners=k, **kw)), sync)
        return
    args = [f"--{a.replace('_', '-')}={v}" for a, v in kw.items()]
    r = run_cli("train", str(criteo_log), *args, "--system", "bagpipe", "--planners", str(k),
                "--procs", str(n + 3), "--out", str(tmp_path / "run"), "--save-model", str(tmp_path / "run.pt"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert_same_parameters(tmp_path / "run.pt", sync)

"""The central tests: Bagpipe gives the same parameters as synchronous training."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers import assert_same_parameters, user_warnings
from hypothesis import given, settings
from hypothesis import strategies as st

from bagpipe_cli.cli import cli
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.planning.oracle import Oracle
from bagpipe_cli.engine.registry import SYSTEMS
from bagpipe_cli.errors import ConfigError


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("trainers,servers", [(1, 1), (2, 3), (4, 2)])
def test_bagpipe_equals_sync(tiny_dataset, optimizer, trainers, servers):
    kw = dict(data=str(tiny_dataset), batch_size=256, iterations=40, lookahead=5,
              optimizer=optimizer, trainers=trainers, servers=servers, seed=3,
              dense_optimizer="adam", dense_lr=0.01, eval_rows=2000)
    sync = train(TrainConfig(system="sync", **kw))
    bag = train(TrainConfig(system="bagpipe", **kw))
    assert_same_parameters(sync, bag)
    # The parameters really changed, and the cache saved fetches.
    assert sync.metrics["loss"].iloc[0] != sync.metrics["loss"].iloc[-1]
    assert bag.summary["rows_fetched"] < sync.summary["rows_fetched"]
    # every row the logical cache fetched goes back once; each trainer fetches what it reads
    assert bag.summary["rows_written_back"] == bag.summary["rows_fetched_once"]
    assert bag.summary["rows_fetched"] >= bag.summary["rows_fetched_once"]
    assert (bag.summary["rows_fetched"] > bag.summary["rows_fetched_once"]) == (trainers > 1)


@pytest.mark.parametrize("model", ["wdl", "deepfm", "dcn"])
def test_bagpipe_equals_sync_other_models(tiny_dataset, model):
    kw = dict(data=str(tiny_dataset), model=model, batch_size=128, iterations=25, lookahead=3,
              optimizer="adagrad", trainers=2, eval_rows=1000)
    assert_same_parameters(train(TrainConfig(system="sync", **kw)), train(TrainConfig(system="bagpipe", **kw)))


def test_results_do_not_depend_on_lookahead_round_or_servers(tiny_dataset):
    base = dict(data=str(tiny_dataset), batch_size=256, iterations=30, eval_rows=1000)
    a = train(TrainConfig(system="bagpipe", lookahead=2, round=1, servers=1, **base))
    b = train(TrainConfig(system="bagpipe", lookahead=12, round=6, servers=4, **base))
    assert_same_parameters(a, b)
    assert b.summary["rows_fetched"] < a.summary["rows_fetched"]


def test_training_learns(tiny_dataset):
    r = train(TrainConfig(data=str(tiny_dataset), batch_size=256, iterations=150, lookahead=8,
                          optimizer="adagrad", lr=0.05, dense_optimizer="adam", dense_lr=0.005,
                          eval_rows=4000))
    assert r.summary["eval_auc"] > 0.65
    assert r.metrics["loss"].iloc[-20:].mean() < r.metrics["loss"].iloc[:5].mean()


def test_fetch_counts_match_the_definition(tiny_dataset):
    """A row of U_b is fetched iff it is in none of U_{b-L} ... U_{b-1}."""
    from bagpipe_cli.data import open_dataset
    from bagpipe_cli.data.format import table_offsets

    L, B, n = 4, 256, 50
    r = train(TrainConfig(data=str(tiny_dataset), batch_size=B, iterations=n, lookahead=L,
                          eval_rows=1000))
    ds = open_dataset(tiny_dataset)
    off = table_offsets(ds.meta.cardinalities)
    sets = [set((ds.sparse_block(b * B, (b + 1) * B) + off).ravel().tolist()) for b in range(n)]
    expected = [len([k for k in s if not any(k in sets[j] for j in range(max(0, b - L), b))])
                for b, s in enumerate(sets)]
    assert r.metrics["rows_fetched"].tolist() == expected
    assert r.metrics["unique_rows"].tolist() == [len(s) for s in sets]


@pytest.mark.parametrize("lookahead", [1, 6, 40])
def test_fetch_counts_equal_profile(tiny_dataset, lookahead):
    """`bagpipe train` fetches exactly what `bagpipe profile`'s bagpipe policy predicts."""
    from bagpipe_cli.data import open_dataset
    from bagpipe_cli.profile import batch_trace, simulate_bagpipe

    B, n = 200, 80
    r = train(TrainConfig(data=str(tiny_dataset), batch_size=B, iterations=n, lookahead=lookahead,
                          eval_rows=1000))
    sim = simulate_bagpipe(batch_trace(open_dataset(tiny_dataset), B), lookahead)
    assert r.metrics["rows_fetched"].tolist() == sim.fetched_per_batch[:n].tolist()


def test_train_cli_writes_run_and_model(tiny_dataset, tmp_path):
    args = ["train", str(tiny_dataset), "--batch-size", "256", "--iterations", "12",
            "--lookahead", "4", "--eval-rows", "1000"]
    r1 = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "a"), "--save-model", str(tmp_path / "a.pt")])
    assert r1.exit_code == 0, r1.output
    r2 = CliRunner().invoke(cli, [*args, "--system", "sync", "--out", str(tmp_path / "b"),
                                  "--save-model", str(tmp_path / "b.pt")])
    assert r2.exit_code == 0, r2.output
    assert not user_warnings(r1.output)  # bagpipe reads --lookahead; sync does not, and says so
    readers = ", ".join(s.name for s in SYSTEMS.values() if "lookahead" in s.reads)
    assert "bagpipe" in readers and "sync" not in readers
    assert ("Warning: --lookahead 4 is ignored: --system sync does not read it "
            f"(read by {readers})") in r2.output
    a = torch.load(tmp_path / "a.pt")
    assert list(a["tables"]) == ["C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8"]
    assert a["tables"]["C1"].shape == (1000, 16)
    assert_same_parameters(a, tmp_path / "b.pt")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert summary["schema_version"] == 1 and summary["network_emulated"] is False
    assert config["train"]["lookahead"] == 4 and "torch" in config["environment"]
    r3 = CliRunner().invoke(cli, [*args, "--threads", "1", "--out", str(tmp_path / "c")])
    assert r3.exit_code == 0, r3.output
    assert json.loads((tmp_path / "c" / "config.json").read_text())["environment"]["torch_threads"] == 1
    metrics = (tmp_path / "a" / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 13
    for col in ["loss", "data", "prefetch_wait", "forward", "backward", "sync", "optimizer",
                "rows_fetched", "rows_written_back", "cache_hits"]:
        assert col in metrics[0].split(",")


def test_a_run_records_its_compute_in_cpu_time_beside_wall_time(tiny_dataset):
    """On one torch thread each compute phase's CPU time is that thread's: at most its wall
    time (a tolerance for the clocks' reads), no worker counted; the summary has both."""
    r = train(TrainConfig(data=str(tiny_dataset), system="sync", batch_size=256, iterations=12,
                          eval_rows=1000, threads=1))
    m, tolerance = r.metrics, 50e-6  # seconds, per phase of the one thread
    for phase in ("forward", "backward", "optimizer"):
        assert (m[f"{phase}_cpu"] > 0).all(), phase
        assert (m[f"{phase}_cpu"] <= m[phase] + tolerance).all(), phase
    assert (m["worker_cpu"] == 0).all() and (m["compute_threads"] == 1).all()
    c = r.summary["median_compute_ms"]
    assert 0 < c["cpu"] <= c["wall"] + 3e3 * tolerance and c["cpu_all_threads"] == c["cpu"]
    assert c["compute_threads"] == 1
    assert set(r.summary["median_cpu_ms"]) == {"forward_cpu", "backward_cpu", "optimizer_cpu",
                                               "worker_cpu"}


def test_the_cpu_clock_finds_torchs_workers():
    """With two torch threads the clock finds the intra-op worker that a parallel op runs on,
    and counts the CPU it spends apart from the calling thread's."""
    from bagpipe_cli.engine.trainer.staging import CpuClock

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        clock = CpuClock()
        clock.ready()
        assert len(clock.workers) == 1
        before = clock.read()
        x = torch.ones(1 << 20)
        for _ in range(20):
            x.mul_(1.0)
        own, workers = clock.spent(before, clock.read())
        assert own > 0 and workers > 0
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("args, warning, warnings", [
    (["--system", "lru", "--cache-rows", "2000", "--round", "2"],
     "--round 2 is ignored: --system lru with --cache-rows does not read it (read by bagpipe)", 1),
    (["--system", "bagpipe", "--staleness", "2", "--hot-sample", "0.5"],
     "--hot-sample 0.5 is ignored: --system bagpipe does not read it (read by "
     + ", ".join(s.name for s in SYSTEMS.values() if "hot_sample" in s.reads) + ")", 2),
    (["--system", "het", "--staleness", "2", "--lookahead", "16"], "--lookahead 16 is ignored", 1),
])
def test_train_warns_of_a_setting_its_system_does_not_read(tiny_dataset, tmp_path, args, warning,
                                                           warnings):
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--batch-size", "256", "--iterations",
                                 "2", "--eval-rows", "0", *args, "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert f"Warning: {warning}" in r.output
    assert len(user_warnings(r.output)) == warnings


@pytest.mark.parametrize(
    "args, option",
    [
        (["--cache-rows", "10"], "--cache-rows"),
        (["--lookahead", "0"], "--lookahead"),
        (["--batch-size", "250", "--trainers", "3"], "--trainers"),
        (["--model", "transformer"], "--model"),
        (["--system", "magic"], "--system"),
        (["--round", "4", "--lookahead", "4"], "--round"),
        (["--optimizer", "rmsprop"], "--optimizer"),
        (["--net-gbps", "0"], "--net-gbps"),
        (["--batch-size", "100000"], "--batch-size"),
        (["--threads", "0"], "--threads"),
        (["--bottom-mlp", "64,x"], "--bottom-mlp"),
        (["--top-mlp", "0"], "--top-mlp"),
    ],
)
def test_train_bad_options(tiny_dataset, tmp_path, args, option):
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--iterations", "5", "--out",
                                 str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert option in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_train_on_non_dataset(tmp_path):
    r = CliRunner().invoke(cli, ["train", str(tmp_path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "not a bagpipe dataset" in r.output


def test_network_model():
    n = NetworkModel(gbps=8.0, latency_us=50)
    assert n.transfer_seconds(1_000_000) == pytest.approx(50e-6 + 1e-3)
    assert n.allreduce_seconds(4_000_000, 4) == pytest.approx(6 * (50e-6 + 1e-3))
    assert NetworkModel().transfer_seconds(10**9) == 0.0
    with pytest.raises(ConfigError, match="--net-latency-us"):
        NetworkModel(latency_us=-1)


def test_emulated_network_delays_transfers(tiny_dataset):
    r = train(TrainConfig(data=str(tiny_dataset), system="sync", batch_size=256, iterations=10,
                          net_gbps=1.0, net_latency_us=2000, eval_rows=1000))
    assert r.summary["network_emulated"] is True
    # every fetch and every write-back holds the server link for at least the latency
    assert r.summary["roles"]["server0"]["busy_s"] >= 20 * 2000e-6
    assert r.metrics["prefetch_wait"].min() >= 2000e-6


# ---------------------------------------------------------------- oracle properties


def _simulate(trace, L, C, N, capacity):
    """Run the oracle on a trace and replay its plan with a version counter per row.

    The replay follows the engine's timing: round r+1 is fetched from the servers at the
    start of round r, write-backs land in order, a read must see the latest version.
    """
    total = max(max(b) for b in trace) + 1
    o = Oracle(total, L, C, N, capacity)
    true = np.zeros(total, np.int64)  # versions as synchronous training would have them
    server = np.zeros(total, np.int64)
    cache = np.full(capacity, -1, np.int64)
    resident = set()
    plans = list(o.plan(np.asarray(b, np.int64) for b in trace))
    staged = {0: server[plans[0].fetch_keys].copy()}
    fetched = 0
    for i, rp in enumerate(plans):
        assert not set(rp.fetch_keys.tolist()) & resident, "fetched a resident row"
        cache[rp.fetch_slots] = staged.pop(rp.r)
        resident |= set(rp.fetch_keys.tolist())
        assert len(resident) <= capacity and rp.resident_after_insert <= o.peak_resident
        fetched += len(rp.fetch_keys)
        if i + 1 < len(plans):
            staged[plans[i + 1].r] = server[plans[i + 1].fetch_keys].copy()
        for p in rp.iters:
            assert set(p.uniq.tolist()) <= resident
            np.testing.assert_array_equal(cache[p.slots], true[p.uniq])  # never stale
            true[p.uniq] += 1
            cache[p.slots] += 1
            server[p.evict_keys] = cache[p.evict_slots]
            resident -= set(p.evict_keys.tolist())
            assert p.sync_now + p.sync_later + p.no_sync == len(p.uniq)
    assert not resident  # everything written back at the end
    np.testing.assert_array_equal(server, true)
    return fetched, o.peak_resident


# Lookahead, trainers, seed, batches and Zipf-like skew of a random trace.
TRACES = dict(L=st.integers(1, 6), N=st.integers(1, 4), seed=st.integers(0, 10_000),
              n_batches=st.integers(1, 12), alpha=st.floats(0.5, 2.0))


def _random_trace(L, N, seed, n_batches, alpha, max_id):
    """Batches of 3 skewed ids per trainer, and a round length valid for L."""
    rng = np.random.default_rng(seed)
    C = int(rng.integers(1, max(1, (L + 1) // 2) + 1))
    ids = np.minimum((rng.pareto(alpha, (n_batches, 3 * N)) * 3).astype(np.int64), max_id)
    return [b.tolist() for b in ids], C


@settings(max_examples=60, deadline=None)
@given(**TRACES)
def test_oracle_never_stale_never_refetches(L, N, seed, n_batches, alpha):
    trace, C = _random_trace(L, N, seed, n_batches, alpha, max_id=40)
    fetched, peak = _simulate(trace, L, C, N, capacity=200)
    # fetch count by the definition: not used in the previous L batches
    expect = sum(len({k for k in set(b) if not any(k in set(trace[j]) for j in range(max(0, i - L), i))})
                 for i, b in enumerate(trace))
    assert fetched == expect
    # the oracle's peak is enough: the plan replays with exactly that capacity
    assert _simulate(trace, L, C, N, capacity=max(peak, 1))[1] == peak


def _replay_partitioned(trace, L, C, N):
    """Replay a plan trainer by trainer with the physically partitioned cache of a
    torch.distributed run: trainer i inserts only `fetch_for(i)`; sync_now/sync_later rows are
    updated on every trainer, no_sync rows by their user; evicted rows are written back by
    their user (no_sync) or by trainer key % N. Every trainer must read the true version of
    every row its own samples use."""
    from bagpipe_cli.engine.planning.plans import NO_SYNC

    total = max(max(b) for b in trace) + 1
    o = Oracle(total, L, C, N, 500)
    plans = list(o.plan(np.asarray(b, np.int64) for b in trace))
    true = np.zeros(total, np.int64)
    server = np.zeros(total, np.int64)
    held = [dict() for _ in range(N)]  # trainer -> {key: version it holds}

    def fetch(rp):  # what each trainer receives for round rp: the servers' values now
        return [dict(zip(k.tolist(), server[k].tolist(), strict=True)) for k in (rp.fetch_for(i)[0] for i in range(N))]

    staged = fetch(plans[0])
    fetched = np.zeros(N, np.int64)
    for r, rp in enumerate(plans):
        for i in range(N):
            assert not set(staged[i]) & set(held[i]), "fetched a row the trainer holds"
            held[i].update(staged[i])
            fetched[i] += len(staged[i])
        if r + 1 < len(plans):  # the next round is fetched now, after every earlier write-back
            staged = fetch(plans[r + 1])
        for p in rp.iters:
            per = len(p.inverse) // N
            for i in range(N):
                mine = np.unique(p.uniq[p.inverse[i * per:(i + 1) * per]])
                assert all(held[i].get(k) == true[k] for k in mine.tolist()), "read a stale row"
            true[p.uniq] += 1
            for pos, k in enumerate(p.uniq.tolist()):
                if p.row_class[pos] == NO_SYNC:
                    held[p.owner[pos]][k] += 1
                else:  # synchronised: every trainer holds it and applies the summed gradient
                    for i in range(N):
                        held[i][k] += 1
            for k in p.evict_keys.tolist():
                pos = int(np.searchsorted(p.uniq, k))
                writer = p.owner[pos] if p.row_class[pos] == NO_SYNC else k % N
                server[k] = held[writer][k]
                for i in range(N):
                    held[i].pop(k, None)
        for i in range(N):  # per-iteration counts add up to what the trainer fetched
            assert sum(p.fetched_by(i) for p in rp.iters) == len(rp.fetch_for(i)[0])
    assert not any(held)
    np.testing.assert_array_equal(server, true)
    return fetched, sum(len(rp.fetch_keys) for rp in plans)


@settings(max_examples=60, deadline=None)
@given(**TRACES)
def test_partitioned_cache_never_reads_a_stale_row(L, N, seed, n_batches, alpha):
    trace, C = _random_trace(L, N, seed, n_batches, alpha, max_id=60)
    fetched, logical = _replay_partitioned(trace, L, C, N)
    assert (fetched <= logical).all()
    if N == 1:  # one trainer fetches every row
        assert fetched[0] == logical


def test_private_rows_go_to_their_user_only():
    # 2 trainers x 2 samples x 1 table, L = 2. Batch 0: trainer 0 uses {1, 2}, trainer 1 {2, 3};
    # batch 1: trainer 0 {1, 4}, trainer 1 {5}. 3 is used once by trainer 1 and evicted: private;
    # 2 is used by both: every trainer fetches it; 1 is used again: every trainer.
    trace = [np.array([1, 2, 2, 3]), np.array([1, 4, 5, 5])]
    rp = next(Oracle(10, 2, 1, 2, 16).plan(iter(trace)))
    assert rp.fetch_keys.tolist() == [1, 2, 3]
    assert rp.fetch_owner.tolist() == [-1, -1, 1]
    assert rp.fetch_for(0)[0].tolist() == [1, 2] and rp.fetch_for(1)[0].tolist() == [1, 2, 3]
    assert rp.iters[0].private_fetched.tolist() == [0, 1]
    assert [rp.iters[0].fetched_by(i) for i in range(2)] == [2, 3]


def test_oracle_rejects_capacity_below_peak():
    trace = [np.arange(i, i + 10) for i in range(20)]
    with pytest.raises(ConfigError, match="--cache-rows"):
        list(Oracle(40, 4, 1, 1, capacity=9).plan(iter(trace)))


def test_a_growing_oracle_plans_the_same_rows_in_more_slots_as_it_needs_them():
    """Without --cache-rows the oracle needs no pass first: it takes more slots when a round
    needs them (an eighth more at least), and each round says the capacity its slots need.
    The rows fetched and evicted are the fixed-capacity oracle's; no slot is out of range
    or held by two rows at once."""
    rng = np.random.default_rng(4)
    trace = [rng.zipf(1.3, 64) % 500 for _ in range(60)]
    fixed = list(Oracle(500, 8, 2, 2, capacity=500).plan(iter(trace)))
    grown = list(Oracle(500, 8, 2, 2, capacity=None, grow=True).plan(iter(trace)))
    caps = [rp.capacity for rp in grown]
    assert caps == sorted(caps) and len(set(caps)) >= 3  # it grew, round by round
    holder: dict[int, int] = {}
    for a, b in zip(fixed, grown, strict=True):
        assert a.fetch_keys.tolist() == b.fetch_keys.tolist()
        assert (b.fetch_slots < b.capacity).all()
        for k, slot in zip(b.fetch_keys.tolist(), b.fetch_slots.tolist(), strict=True):
            assert slot not in holder.values()
            holder[k] = slot
        for pa, pb in zip(a.iters, b.iters, strict=True):
            assert pa.evict_keys.tolist() == pb.evict_keys.tolist()
            assert (pb.slots == [holder[k] for k in pb.uniq.tolist()]).all()
            for k in pb.evict_keys.tolist():
                del holder[k]
    o = Oracle(500, 8, 2, 2, capacity=None, grow=True)
    list(o.plan(iter(trace)))
    assert o.peak_resident <= o.capacity <= o.peak_resident * 9 // 8 + 1


def test_bagpipe_plans_without_a_pass_over_the_run_and_equals_sync(tiny_dataset, monkeypatch):
    """Only the rounds are planned, as training goes (no whole-run pass: reading the run's
    keys up front fails here); the cache grows to the run's peak and the parameters are
    sync's."""
    from bagpipe_cli.engine.planning import builders as planner

    def no_pass(*a, **k):
        raise AssertionError("a pass over the whole run")

    kw = dict(data=str(tiny_dataset), batch_size=256, iterations=30, lookahead=8, trainers=2,
              optimizer="adagrad", eval_rows=2000)
    sync = train(TrainConfig(system="sync", **kw))
    monkeypatch.setattr(planner, "key_batches", no_pass)
    bag = train(TrainConfig(system="bagpipe", **kw))
    assert_same_parameters(sync, bag)
    peak = bag.summary["peak_resident_rows"]
    assert bag.summary["bagpipe_peak_rows"] == peak
    assert peak <= bag.summary["cache_rows"] <= peak * 9 // 8 + 1


def test_sync_lists_on_a_hand_worked_trace():
    # keys per sample, 2 trainers x 2 samples x 1 table; L = 2
    trace = [np.array([1, 2, 2, 3]), np.array([1, 4, 5, 5]), np.array([6, 6, 6, 6])]
    plans = [p for rp in Oracle(10, 2, 1, 2, 16).plan(iter(trace)) for p in rp.iters]
    p0 = plans[0]
    # U_0 = {1,2,3}; U_1 = {1,4,5}: sync_now = {1}; 2 is used by both trainers (samples 1|2)
    # and not again -> sync_later; 3 by trainer 1 only and evicted -> no_sync
    assert (p0.sync_now, p0.sync_later, p0.no_sync) == (1, 1, 1)
    assert p0.no_sync_owner_rows.tolist() == [0, 1]
    assert p0.evict_keys.tolist() == [2, 3]
    p1 = plans[1]
    # U_1 = {1,4,5}: trainer 0 uses {1,4}, trainer 1 {5}; none is used again -> all no_sync
    assert (p1.sync_now, p1.sync_later, p1.no_sync) == (0, 0, 3)
    assert [p.fetched for p in plans] == [3, 2, 1]


def test_mlp_sizes_reach_the_model(tiny_dataset):
    r = train(TrainConfig(data=str(tiny_dataset), batch_size=256, iterations=3, eval_rows=1000,
                          bottom_mlp=[8], top_mlp=(12, 6)))
    shapes = [tuple(p.shape) for n, p in r.model.named_parameters() if n.endswith("weight")]
    assert shapes[:2] == [(8, 4), (16, 8)]  # 4 dense features -> 8 -> E = 16
    assert shapes[-3:] == [(12, shapes[-3][1]), (6, 12), (1, 6)]
    assert r.config["train"]["bottom_mlp"] == (8,) and r.config["model"]["top_mlp"] == (12, 6)

"""`bagpipe simulate`: the performance model on hand-computed cases, its volumes against the
engine's own metrics, calibration, --validate on real runs, and bad input."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from helpers import one_per_volumes

from bagpipe_cli.cli import cli
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.simulate.calibrate import compute_of, read_measured
from bagpipe_cli.simulate.inputs import Cluster, ComputeTimes, Volumes, Workload
from bagpipe_cli.simulate.model import predict
from bagpipe_cli.simulate.plans import bytes_per_iteration

# Hand-computed cases use: row_dim 24 + state_dim 1 -> 100 bytes per row; 0.8 Gbit/s =
# 1e8 bytes/s, so one row takes 1 us and 1000 rows take 1 ms (latency 0 unless stated).
WORK = Workload(row_dim=24, state_dim=1, dense_bytes=0, warmup=0)
SLOW = Cluster(trainers=1, servers=1, net_gbps=0.8, net_latency_us=0.0)
FB6 = ComputeTimes(fwd_bwd_ms=6.0)
# The N trainers' losses ride in every critical sum (4 bytes each): a ring of 2(N-1) steps of
# 4 bytes at 1e8 bytes/s is 0.08 us at N = 2 (no latency).
LOSSES2 = 2 * 1 * 4 / 1e8 * 1e3  # ms


def volumes(system: str, iters: int, k: int = 1, m: int = 1, **arrays) -> Volumes:
    z = np.zeros((iters, k), np.int64)
    v = Volumes(system, iters, k, np.ones(iters, bool), z.copy(), z.copy(),
                np.zeros((iters, m, k), np.int64), z.copy(), np.zeros(iters, np.int64),
                np.zeros(iters, np.int64), np.zeros(iters, np.int64))
    for name, value in arrays.items():
        setattr(v, name, value)
    return v


def test_sync_fetch_queues_behind_the_previous_write_back():
    # |U_b| = 10,000 rows, 100 us latency: a message takes 0.1 + 10 = 10.1 ms.
    # it 0: fetch 0 -> 10.1, compute 6 -> 16.1, write-back queued at 16.1, done 26.2.
    # it 1: starts 16.1, its fetch waits for the write-back: 26.2 -> 36.3 (wait 20.2), +6.
    # Every later iteration: exposed = wb(b-1) + fetch(b) = 20.2 ms, time 26.2 ms.
    n = np.full((5, 1), 10_000)
    v = volumes("sync", 5, read_fetch=n[:, None, :].copy(), write_back=n.copy(),
                empty_fetch_message=True)
    p = predict(v, Cluster(1, 1, 0.8, 100.0), WORK, FB6)
    assert p.iter_ms == pytest.approx([16.1, 26.2, 26.2, 26.2, 26.2])
    assert p.median_ms == pytest.approx(26.2)
    assert p.exposed_fetch_ms == pytest.approx((10.1 + 4 * 20.2) / 5)


def test_sync_over_two_servers_halves_each_message():
    # 10,000 rows split 5,000 / 5,000 over K = 2 links: every message 5 ms, links parallel.
    # Steady iteration: wb 5 + fetch 5 exposed + compute 6 = 16 ms.
    n = np.full((4, 2), 5_000)
    v = volumes("sync", 4, k=2, read_fetch=n[:, None, :].copy(), write_back=n.copy())
    p = predict(v, Cluster(1, 2, 0.8, 0.0), WORK, FB6)
    assert p.iter_ms == pytest.approx([11.0, 16.0, 16.0, 16.0])


def test_bagpipe_prefetch_hidden_until_the_link_is_the_bottleneck():
    # Rounds of C = 2; each round fetches 10,000 rows (10 ms), each iteration writes back
    # 5,000 (5 ms): link work per round 20 ms > compute per round 12 ms.
    # r0: fetched now 0->10 (wait 10); r1's fetch 10->20; it0 6 -> wb 20->25; it1 -> wb 25->30.
    # r1 at 22: r1 ready (20), no wait; r2's fetch 30->40; it2, it3 end at 34 (wbs 40..50).
    # r2 at 34: wait until 40 (6); r3's fetch 50->60; it4, it5 end at 52 (wbs 60..70).
    # r3 at 52: wait until 60 (8); r4's fetch 70->80; it6, it7 end at 72.
    # r4 at 72: wait until 80 (8); no more rounds; it8, it9.
    # Steady state: 20 ms per round = (fetch + 2 write-backs) / C = 10 ms per iteration.
    it = 10
    start = np.arange(it) % 2 == 0
    rf = np.where(start, 10_000, 0)[:, None]
    v = volumes("bagpipe", it, round_start=start, round_fetch=rf, write_back=np.full((it, 1), 5_000),
                prefetch_ahead=True)
    p = predict(v, SLOW, WORK, FB6)
    assert p.iter_ms == pytest.approx([16, 6, 6, 6, 12, 6, 14, 6, 14, 6])
    assert p.median_ms == pytest.approx(6.0)  # the wait falls on each round's first iteration
    # Link faster than compute (1 row = 0.1 us): after round 0 nothing is exposed.
    p = predict(v, Cluster(1, 1, 8.0, 0.0), WORK, FB6)
    assert p.iter_ms == pytest.approx([7, 6, 6, 6, 6, 6, 6, 6, 6, 6])


def test_lru_victims_are_written_back_before_the_misses_are_fetched():
    # Every iteration: 2,000 victims written back (2 ms), then 2,000 misses fetched (2 ms)
    # on the same link: 4 ms exposed + 6 ms compute. Iteration 0 has no victims: 2 + 6.
    it = 4
    pre = np.array([[0], [2000], [2000], [2000]])
    v = volumes("lru", it, round_fetch=np.full((it, 1), 2000), pre_evict=pre)
    p = predict(v, SLOW, WORK, FB6)
    assert p.iter_ms == pytest.approx([8, 10, 10, 10])


def test_fae_cold_rows_written_back_after_the_iteration():
    # 3,000 cold rows fetched at the start (3 ms) and written back at the end (3 ms): the
    # next fetch waits for the write-back: 3 + 3 + 6 = 12 ms from iteration 1 on.
    it = 3
    v = volumes("fae", it, round_fetch=np.full((it, 1), 3000), write_back=np.full((it, 1), 3000))
    p = predict(v, SLOW, WORK, FB6)
    assert p.iter_ms == pytest.approx([9, 12, 12])


def test_hotline_computes_its_popular_samples_while_the_cold_rows_are_fetched():
    # fae's volumes: 3,000 cold rows fetched (3 ms), written back after the iteration (3 ms).
    # it0: fetch 0->3 while the popular half computes 3 ms: nothing exposed; 3 more: 6 ms.
    # it1 at 6: its fetch queues behind it0's write-back (6->9), lands at 12; the popular
    # half ends at 9, waits 3 ms, the rest ends at 15: 9 ms. it2 at 15, a popular share of
    # 0.8: its fetch 18->21 (behind it1's write-back), the popular part ends at 19.8, 1.2 ms
    # waited, then 1.2 ms: 7.2 ms.
    it = 3
    v = volumes("hotline", it, round_fetch=np.full((it, 1), 3000), write_back=np.full((it, 1), 3000),
                popular=np.array([0.5, 0.5, 0.8]))
    p = predict(v, SLOW, WORK, FB6)
    assert p.iter_ms == pytest.approx([6, 9, 7.2])
    assert p.exposed_fetch_ms == pytest.approx((0 + 3 + 1.2) / 3)
    # Every sample popular (the 6 ms hide each 6 ms of link work), or no rows: compute alone.
    v.popular[:] = 1.0
    assert predict(v, SLOW, WORK, FB6).iter_ms == pytest.approx([6, 6, 6])
    v.popular[:], v.round_fetch[:] = 0.0, 0  # nothing fetched: nothing waited for
    assert predict(v, SLOW, WORK, FB6).iter_ms == pytest.approx([6, 6, 6])


def test_het_trainers_fetch_one_after_another_and_push_gradients():
    # N = 2 trainers fetch 1,000 and 2,000 rows in turn (1 + 2 ms); the push of |U_b| = 4,800
    # gradients (24 floats = 96 bytes each: 4.608 ms) occupies the link before the next fetch.
    # Dense sum of 0 bytes: none; the losses' sum: LOSSES2. it0: 3 + 6 = 9; later: 4.608 + 3 + 6.
    it = 3
    rf = np.zeros((it, 2, 1), np.int64)
    rf[:, 0, 0], rf[:, 1, 0] = 1000, 2000
    v = volumes("het", it, m=2, read_fetch=rf, write_back=np.full((it, 1), 4800), push_gradients=True)
    p = predict(v, Cluster(2, 1, 0.8, 0.0), WORK, FB6)
    assert p.iter_ms == pytest.approx([9 + LOSSES2, 13.608 + LOSSES2, 13.608 + LOSSES2])


def test_local_sums_every_row_after_the_dense_model_s_hidden_sum():
    # N = 4, 0.8 Gbit/s = 1e8 B/s, latency 10 us. The dense 4,000 B: a ring of 2(N-1) = 6
    # steps of (10 us + 1,000 B / 1e8 B/s = 10 us) = 0.12 ms, run during the backward (4 of
    # the 6 ms): hidden. Critical: 1,000 rows x 96 B + 4 losses x 4 B = 96,016 B: 6 steps of
    # (10 us + 24,004 B / 1e8 B/s = 240.04 us) = 1.50024 ms exposed sync; no fetches.
    v = volumes("local", 3, sync_now=np.full(3, 1000))
    work = Workload(row_dim=24, state_dim=1, dense_bytes=4000)
    p = predict(v, Cluster(4, 1, 0.8, 10.0), work, FB6)
    assert p.iter_ms == pytest.approx([7.50024] * 3)
    assert p.exposed_sync_ms == pytest.approx(1.50024)
    assert p.exposed_fetch_ms == 0


def test_a_dense_sum_longer_than_the_backward_shows():
    # As above with a 400,000 B dense model: its ring is 6 x (10 us + 100,000 B / 1e8) = 6.06
    # ms, started when the backward starts (2 ms into the 6 of compute): it ends 2.06 ms after
    # the backward; then the critical 1.50024 ms. Iteration 6 + 2.06 + 1.50024 = 9.56024.
    v = volumes("local", 3, sync_now=np.full(3, 1000))
    work = Workload(row_dim=24, state_dim=1, dense_bytes=400_000)
    p = predict(v, Cluster(4, 1, 0.8, 10.0), work, FB6)
    assert p.iter_ms == pytest.approx([9.56024] * 3)
    allgather = predict(v, Cluster(4, 1, 0.8, 10.0, collective="allgather"), work, FB6)
    # allgather: N-1 = 3 whole vectors: dense 3 x 4.01 = 12.03 ms (8.03 exposed), critical
    # 3 x (10 us + 960.16 us) = 2.91048 ms.
    assert allgather.iter_ms == pytest.approx([6 + 8.03 + 2.91048] * 3)


def test_late_sync_waits_two_iterations_later():
    # bagpipe, N = 2, nothing to fetch; sync_later 10,000 rows: all-reduce 2(N-1) = 2 steps
    # of 480,000 B / 1e8 = 4.8 ms -> 9.6 ms on the collective link per iteration, while an
    # iteration computes 6 ms. Collectives queue: it0's lands at 15.6, it1's at 25.2 ...
    # it2 starts at 12 and waits until 15.6 (3.6); it3 starts at 21.6, waits for 25.2 (3.6)
    # -> in steady state the collective link sets the pace: 9.6 ms per iteration.
    it = 6
    v = volumes("bagpipe", it, sync_later=np.full(it, 10_000), prefetch_ahead=True)
    p = predict(v, Cluster(2, 1, 0.8, 0.0), WORK, FB6)
    assert p.iter_ms == pytest.approx([6 + LOSSES2, 6 + LOSSES2, 9.6, 9.6, 9.6, 9.6])
    assert p.exposed_sync_ms == pytest.approx((2 * LOSSES2 + 4 * 3.6) / 6)


def test_no_network_means_compute_alone():
    n = np.full((3, 1), 10_000)
    v = volumes("sync", 3, read_fetch=n[:, None, :].copy(), write_back=n.copy())
    c = ComputeTimes(data_ms=0.5, fwd_bwd_ms=6, optimizer_ms=1, other_ms=0.25, fetch_cpu_ms=0.25)
    p = predict(v, Cluster(), WORK, c)
    assert p.iter_ms == pytest.approx([8.0] * 3)  # 0.5 + 6 + 1 + 0.25 + 0.25


def _planned(plan_ms: float = 1.0) -> Volumes:
    """bagpipe, 4 iterations in rounds of 2: rank 0 sends 200,000 B for round 0 and 100,000 B
    for round 1, and plans a batch in `plan_ms`; nothing fetched."""
    start = np.array([True, False, True, False])
    v = volumes("bagpipe", 4, round_start=start, prefetch_ahead=True,
                plan_bytes=np.array([200_000, 0, 100_000, 0]), plan_ms=plan_ms)
    v.plan_end_bytes = 31
    return v


def test_rank_0_is_a_pipeline_stage_no_iteration_is_shorter():
    # Rank 0's link 0.08 Gbit/s = 1e7 B/s: round 0's plan takes 20 ms, 10 ms an iteration,
    # round 1's 5 ms; its 1 ms of planning a batch runs beside the sends: 10, 10, 6, 6 ms
    # against 6 ms of compute.
    p = predict(_planned(), Cluster(1, 1, 0.08, 0.0), WORK, FB6)
    assert p.iter_ms == pytest.approx([10, 10, 6, 6])
    assert p.planner_ms_per_iter == pytest.approx(1) and p.planner_send_ms_per_iter == pytest.approx(7.5)
    assert p.exposed_plan_ms == pytest.approx(2)
    assert p.mean_ms >= p.planner_ms_per_iter and p.relay_ms_per_iter == 0  # one trainer: no relay
    assert p.planner_mb_per_iter == pytest.approx((300_000 + 31) / 4 / 1e6)
    # A fast link hides rank 0 behind the trainers: the compute alone.
    p = predict(_planned(), Cluster(1, 1, 8.0, 0.0), WORK, FB6)
    assert p.iter_ms == pytest.approx([6] * 4) and p.exposed_plan_ms == 0
    # Planning slower than the trainers sets the pace, whatever the link.
    p = predict(_planned(plan_ms=9.0), Cluster(1, 1, None, 0.0), WORK, FB6)
    assert p.iter_ms == pytest.approx([9] * 4) and p.planner_ms_per_iter == pytest.approx(9)


def test_rank_0_plans_while_its_link_sends_the_round_before():
    # The sender thread sends round r while rank 0 plans r + 1: its planning (5 ms a batch)
    # and its link (10, 10, 5, 5 ms an iteration) are two stages, their max, not their sum
    # (15, 15, 10, 10 ms).
    from bagpipe_cli.simulate.plans import plan_stages

    v, cl = _planned(plan_ms=5.0), Cluster(1, 1, 0.08, 0.0)
    oracle, send, relay = plan_stages(v, cl)
    assert 1e3 * oracle == pytest.approx([5] * 4) and 1e3 * send == pytest.approx([10, 10, 5, 5])
    assert not relay.any()
    p = predict(v, cl, WORK, ComputeTimes(fwd_bwd_ms=1.0))
    assert p.iter_ms == pytest.approx([10, 10, 5, 5])
    assert p.planner_ms_per_iter == pytest.approx(5) and p.planner_send_ms_per_iter == pytest.approx(7.5)
    # Without the link (loopback) the planning alone: no send stage.
    p = predict(v, replace(cl, plans_on_network=False), WORK, ComputeTimes(fwd_bwd_ms=1.0))
    assert p.iter_ms == pytest.approx([5] * 4) and p.planner_send_ms_per_iter == 0


def test_the_relay_tree_is_a_stage_too():
    # N = 3: trainer 0 passes each plan on to trainers 1 and 2 on its own link, 0.04 Gbit/s =
    # 5e6 B/s: round 0: 2 x 40 ms over 2 iterations, round 1: 2 x 20 ms over 2.
    cl = Cluster(3, 1, 8.0, 0.0, trainer_gbps=0.04)
    p = predict(_planned(), cl, WORK, FB6)
    assert p.iter_ms == pytest.approx([40, 40, 20, 20])
    assert p.relay_ms_per_iter == pytest.approx(30) and p.mean_ms >= p.planner_ms_per_iter
    # A --procs run's plans cross loopback (plans_on_network False): the planning alone.
    p = predict(_planned(), replace(cl, plans_on_network=False), WORK, FB6)
    assert max(p.iter_ms) < 6.1 and p.planner_ms_per_iter == pytest.approx(1.0)


def test_relay_fanout_is_the_engines():
    from bagpipe_cli.engine.distributed.relay import FANOUT
    from bagpipe_cli.simulate.plans import RELAY_FANOUT

    assert RELAY_FANOUT == FANOUT


def test_plan_formulas_equal_the_encoded_rounds(tiny_dataset):
    """simulate/plans.py against wire.encode of real rounds (every planner, both key widths)."""
    from bagpipe_cli.data.format import open_dataset, table_offsets
    from bagpipe_cli.engine.distributed.rounds import id_dtype, shared_round, trainer_round
    from bagpipe_cli.engine.distributed.shares import trainer_sizes
    from bagpipe_cli.engine.distributed.wire import encode
    from bagpipe_cli.engine.planning.builders import PolicyPlanner, trace_of
    from bagpipe_cli.engine.planning.oracle import Oracle
    from bagpipe_cli.policies.table import policy
    from bagpipe_cli.simulate import plans

    ds = open_dataset(tiny_dataset)
    offsets, total = table_offsets(ds.meta.cardinalities), int(sum(ds.meta.cardinalities))

    def batches():
        return (ds.keys_block(b * 512, (b + 1) * 512, offsets) for b in range(12))

    def close(predicted, rp, keys, view=True, cached=True, real=None):
        real = real or encode(shared_round(rp, view, cached, keys)).nbytes
        assert abs(predicted - real) <= 16 + 0.001 * real, (predicted, real)

    assert encode(None).nbytes == plans.END
    for keys, kb in ((np.int32, 4), (np.int64, 8)):
        for n, c in ((1, 1), (2, 3), (8, 4)):
            for rp in Oracle(total, 2 * c, c, n, 100_000).plan(batches()):
                assert (rp.iters[0].part is not None) == (n > 1)
                if n == 1:
                    close(plans.lookahead_round(kb, n, len(rp.fetch_keys), [len(p.uniq) for p in rp.iters],
                                                [len(p.evict_keys) for p in rp.iters]), rp, keys)
                    continue
                # N > 1: each trainer's own plan of the partitioned cache's round (no slots;
                # a Partition of its rows an iteration)
                each = plans.trainer_rounds(kb, n, [trainer_sizes(p, n) for p in rp.iters])
                for i in range(n):
                    real = encode(trainer_round(rp, i, keys, id_dtype(n))).nbytes
                    close(int(each[i]), rp, keys, real=real)
            for rp in Oracle(total, 1, 1, n, 100_000, lrpp=False).plan(batches()):  # prefetch
                close(plans.lookahead_round(kb, n, len(rp.fetch_keys), [len(p.uniq) for p in rp.iters],
                                            [len(p.evict_keys) for p in rp.iters], lrpp=False), rp, keys)
            for rp in Oracle(total, 1, 1, n, None, lrpp=False).plan(batches()):  # het, local
                u = len(rp.iters[0].uniq)
                close(plans.view_round(kb, n, u), rp, keys, cached=False)
                close(plans.count_round(n), rp, keys, view=False, cached=False)
        trace = trace_of(batches(), total)
        for name in ("lru", "fae"):
            for rp in PolicyPlanner(policy(name).decisions(trace, 3000, 1.0), trace, total).plan(batches()):
                if not rp.iters:
                    close(plans.policy_last(kb, len(rp.pre_evict_keys)), rp, keys)
                    continue
                p = rp.iters[0]
                close(plans.policy_round(kb, len(rp.fetch_keys), len(rp.pre_evict_keys), len(p.uniq),
                                         len(p.evict_keys)), rp, keys)


def test_syncs_rank_0_bytes_do_not_grow_with_the_batch(tiny_dataset):
    from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

    def plan_bytes(batch):
        tc = TraceConfig(str(tiny_dataset), batch_size=batch, iterations=8, trainers=2,
                         runtime="distributed")
        v = trace_volumes(tc, ["sync", "bagpipe"])[0]
        return {s: bytes_per_iteration(x) for s, x in v.items()}

    small, large = plan_bytes(256), plan_bytes(4096)
    assert small["sync"] == large["sync"] < 1000  # |U_b| alone, whatever the batch
    assert large["bagpipe"] > 4 * small["bagpipe"]  # U_b and its lists grow with the batch
    inproc = trace_volumes(TraceConfig(str(tiny_dataset), batch_size=256, iterations=8), ["bagpipe"])[0]
    assert bytes_per_iteration(inproc["bagpipe"]) == 0  # in-process: no rank 0 link


def test_iteration_time_is_never_below_rank_0s_on_a_trace(tiny_dataset):
    from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

    tc = TraceConfig(str(tiny_dataset), batch_size=1024, iterations=24, lookahead=8, trainers=2,
                     runtime="distributed")
    vols = trace_volumes(tc, list(one_per_volumes()))[0]
    for gbps in (0.01, 1.0, None):  # rank 0 the bottleneck, a share, nothing but its planning
        for s, v in vols.items():
            p = predict(v, Cluster(2, 1, gbps, 10.0 if gbps else 0.0), Workload(16, 0, 1000, warmup=4),
                        ComputeTimes(fwd_bwd_ms=0.5))
            assert v.plan_ms > 0 and p.planner_ms_per_iter > 0, s
            assert p.mean_ms >= p.planner_ms_per_iter - 1e-9 and p.median_ms > 0, (s, gbps)
            if gbps is None:  # no link delays: rank 0's time is its planning
                assert p.planner_ms_per_iter == pytest.approx(v.plan_ms), s



def test_rank_0_is_charged_for_making_each_trainers_own_plan(tiny_dataset, monkeypatch):
    """Where each trainer gets its own plan (bagpipe, N > 1) rank 0 makes and encodes the N
    plans of every round: the model times that (as the runtimes call it) into the planning
    stage; a shared plan (one trainer, sync) has none to make."""
    from bagpipe_cli.engine.distributed import shares
    from bagpipe_cli.simulate import planning
    from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

    made = []
    group = shares.group_rounds
    monkeypatch.setattr(shares, "group_rounds", lambda rp, *a: made.append(rp.r) or group(rp, *a))
    for n, system, making in ((4, "bagpipe", True), (1, "bagpipe", False), (4, "sync", False)):
        made.clear()
        tc = TraceConfig(str(tiny_dataset), batch_size=1024, iterations=24, lookahead=8, trainers=n,
                         runtime="distributed")
        v = trace_volumes(tc, [system])[0][system]
        p = predict(v, Cluster(n, 1, None, 0.0), Workload(16, 0, 1000, warmup=4), ComputeTimes(fwd_bwd_ms=0.5))
        assert (v.plan_make_ms > 0) == making and p.planner_make_ms == v.plan_make_ms, (n, system)
        assert len(set(made)) == (planning.MAKE_SAMPLES if making else 0)  # timed on the first rounds
        assert v.plan_ms > v.plan_make_ms and p.planner_ms_per_iter == pytest.approx(v.plan_ms)

def test_compute_of_takes_medians_and_leaves_out_communication():
    m = pd.DataFrame({
        "data": [0.1, 0.0, 0.002, 0.0, 0.004, 0.0],  # seconds; rounds of 2: starts 0, 2, 4
        "prefetch_wait": [0.05, 0, 0.003, 0, 0.003, 0],
        "forward": [0.01, 0.002, 0.002, 0.002, 0.002, 0.002],
        "backward": [0.01, 0.004, 0.004, 0.004, 0.004, 0.004],
        "sync": [0.0, 0.001, 0.001, 0.001, 0.001, 0.001],
        "optimizer": [0.001] * 6,
    })
    m["time"] = m[["data", "prefetch_wait", "forward", "backward", "sync", "optimizer"]].sum(axis=1) + 0.0005
    c = compute_of(m, warmup=2, round_len=2)
    # data: median over round starts 2, 4 = 3 ms; fwd+bwd 6 ms; optimizer 1 ms; other 0.5 ms.
    assert (c.data_ms, c.fwd_bwd_ms, c.optimizer_ms, c.other_ms, c.fetch_cpu_ms) == pytest.approx(
        (3.0, 6.0, 1.0, 0.5, 0.0))
    # Without an emulated network the waits for rows are CPU: median over round starts = 3 ms.
    assert compute_of(m, warmup=2, round_len=2, emulated=False).fetch_cpu_ms == pytest.approx(3.0)


def test_calibration_from_a_stored_bench_run(tmp_path):
    from pathlib import Path

    run = Path(__file__).parent / "data" / "bench-example" / "runs" / "bagpipe-dlrm-L8-slow-300c9515-r1"
    r = read_measured(run)
    m = pd.read_csv(run / "metrics.csv").iloc[2:]  # warmup 2
    assert r.system == "bagpipe" and r.trace.lookahead == 8 and r.cluster.net_gbps == 0.5
    assert r.workload.row_bytes == (16 + 1) * 4  # adagrad keeps one float of state per row
    assert r.compute.fwd_bwd_ms == pytest.approx(1e3 * float((m["forward"] + m["backward"]).median()))
    assert r.measured_median_ms == pytest.approx(19.908710499976223)


# ------------------------------------------------------------------- real runs of the engine


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_dataset):
    """Tiny real runs: sync/bagpipe/het/hotline with an emulated network (N = 2, K = 2), a
    no-network twin of sync, and a run of slipstream (which simulate has no model of)."""
    from bagpipe_cli.engine import TrainConfig, train
    from bagpipe_cli.results import write_run

    root = tmp_path_factory.mktemp("simruns")
    common = dict(data=str(tiny_dataset), batch_size=512, iterations=16, warmup=3, lookahead=8,
                  optimizer="adagrad", lr=0.05, eval_rows=2000, trainers=2, servers=2)
    specs = {"sync-net": dict(system="sync", net_gbps=0.2, net_latency_us=50),
             "bagpipe-net": dict(system="bagpipe", net_gbps=0.2, net_latency_us=50),
             "het-net": dict(system="het", staleness=2, net_gbps=0.2, net_latency_us=50),
             "sync-nonet": dict(system="sync"),
             "hotline-net": dict(system="hotline", net_gbps=0.2, net_latency_us=50),
             "slipstream-net": dict(system="slipstream", drop_target=0.2, snapshot_every=4,
                                    net_gbps=0.2, net_latency_us=50)}  # unmodelled
    for name, extra in specs.items():
        res = train(TrainConfig(**common, **extra))
        write_run(root / name, res.config, res.metrics, res.summary)
    return root


def test_volumes_equal_the_engines_metrics(runs):
    from bagpipe_cli.simulate.volumes import trace_volumes

    for name in ("sync-net", "bagpipe-net", "het-net", "hotline-net"):
        r = read_measured(runs / name)
        assert r.phased == (r.system == "hotline")  # calibration keeps its two passes apart
        v = trace_volumes(r.trace, [r.system])[0][r.system]
        m = pd.read_csv(runs / name / "metrics.csv")
        fetched = v.read_fetch.sum(axis=(1, 2)) + v.round_fetch.sum(axis=1)
        if r.system == "bagpipe":  # the engine counts a row as fetched at the iteration using it
            assert fetched.sum() == m["rows_fetched"].sum()
        else:
            assert fetched.tolist() == m["rows_fetched"].tolist()
        assert (v.write_back.sum(axis=1) + v.pre_evict.sum(axis=1)).tolist() == m["rows_written_back"].tolist()
        if r.system == "hotline":  # its samples computed while the round's rows were fetched
            assert v.popular is not None and (v.popular < 1).any()
            assert np.rint(v.popular * 512).astype(int).tolist() == m["popular_samples"].tolist()
            continue
        assert v.popular is None
        assert v.sync_now.tolist() == (m["sync_now"].tolist() if r.system == "bagpipe" else [0] * 16)


def test_validate_prints_the_table(runs, tmp_path):
    r = CliRunner().invoke(cli, ["simulate", "--validate", str(runs), "--out", str(tmp_path / "v")])
    assert r.exit_code == 0, r.output
    for needle in ("predicted", "measured", "sync", "bagpipe", "het", "hotline",
                   "note: left out 1 slipstream run(s): simulate has no model of their traffic"):
        assert needle in r.output
    # in-process runs have no rank 0 link: their plan bytes are not checked, and it says so
    assert "rank 0's plan bytes not checked for 5 run(s): in-process" in " ".join(r.output.split())
    df = pd.read_csv(tmp_path / "v" / "validate.csv")
    assert df["plan_ok"].isna().all() and df["rows_ok"].isna().all() and df["collective_ok"].isna().all()
    assert len(df) == 5 and set(df["system"]) == {"sync", "bagpipe", "het", "hotline"}
    # The summary counts the slipstream run out and agrees with the table; whether each tiny run
    # lands within the tolerance is timing on a shared machine (docs/benchmarks.md measures that).
    assert f"{int(df['ok'].sum())} of 5 runs within" in r.output
    assert df["ok"].tolist() == [abs(e) <= 0.20 for e in df["error"]]
    assert (df["predicted_ms"] > 0).all() and df["error"].notna().all()
    # The emulated sync run borrows its fetch CPU from its no-network twin.
    from bagpipe_cli.simulate.calibrate import measured_runs

    sync = next(x for x in measured_runs(runs) if x.path.name == "sync-net")
    assert sync.fetch_cpu_from.startswith("1 no-network twin")


def test_simulate_dataset_with_cluster_file_writes_outputs(runs, tiny_dataset, tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(f"name: tiny-cluster\ndata: {tiny_dataset}\ntrainers: 2\nservers: 2\n"
                   "net_gbps: 1\nnet_latency_us: 20\nbatch_size: 1024\nlookahead: 8\n"
                   "systems: [sync, bagpipe, lru, local]\nsweep: {trainers: [1, 2, 4], net_gbps: [0.5, 5]}\n"
                   "reported: {source: test, speedup_max: 5.6, speedup: {lru: '-'}}\n")
    out = tmp_path / "sim"
    r = CliRunner().invoke(cli, ["simulate", "--cluster", str(cfg), "--calibrate", str(runs),
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "bagpipe" in r.output and "up to 5.6x" in r.output
    # a system the source did not compare with shows its own entry, not the maximum
    assert re.search(r"│ sync +│ +[\d.]+x │ up to 5\.6x │", r.output), r.output
    assert re.search(r"│ lru +│ +[\d.]+x │ +- │", r.output), r.output
    # the bound is compared too; a paper's "up to" is over its baselines, not over local
    assert re.search(r"│ local +│ +[\d.]+x │ +- │", r.output), r.output
    js = json.loads((out / "simulate.json").read_text())
    assert js["schema_version"] == 1
    assert [p["system"] for p in js["predictions"]] == ["sync", "bagpipe", "lru", "local"]
    assert js["compute_source"]["kind"] == "calibrated"
    sweep = pd.read_csv(out / "sweep.csv")
    assert set(sweep["trainers"]) == {1, 2, 4} and set(sweep.loc[sweep.sweep == "net_gbps", "net_gbps"]) == {0.5, 5}
    for png in ("speedup_vs_trainers.png", "speedup_vs_bandwidth.png"):
        assert (out / png).stat().st_size > 10_000
    # A given compute instead, on the dataset directly; sync's speed-up is 1 by definition.
    r = CliRunner().invoke(cli, ["simulate", str(tiny_dataset), "--compute-ms", "3", "--net-gbps", "1",
                                 "--batch-size", "1024", "--lookahead", "8", "--systems", "sync,bagpipe",
                                 "--sweep-trainers", "1,2", "--sweep-gbps", "1"])
    assert r.exit_code == 0, r.output
    assert "1.00x" in r.output


def test_weak_sweep_keeps_the_samples_per_trainer_and_shows_rank_0(tiny_dataset, tmp_path):
    out = tmp_path / "weak"
    args = ["simulate", str(tiny_dataset), "--compute-ms", "2", "--net-gbps", "1", "--trainers", "2",
            "--batch-size", "512", "--iterations", "12", "--warmup", "2", "--systems", "sync,bagpipe",
            "--sweep-trainers", "1,2,4", "--sweep-gbps", "1", "--sweep-scaling", "weak"]
    r = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "rank 0" in r.output and "collective" in r.output and "MB/iter" not in r.output
    sweep = pd.read_csv(out / "sweep.csv")
    by_n = sweep[sweep.sweep == "trainers"].set_index(["system", "trainers"])
    assert [by_n.loc[("sync", n), "batch_size"] for n in (1, 2, 4)] == [256, 512, 1024]
    mb = {s: [by_n.loc[(s, n), "planner_mb_per_iter"] for n in (1, 2, 4)] for s in ("sync", "bagpipe")}
    # U_b grows with the batch; from N = 2 on each trainer gets its own share of the plan, without
    # the slots and fetched keys one trainer's plan carries
    assert mb["bagpipe"][1] < mb["bagpipe"][2] and mb["bagpipe"][1] < 2 * mb["bagpipe"][0]
    assert max(mb["sync"]) < 0.001  # |U_b| alone
    assert (sweep["mean_ms"] >= sweep["planner_ms_per_iter"] - 1e-9).all()
    # the floor (compute and the dense sums' wait) is under every iteration, over its compute
    assert (sweep["floor_ms"] <= sweep["mean_ms"] + 1e-9).all()
    assert (sweep["floor_ms"] >= sweep["compute_ms"] - 1e-9).all()
    pred = pd.read_csv(out / "predictions.csv")
    assert {"planner_mb_per_iter", "planner_ms_per_iter", "relay_ms_per_iter", "exposed_plan_ms"} <= set(pred)
    # A weak sweep past the data is one line that names it.
    r = CliRunner().invoke(cli, [*args[:-6], "--sweep-trainers", "128", "--sweep-gbps", "1",
                                 "--sweep-scaling", "weak"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "--sweep-scaling weak at 128 trainers" in r.output
    r = CliRunner().invoke(cli, [*args[:-1], "both"])
    assert r.exit_code == 2 and "'both' is not one of 'strong', 'weak'" in r.output


@pytest.mark.parametrize("runtime", ["inproc", "distributed"])
def test_progress_counts_every_trace_it_makes(tiny_dataset, runtime):
    """simulate's bar: `traces_total` announced up front is the number of system traces made
    (the main one of each system, and those a swept trainer count retraces: het's and
    bagpipe's in-process, every system's distributed), each batch read counts."""
    from bagpipe_cli.simulate import build_config, run_simulate
    from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

    cfg = build_config(str(tiny_dataset), compute_ms=1.0, batch_size=256, iterations=6, warmup=1,
                       systems=("sync", "bagpipe", "het"), trainers=2, runtime=runtime,
                       sweep_trainers=(1, 2, 4), sweep_gbps=(1.0,))
    events = []
    result = run_simulate(cfg, lambda p: events.append(replace(p)))
    traces = [e.stage for e in events if "tracing" in e.stage]
    traces = [t for i, t in enumerate(traces) if i == 0 or t != traces[i - 1]]  # one per trace
    assert len(traces) == events[0].traces_total == (3 + 2 * 3 if runtime == "distributed" else 3 + 2 * 2)
    assert traces[:3] == ["tracing sync", "tracing bagpipe", "tracing het"]
    assert ("1 trainer: tracing het" in traces) and ("4 trainers: tracing sync" in traces) == (
        runtime == "distributed")
    done = [e.traces_done for e in events]
    assert done == sorted(done) and events[-1].stage == "done" and done[-1] == len(traces)
    assert events[-1].batches >= len(traces) * 6  # every trace reads the 6 batches at least
    # Its rows per iteration are those of the iterations after warm-up, as its times are (not
    # a mean with the first round's cold fetch in it).
    v = trace_volumes(TraceConfig(data=cfg.data, batch_size=256, iterations=6, trainers=2,
                                  runtime=runtime), ["bagpipe"])[0]["bagpipe"]
    fetched = v.round_fetch.sum(axis=1) + v.read_fetch.sum(axis=(1, 2))
    assert result.volumes["bagpipe"]["rows_fetched"] == pytest.approx(fetched[1:].mean())
    assert fetched[0] > fetched[1:].mean()  # the cold start, left out


def test_an_interrupted_simulate_names_no_checkpoints(tiny_dataset, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM during simulate: one line, the signal's exit code, nothing written,
    and no word of checkpoints (it has none; train, which has, names them)."""
    import bagpipe_cli.simulate as sim
    from bagpipe_cli.launch.signals import Terminated

    def stop(*a, **k):
        raise Terminated(15)

    monkeypatch.setattr(sim, "run_simulate", stop)
    r = CliRunner().invoke(cli, ["simulate", str(tiny_dataset), "--compute-ms", "1",
                                 "--out", str(tmp_path / "sim")])
    assert r.exit_code == 143, r.output
    assert r.output.strip() == "Error: terminated by SIGTERM; no output was written"
    assert not (tmp_path / "sim").exists()
    import bagpipe_cli.engine as engine

    monkeypatch.setattr(engine, "run", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--iterations", "2", "--warmup", "0",
                                 "--out", str(tmp_path / "run")])
    assert r.exit_code == 130 and r.output.strip() == "Error: interrupted; no output was written"
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--iterations", "2", "--warmup", "0",
                                 "--checkpoint-every", "1", "--out", str(tmp_path / "run")])
    assert r.exit_code == 130 and r.output.strip() == (
        "Error: interrupted; no output was written (checkpoints already written are kept)")


def test_no_compute_is_a_prediction_not_a_traceback(tiny_dataset, tmp_path):
    """--compute-ms 0: the iteration is the exposed waits alone (rank 0's planning at least)."""
    r = CliRunner().invoke(cli, ["simulate", str(tiny_dataset), "--compute-ms", "0", "--batch-size",
                                 "256", "--iterations", "8", "--warmup", "1", "--systems",
                                 "sync,bagpipe", "--sweep-trainers", "1,2", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    pred = pd.read_csv(tmp_path / "s" / "predictions.csv").set_index("system")
    assert (pred["compute_ms"] == 0).all() and (pred["mean_ms"] > 0).all()
    assert np.isfinite(pred["speedup"]).all()


def test_without_sync_there_is_no_speed_up_to_show(tiny_dataset, tmp_path):
    r = CliRunner().invoke(cli, ["simulate", str(tiny_dataset), "--compute-ms", "1", "--batch-size",
                                 "256", "--iterations", "6", "--warmup", "1", "--systems",
                                 "hotline,fae", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "nan" not in r.output.lower() and re.search(r"│ hotline .* │ +- │ ", r.output), r.output


@pytest.mark.parametrize("args, needle", [
    (["--systems", "sync,nosuch", "--compute-ms", "1"], "unknown system 'nosuch'"),
    (["--systems", "sync,slipstream", "--compute-ms", "1"], "--systems: slipstream has no performance model yet"),
    (["--compute-ms", "1", "--calibrate", "RUNS"], "either --compute-ms or --calibrate"),
    ([], "give the compute time"),
    (["--compute-ms", "1", "--sweep-gbps", ""], "--sweep-gbps: give at least one bandwidth"),
])
def test_bad_options_are_one_line_exit_2(tiny_dataset, runs, args, needle):
    args = [str(runs) if a == "RUNS" else a for a in args]
    r = CliRunner().invoke(cli, ["simulate", str(tiny_dataset), "--batch-size", "512", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1


def test_bad_files_are_one_line_exit_2(tmp_path, tiny_dataset):
    bad = tmp_path / "c.yaml"
    bad.write_text(f"data: {tiny_dataset}\ntrainers: 2\nbandwidth: 10\n")
    for args, needle in [(["--cluster", str(bad)], "unknown key 'bandwidth'"),
                         (["--cluster", str(tmp_path / "none.yaml")], "cannot read"),
                         ([str(tmp_path / "nodata"), "--compute-ms", "1"], "no such dataset"),
                         (["--validate", str(tmp_path / "noresults")], "no such results folder")]:
        r = CliRunner().invoke(cli, ["simulate", *args])
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.output and len(r.output.strip().splitlines()) == 1


def test_shipped_paper_scenario_is_valid():
    from pathlib import Path

    from bagpipe_cli.simulate.cluster import SimulateConfig, load_cluster

    cf = load_cluster(Path(__file__).parents[1] / "benchmarks" / "paper-scenario.yaml")
    c = SimulateConfig(**cf.settings)
    # the artifact's setting: 8 trainers at 10 Gbit/s, one server at 25, batch 16384, L=200, C=50
    assert (c.trainers, c.servers, c.batch_size, c.lookahead, c.round) == (8, 1, 16384, 200, 50)
    assert (c.net_gbps, c.trainer_gbps, c.emb_dim, c.cache_rows) == (25.0, 10.0, 48, 15_000_000)
    assert (c.bottom_mlp, c.top_mlp) == ((512, 256, 64), (1024, 1024, 1024, 256, 128))
    assert c.runtime == "distributed" and c.optimizer == "sgd"
    # one pass over all 8M samples, as before simulate's defaults became train's
    assert (c.iterations, c.eval_rows, c.warmup) == (488, 0, 200)
    assert cf.synth.preset == "criteo-kaggle" and c.reported["speedup_max"] == 5.6


def test_simulate_help_has_example():
    r = CliRunner().invoke(cli, ["simulate", "--help"])
    assert r.exit_code == 0 and "Examples:" in r.output and "--validate" in r.output


PROCS_SYSTEMS = one_per_volumes()  # sync, bagpipe, prefetch, lru (lfu, fae), hotline, het, local


@pytest.fixture(scope="module")
def procs_runs(tmp_path_factory, tiny_dataset):
    """Real --procs runs (2 trainers, 2 servers, an emulated network) of one system per
    traffic model."""
    root = tmp_path_factory.mktemp("procsruns")
    for system in PROCS_SYSTEMS:
        r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--system", system, "--trainers", "2",
                                     "--servers", "2", "--procs", "5", "--batch-size", "512",
                                     "--iterations", "16", "--warmup", "3", "--lookahead", "8",
                                     "--staleness", "2", "--optimizer", "adagrad", "--eval-rows", "2000",
                                     "--net-gbps", "0.2", "--net-latency-us", "50",
                                     "--out", str(root / system)])
        assert r.exit_code == 0, r.output
    return root


@pytest.mark.slow
@pytest.mark.extended  # make test-all: real --procs runs of every traffic model (20 s)
def test_distributed_volumes_equal_the_runs_metrics(procs_runs):
    """Over torch.distributed each trainer fetches and pushes what it needs: the model's
    volumes of the distributed runtime are the rows the run's trainers moved."""
    from bagpipe_cli.results.run_folder import read_summary, read_trainer_metrics
    from bagpipe_cli.simulate.volumes import trace_volumes

    for system in PROCS_SYSTEMS:
        r = read_measured(procs_runs / system)
        assert r.trace.runtime == "distributed" and not r.cluster.collectives_on_network
        v = trace_volumes(r.trace, [system])[0][system]
        m = pd.read_csv(procs_runs / system / "metrics.csv")
        # the sharded tables: the rows asked of the owners, and their gradients sent back
        asked = v.shards[:, 0].sum(axis=1) if v.shards is not None else 0
        fetched = v.read_fetch.sum(axis=(1, 2)) + v.round_fetch.sum(axis=1) + asked
        assert fetched.sum() == m["rows_fetched"].sum(), system
        written = v.write_back.sum() + v.pre_evict.sum() + np.sum(asked)
        assert written == m["rows_written_back"].sum(), system
        assert v.messages == 2
        if not spec(system).replicated:  # it fetches when an iteration reads
            assert fetched.tolist() == m["rows_fetched"].tolist(), system
        if v.popular is not None:  # hotline: the trainer with the fewest popular samples
            per = read_trainer_metrics(procs_runs / system, read_summary(procs_runs / system))
            fewest = per.groupby("iteration")["popular_samples"].min().to_numpy()
            assert np.rint(v.popular * 256).astype(int).tolist() == fewest.tolist()


@pytest.mark.slow
@pytest.mark.extended  # make test-all: real --procs runs of every traffic model (20 s)
def test_predicted_rank_0_bytes_equal_the_counted(procs_runs):
    """What the model says rank 0 sends per iteration (simulate/plans.py) is what the runs'
    rank 0 counted (summary roles.oracle.traffic)."""
    from bagpipe_cli.simulate.volumes import trace_volumes

    for system in PROCS_SYSTEMS:
        r = read_measured(procs_runs / system)
        v = trace_volumes(r.trace, [system])[0][system]
        assert r.counted_plan_bytes == pytest.approx(bytes_per_iteration(v), rel=0.10), system
    assert read_measured(procs_runs / "sync").counted_plan_bytes < 1000  # |U_b| alone


@pytest.mark.slow
@pytest.mark.extended  # make test-all: real --procs runs of every traffic model (20 s)
def test_validate_predicts_distributed_runs(procs_runs, tmp_path):
    r = CliRunner().invoke(cli, ["simulate", "--validate", str(procs_runs), "--out", str(tmp_path / "v")])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "v" / "validate.csv")
    n = len(PROCS_SYSTEMS)
    assert len(df) == n and (df["predicted_ms"] > 0).all()
    assert df["setting"].str.contains("procs").all()
    # rank 0's plan bytes, the servers' rows and each trainer's collectives, checked beside the time
    for kind in ("plan", "rows", "collective"):
        assert (df[f"{kind}_check"] == "checked").all() and df[f"{kind}_ok"].all(), kind
        assert (df[f"{kind}_error"].abs() <= 0.10).all(), kind
    assert f"rank 0's plan bytes: {n} of {n}" in r.output
    assert f"the servers' row bytes: {n} of {n}" in r.output
    assert f"each trainer's collective bytes: {n} of {n}" in r.output


@pytest.mark.slow
@pytest.mark.extended  # make test-all: real --procs runs of every traffic model (20 s)
def test_validate_skips_the_bytes_of_runs_that_did_not_count_them(procs_runs, tmp_path):
    import shutil

    old = tmp_path / "old" / "bagpipe"
    shutil.copytree(procs_runs / "bagpipe", old)
    summary = json.loads((old / "summary.json").read_text())
    del summary["roles"]["planner"]["traffic"]  # as results from before the count
    (old / "summary.json").write_text(json.dumps(summary))
    r = CliRunner().invoke(cli, ["simulate", "--validate", str(tmp_path / "old"), "--out", str(tmp_path / "v")])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert "rank 0's plan bytes not checked for 1 run(s): not counted" in r.output
    df = pd.read_csv(tmp_path / "v" / "validate.csv")
    assert df["plan_ok"].isna().all() and df["predicted_ms"].notna().all()
    assert df["rows_ok"].all() and df["collective_ok"].all()  # still counted


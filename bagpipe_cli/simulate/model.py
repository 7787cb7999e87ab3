"""The performance model: per-iteration communication volumes + a cluster -> iteration times.

The model replays, iteration by iteration, what the engine's pipeline does (see
docs/performance-model.md for the formulas):

- K embedding-server links, each FIFO: a message of `n` rows submitted at time `t` starts
  when the link is free, `start = max(t, free_k)`, and holds it for
  `latency + n * row_bytes / bandwidth` (`NetworkModel.transfer_seconds`); a fetch is done
  when its slowest shard is;
- the main thread: per round, load the data, wait for the round's rows (fetched now, or
  prefetched one round earlier), start the next round's prefetch (bagpipe); per iteration,
  read (sync/het fetch here), forward+backward (hotline: its popular share computes while
  the round's rows are fetched, the rest once they land), sum the `sync_now` rows and the losses on
  the critical path (N > 1) once the dense gradients' sum is done, queue `sync_later` on
  the background link, optimizer, queue write-backs;
- the trainers' sums cost what `--collective` moves (a ring's bytes for the exact sum and
  allreduce, N-1 vectors for allgather); the dense gradients' sum runs on the background
  link during the backward (as the engine's DDP buckets), the asynchronous sums after it,
  waited for two iterations later;
- rank 0's planning, its link (sending the plans) and the relay of its plans are pipeline
  stages ahead of the trainers: no iteration is shorter than any one's time per iteration
  (`simulate/plans.py`).

Compute is given per phase (`ComputeTimes`, `simulate/inputs.py`): calibrated from a measured run or chosen.
Everything here is pure: no I/O, no printing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.registry import REFERENCE, SIMULATED_SYSTEMS
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.simulate.inputs import Cluster, ComputeTimes, Volumes, Workload
from bagpipe_cli.simulate.plans import bytes_per_iteration, plan_stages

SYSTEMS = SIMULATED_SYSTEMS  # the model replays the engine's systems that have volumes


@dataclass
class Prediction:
    """Predicted times of one system (milliseconds)."""

    system: str
    median_ms: float  # median per-iteration time (what `bagpipe train` reports)
    mean_ms: float  # mean per-iteration time (1 / throughput)
    compute_ms: float  # mean compute per iteration
    exposed_fetch_ms: float  # mean time the main thread waits for fetches
    exposed_sync_ms: float  # mean time it waits for all-reduces (sync_now + dense; late sync_later)
    link_busy: float  # busiest server link's busy fraction of the iterations after warm-up
    planner_mb_per_iter: float = 0.0  # rank 0's plan bytes per iteration (MB = 1e6 bytes)
    planner_ms_per_iter: float = 0.0  # rank 0's planning per iteration
    planner_send_ms_per_iter: float = 0.0  # rank 0's link per iteration: sending plans (beside the planning)
    planners: int = 1  # the oracle's planning workers (1: one thread plans)
    planner_worker_ms: float = 0.0  # the busiest planning worker's CPU ms a batch
    planner_make_ms: float = 0.0  # rank 0 making each trainer's own plan, CPU ms a batch (in its planning)
    relay_ms_per_iter: float = 0.0  # the busiest relaying trainer's plan sends per iteration
    #                                 (each trainer its own plan: the largest one's receiving)
    exposed_plan_ms: float = 0.0  # mean time the pipeline waits for the plans (rank 0, relay)
    server_rows_mb_per_iter: float = 0.0  # rows (with their state) all the servers send, per iteration
    collective_mb_per_iter: float = 0.0  # the trainers' sums and exchanges: the busiest's sent
    # the floor every system pays: compute and the wait for the dense model's sums
    floor_ms: float = 0.0
    speedup: float = float("nan")  # mean time of sync / mean time of this system
    iter_ms: np.ndarray = field(default=None, repr=False)  # every iteration's predicted time
    # [N] collective bytes each trainer sends per iteration (`collective_bytes`)
    trainer_collective_bytes: np.ndarray = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("iter_ms", "trainer_collective_bytes")}


class _Links:
    """K FIFO links: `send` returns when a message submitted at `t` has been transferred."""

    def __init__(self, k: int, net: NetworkModel, row_bytes: int, messages: int = 1):
        self.free = np.zeros(k)
        self.busy = np.zeros(k)
        self.net, self.row_bytes = net, row_bytes
        # a transfer of `messages` requests served one after another: a latency each
        self.extra = (messages - 1) * net.transfer_seconds(0)

    def occupy(self, t: float, seconds: float) -> None:
        """Every server works `seconds` from `t` on (in FIFO order with its transfers)."""
        if seconds > 0:
            self.free = np.maximum(self.free, t) + seconds
            self.busy += seconds

    def send(self, t: float, rows: np.ndarray, always: bool = False) -> float:
        """Submit one message per shard with rows (every shard if `always`); completion time."""
        done = t
        for k, n in enumerate(rows):
            if n == 0 and not always:
                continue
            d = self.net.transfer_seconds(int(n) * self.row_bytes) + self.extra
            start = max(t, self.free[k])
            self.free[k] = start + d
            self.busy[k] += d
            done = max(done, self.free[k])
        return done


class _Replay:
    """The state of one `predict` replay, advanced one iteration at a time.

    Stages of iteration b, in order, all on the (simulated) main thread: `start_round`
    (at a round's first iteration: load data, wait for the round's rows, start the next
    round's prefetch), `read` (wait for the asynchronous sync of b-2, fetch rows read now),
    forward+backward, `sync` (critical-path and asynchronous all-reduces, N > 1), then
    `write_back` (optimizer, queue write-backs). `t` is the main thread's clock (seconds).
    """

    def __init__(self, vol: Volumes, cluster: Cluster, work: Workload, compute: ComputeTimes):
        self.vol, self.work = vol, work
        self.net = cluster.network
        self.n = cluster.trainers
        self.cluster = cluster
        self.server_s = compute.server_ms * 1e-3
        self.links = _Links(cluster.servers, self.net, work.row_bytes, vol.messages)
        self.push = _Links(cluster.servers, self.net, work.grad_bytes, vol.messages)  # same links
        self.push.free = self.links.free  # one link per server: fetches, write-backs and pushes share it
        self.push.busy = self.links.busy
        s = 1e-3  # ms -> s
        self.c_data, self.c_fb, self.c_opt, self.c_other, self.c_fcpu = (
            compute.data_ms * s, compute.fwd_bwd_ms * s, compute.optimizer_ms * s,
            compute.other_ms * s, compute.fetch_cpu_ms * s)
        self.c_bwd = min(compute.bwd_ms * s, self.c_fb)
        self.c_sync = compute.sync_ms * s
        self.cpu_bound = compute.cpu_bound_ms * s
        I = vol.iterations  # noqa: E741 - the paper's symbol
        self.times = np.zeros(I)
        self.fetch_wait = np.zeros(I)
        self.sync_wait = np.zeros(I)
        self.dense_wait = np.zeros(I)  # the part of sync_wait that waits for the dense sums
        self.comp = np.zeros(I)
        self.coll_free = 0.0  # the sync_later sums' link
        self.dense_free = 0.0  # the dense and critical sums' link
        self.later_done: dict[int, float] = {}
        self.busy_before = np.zeros(cluster.servers)  # the links' busy time before warm-up ends
        ex = vol.exchanges if self.n > 1 and cluster.collectives_on_network else None
        # The partitioned cache's exchanges (rows of the busiest trainer, sent or received):
        # None where every trainer holds U_b and sums sync_now and sync_later with the others.
        self.moved = None if ex is None else {k: ex.busiest(k) for k in ("delivered", "now", "later")}
        sh = vol.shards if self.n > 1 and cluster.collectives_on_network else None
        # The sharded tables' all-to-alls: the rows of the busiest trainer, asked or served.
        self.sharded = None if sh is None else np.maximum(sh[:, 0].max(axis=1), sh[:, 1].max(axis=1))
        self.inflight: dict[int, float] = {}  # round start iteration -> completion of its prefetch
        self.landing: float | None = None  # hotline: when the current round's rows land
        starts = np.flatnonzero(vol.round_start)
        self.next_start = {int(a): int(b) for a, b in zip(starts[:-1], starts[1:], strict=True)}
        self.t = 0.0

    def _compute(self, b: int, seconds: float) -> None:
        self.t += seconds
        self.comp[b] += seconds

    def iteration(self, b: int) -> None:
        t_it = self.t
        if b == self.work.warmup:  # the links' work queued from here on is the measured one's
            self.busy_before = self.links.busy.copy()
        if self.vol.round_start[b]:
            self.start_round(b)
        self.read(b)
        if self.vol.popular is None:
            self._compute(b, self.c_fb)
        else:  # hotline: the popular samples compute while the round's rows are fetched
            self._compute(b, self.vol.popular[b] * self.c_fb)
            self.land(b)
            self._compute(b, (1.0 - self.vol.popular[b]) * self.c_fb)
        if self.n > 1:
            self.sync(b)
        self.write_back(b)
        self.times[b] = self.t - t_it

    def start_round(self, b: int) -> None:
        vol, links = self.vol, self.links
        self._compute(b, self.c_data)
        t0 = self.t
        links_done = self.t
        if vol.pre_evict[b].any():
            links.send(self.t, vol.pre_evict[b])
        if vol.round_fetch[b].any():
            links_done = self.inflight.pop(b, None)
            if links_done is None:  # not prefetched: fetched now (bagpipe's first round)
                links_done = links.send(self.t, vol.round_fetch[b])
            if vol.popular is not None:  # hotline: waited for within the iteration (`land`)
                self.landing = links_done
                return
        self.t = max(self.t, links_done)
        self.fetch_wait[b] += self.t - t0
        if vol.round_fetch[b].any() or vol.pre_evict[b].any():
            self._compute(b, self.c_fcpu)
        nb = self.next_start.get(b)
        if vol.prefetch_ahead and nb is not None and vol.round_fetch[nb].any():
            self.inflight[nb] = links.send(self.t, vol.round_fetch[nb])

    def land(self, b: int) -> None:
        """hotline: wait for the round's rows, issued at its start, and insert them."""
        if self.landing is None:
            return
        t0 = self.t
        self.t = max(self.t, self.landing)
        self.fetch_wait[b] += self.t - t0
        self.landing = None
        self._compute(b, self.c_fcpu)

    def read(self, b: int) -> None:
        vol = self.vol
        if b - 2 in self.later_done:  # the asynchronous sync of b-2 lands before b reads
            t0 = self.t
            self.t = max(self.t, self.later_done.pop(b - 2))
            self.sync_wait[b] += self.t - t0
        if self.moved is not None:  # the homes deliver b's rows (and state) to its writers
            d = self._exchange(int(self.moved["delivered"][b]) * self.work.row_bytes)
            self.t += d
            self.sync_wait[b] += d
        if self.sharded is not None:  # the counts, the ids and the rows, from their owners
            m = int(self.sharded[b])
            d = sum(self._exchange(x) for x in (8 * (self.n - 1), 8 * m, 4 * self.work.row_dim * m))
            self.t += d
            self.fetch_wait[b] += d
        fetched = False
        for msg in vol.read_fetch[b]:
            if msg.any() or vol.empty_fetch_message:
                t0 = self.t
                self.t = self.links.send(self.t, msg, always=vol.empty_fetch_message)
                self.fetch_wait[b] += self.t - t0
                fetched = True
        self._compute(b, self.c_other + (self.c_fcpu if fetched else 0.0))

    def _collective(self, nbytes: int) -> float:
        """A sum of `nbytes` per trainer over the trainers' links, by the cluster's collective."""
        return self.cluster.trainer_network.collective_seconds(self.cluster.collective, nbytes, self.n)

    def _exchange(self, nbytes: int) -> float:
        """An all-to-all in which the busiest trainer sends or receives `nbytes` (the
        partitioned cache's rows by need: engine/planning/partition.py)."""
        return self.cluster.trainer_network.transfer_seconds(nbytes) if nbytes else 0.0

    def sync(self, b: int) -> None:
        """The dense gradients' sum runs while the backward runs (the engine's DDP buckets);
        the loop waits for it, then sums the sync_now rows and the losses on the critical
        path; the sync_later sum queues on a link of its own (the engine's second background
        thread), waited for two iterations later. A partitioned cache sends the rows' partial
        gradients to their homes instead (`moved`), the losses with them."""
        vol, work = self.vol, self.work
        if not self.cluster.collectives_on_network:  # as measured, sync_later included
            self.t += self.c_sync
            self.sync_wait[b] += self.c_sync
            return
        t0 = self.t
        dense = self._collective(work.dense_bytes)
        if dense > 0:  # from the backward's start, after the previous iteration's sums
            self.dense_free = max(self.t - self.c_bwd, self.dense_free) + dense
            self.dense_wait[b] = max(0.0, self.dense_free - self.t)
            self.t = max(self.t, self.dense_free)
        if self.moved is None:
            self.t += self._collective(int(vol.sync_now[b]) * work.grad_bytes + 4 * self.n)
            later = self._collective(int(vol.sync_later[b]) * work.grad_bytes)
            if self.sharded is not None:  # the partial gradients, to the rows' owners
                self.t += self._exchange(int(self.sharded[b]) * work.grad_bytes)
        else:
            # the losses go with the partials: a row to every other trainer
            self.t += self._exchange((int(self.moved["now"][b]) + self.n - 1) * work.grad_bytes)
            later = self._exchange(int(self.moved["later"][b]) * work.grad_bytes)
        self.dense_free = self.t
        self.sync_wait[b] += self.t - t0
        if later > 0:
            self.coll_free = max(self.t, self.coll_free) + later
            self.later_done[b] = self.coll_free

    def write_back(self, b: int) -> None:
        vol = self.vol
        self._compute(b, self.c_opt)
        if vol.write_back[b].any():
            (self.push if vol.push_gradients else self.links).send(self.t, vol.write_back[b])
        self.links.occupy(self.t, self.server_s)  # the servers' own work for this iteration

    def prediction(self) -> Prediction:
        vol, work = self.vol, self.work
        I = vol.iterations  # noqa: E741 - the paper's symbol
        m = slice(work.warmup, None) if I > work.warmup else slice(None)
        if I <= work.warmup:
            self.busy_before[:] = 0.0
        # No iteration is faster than the machine's cores get through every process's CPU.
        times = np.maximum(self.times, self.cpu_bound)
        # Nor than the plans' pipeline stages (rank 0's planning, its link, the relay), which
        # run ahead of them.
        oracle, send, relay = plan_stages(self.vol, self.cluster)
        planned = np.maximum.reduce([times, oracle, send, relay])
        plan_wait, times = planned - times, planned
        sent = collective_bytes(vol, self.cluster, work)
        return Prediction(
            system=self.vol.system,
            median_ms=1e3 * float(np.median(times[m])) if I else math.nan,
            mean_ms=1e3 * float(times[m].mean()) if I else math.nan,
            compute_ms=1e3 * float(self.comp[m].mean()) if I else math.nan,
            exposed_fetch_ms=1e3 * float(self.fetch_wait[m].mean()) if I else math.nan,
            exposed_sync_ms=1e3 * float(self.sync_wait[m].mean()) if I else math.nan,
            # the work queued on the busiest link during the measured iterations, over their
            # predicted time (not the whole run's: its first rounds fetch every cold row)
            link_busy=float((self.links.busy - self.busy_before).max() / times[m].sum())
            if I and times[m].sum() > 0 else 0.0,
            planner_mb_per_iter=1e-6 * bytes_per_iteration(self.vol),
            planner_ms_per_iter=1e3 * float(oracle[m].mean()) if I else 0.0,
            planner_send_ms_per_iter=1e3 * float(send[m].mean()) if I else 0.0,
            planners=self.vol.planners, planner_worker_ms=self.vol.plan_worker_ms,
            planner_make_ms=self.vol.plan_make_ms,
            relay_ms_per_iter=1e3 * float(relay[m].mean()) if I else 0.0,
            exposed_plan_ms=1e3 * float(plan_wait[m].mean()) if I else 0.0,
            server_rows_mb_per_iter=1e-6 * work.row_bytes * float(
                vol.round_fetch.sum() + vol.read_fetch.sum() + vol.setup_rows) / max(1, I),
            collective_mb_per_iter=1e-6 * float(sent.max(initial=0.0)),
            floor_ms=1e3 * float(self.comp[m].mean() + self.dense_wait[m].mean()) if I else math.nan,
            iter_ms=1e3 * times, trainer_collective_bytes=sent,
        )


def predict(vol: Volumes, cluster: Cluster, work: Workload, compute: ComputeTimes) -> Prediction:
    """Replay `vol` on `cluster` with `compute` per iteration; see the module docstring."""
    if vol.servers != cluster.servers:
        raise ConfigError(f"volumes are split over {vol.servers} servers, the cluster has "
                          f"{cluster.servers}")
    if vol.exchanges is not None and vol.exchanges.trainers != cluster.trainers:
        raise ConfigError(f"{vol.system}'s volumes are partitioned over {vol.exchanges.trainers} "
                          f"trainers, the cluster has {cluster.trainers}")
    replay = _Replay(vol, cluster, work, compute)
    for b in range(vol.iterations):
        replay.iteration(b)
    return replay.prediction()


def _ring(kind: str, elements: np.ndarray, n: int) -> np.ndarray:
    """Bytes one trainer sends to sum vectors of `elements` floats over `n` trainers (the
    engine's `collective.traffic`): a ring's 2(n-1) chunks of ceil(elements / n), or n-1
    whole vectors for the all-gather."""
    elements = np.asarray(elements, np.int64)
    per = (n - 1) * elements if kind == "allgather" else 2 * (n - 1) * -(-elements // n)
    return 4 * np.where(elements > 0, per, 0)


def collective_bytes(vol: Volumes, cluster: Cluster, work: Workload) -> np.ndarray:
    """[N] the bytes each trainer sends in the trainers' collectives per iteration (what a
    torch.distributed run counts, `collective_bytes_sent` over its iterations): the dense
    model's sum (its DDP buckets as one vector: each bucket's padding, at most 4(N-1) bytes,
    left out) and the losses' every iteration; the sync_now and sync_later rows' sums of a
    replicated cache, or a partitioned cache's deliveries and partial gradients (which carry
    the losses, a row to every other trainer)."""
    n, kind, I = cluster.trainers, cluster.collective, max(1, vol.iterations)  # noqa: E741
    if n <= 1:
        return np.zeros(n)
    dense = float(_ring(kind, work.dense_bytes // 4, n))
    if vol.exchanges is None:  # one sum of the sync_now rows and the losses, one of sync_later
        rows = (_ring(kind, vol.sync_now * work.row_dim + n, n).sum()
                + _ring(kind, vol.sync_later * work.row_dim, n).sum())
        if vol.shards is not None:  # counts, ids and gradients of rows asked; rows served
            asked, served = vol.shards[:, 0].sum(axis=0), vol.shards[:, 1].sum(axis=0)
            a2a = 8 * (n - 1) + (8 * asked + work.grad_bytes * (asked + served)) / I
            return dense + rows / I + a2a
        return np.full(n, dense + rows / I)
    moved = vol.exchanges.bytes_sent(work.row_bytes, work.grad_bytes).sum(axis=0)
    return dense + (n - 1) * work.grad_bytes + moved / I  # the losses: a row to each other


def add_speedups(preds: list[Prediction]) -> None:
    """Set each prediction's speed-up over `sync` (mean iteration times; NaN without sync)."""
    base = next((p.mean_ms for p in preds if p.system == REFERENCE), math.nan)
    for p in preds:
        p.speedup = base / p.mean_ms if p.mean_ms > 0 else math.nan

"""Per-iteration communication volumes of every system, from a dataset's batch trace.

Each system's registry entry names its function here (`SystemSpec.volumes`). The plans are
the engine's own (the `Oracle`, or a policy's `PolicyPlanner`, whose decisions are `bagpipe
profile`'s simulators'), run over the batches `bagpipe train` would read, so the counts are
the ones a run records in metrics.csv: rows fetched per round, written back per iteration,
`sync_now` / `sync_later` per iteration. A bounded-staleness cache replays `HetSystem`'s rule
per trainer; the systems that push gradients push them. Rows are split by shard (`key % K`):
every server has its own link. A partitioned cache (N > 1) adds what each trainer moves among
the trainers (`simulate/partition.py`).

Rank 0, the planner, is traced too: what its plans weigh on the wire (`simulate/plans.py`,
distributed runtime) and how long its planning takes per batch. As in a run, each batch
comes already read and indexed (its reader threads do that in parallel), so its time is the
planning alone (a system without a planned cache: no_plan's oracle of lookahead 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bagpipe_cli.data.format import Dataset, open_dataset, table_offsets
from bagpipe_cli.engine.memory import DATASET_FIX, estimate_simulate, refuse_over
from bagpipe_cli.engine.planning.builders import PolicyPlanner, trace_of
from bagpipe_cli.engine.planning.feed import batch_start
from bagpipe_cli.engine.planning.oracle import Oracle, plan_peak
from bagpipe_cli.engine.planning.plans import RoundPlan
from bagpipe_cli.engine.planning.slices import default_planners
from bagpipe_cli.engine.registry import SystemSpec, spec
from bagpipe_cli.engine.setup import split_rows
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.simulate import plans
from bagpipe_cli.simulate.inputs import Exchanges, Volumes
from bagpipe_cli.simulate.model import SYSTEMS
from bagpipe_cli.simulate.partition import by_shard, record_round
from bagpipe_cli.simulate.planning import PlanMaking, timed_rounds
from bagpipe_cli.simulate.staleness import HetState

RUNTIMES = ("inproc", "distributed")


@dataclass(frozen=True)
class TraceConfig:
    """Which batches are traced and how the systems are set up (as `bagpipe train` options)."""

    data: str  # dataset directory
    batch_size: int = 1024  # global batch size
    iterations: int | None = None  # None: every full batch of the training rows once
    lookahead: int = 16  # bagpipe's L (and the fixed-capacity caches' default capacity: bagpipe's peak)
    round: int | None = None  # bagpipe's C (default L/4)
    planners: int | None = None  # bagpipe's planning workers (default: slices.default_planners)
    cache_rows: int | None = None  # a fixed-capacity cache's capacity (default: bagpipe's peak)
    staleness: int = 0  # het
    trainers: int = 1  # N
    servers: int = 1  # K
    eval_rows: int | None = None  # held-out tail, as `bagpipe train` (default 10%, <= 50,000)
    # inproc: one process for every trainer (a replicated cache fetches each row once;
    # bagpipe's partitioned cache, sync and het count and charge each trainer's requests, as
    # the distributed runtime sends them); distributed: a process per trainer
    # (torch.distributed), each fetching what it needs
    runtime: str = "inproc"
    hot_sample: float = 1.0  # fae: the fraction of the batches whose hottest rows it caches
    row_dim: int = 16  # floats of an embedding row (E, +1 for wdl/deepfm): sharded-hot's break-even

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"runtime {self.runtime!r}: choose one of {', '.join(RUNTIMES)}")
        for opt, v in [("batch_size", self.batch_size), ("lookahead", self.lookahead),
                       ("trainers", self.trainers), ("servers", self.servers)]:
            if v < 1:
                raise ConfigError(f"{opt} must be >= 1 (got {v})")
        if self.iterations is not None and self.iterations < 1:
            raise ConfigError(f"iterations must be >= 1 (got {self.iterations})")
        if self.batch_size % self.trainers:
            raise ConfigError(f"batch size {self.batch_size} is not divisible by {self.trainers} "
                              "trainers")


def _key_batches(ds: Dataset, cfg: TraceConfig, iterations: int, train_rows: int,
                 on_batch: Callable[[], None] | None = None) -> Callable[[], Iterator[np.ndarray]]:
    """The global keys [B*T] of every iteration, the batches `bagpipe train` reads from its
    `train_rows` (`on_batch()` after each one read, in every pass)."""
    offsets = table_offsets(ds.meta.cardinalities)

    def gen() -> Iterator[np.ndarray]:
        for b in range(iterations):
            lo = batch_start(cfg, train_rows, b)
            yield ds.keys_block(lo, lo + cfg.batch_size, offsets)
            if on_batch is not None:
                on_batch()

    return gen


def trace_volumes(cfg: TraceConfig, systems: tuple[str, ...] | list[str],
                  progress: Callable[[str], None] | None = None,
                  on_batch: Callable[[], None] | None = None) -> tuple[dict[str, Volumes], dict]:
    """Volumes of each system in `systems` (each built by its registry entry), and facts
    about the trace (peak, capacity, ...). `progress(system)` as each system's trace starts,
    `on_batch()` after every batch read (a system may read the batches more than once)."""
    specs = [spec(s, "--systems") for s in systems]
    for s in specs:
        if s.name not in SYSTEMS:
            raise ConfigError(f"--systems: unknown system {s.name!r}; choose from {', '.join(SYSTEMS)}")
    ds = open_dataset(cfg.data)
    rows = int(sum(ds.meta.cardinalities))
    train_rows = split_rows(ds, cfg.batch_size, cfg.eval_rows)[0]  # as train splits off its tail
    iterations = cfg.iterations or train_rows // cfg.batch_size
    _admit(cfg, ds.meta.cardinalities, iterations, specs)
    t = _Trace(cfg, _key_batches(ds, cfg, iterations, train_rows, on_batch), iterations, rows)
    t.info.update({"iterations": iterations, "embedding_rows": t.total, "tables": ds.meta.num_tables,
                   "dense_features": ds.meta.num_dense, "dataset_rows": ds.rows,
                   "train_rows": train_rows})
    say = progress or (lambda s: None)
    out: dict[str, Volumes] = {}
    for s in specs:
        say(s.name)
        out[s.name] = s.simulated_volumes(t)
    return out, t.info


def _admit(cfg: TraceConfig, cardinalities: list[int], iterations: int,
           specs: list[SystemSpec]) -> None:
    """Refuse a trace whose estimate (`engine/memory.py`) exceeds this machine's memory."""
    rows = sum(cardinalities)
    cached = [s.name for s in specs if s.capacity_from_peak]
    leads = {"planner": f"planning the trace over the {rows:,} embedding rows of {cfg.data}",
             "trace": f"--iterations {iterations} --batch-size {cfg.batch_size}: the trace "
                      f"{', '.join(cached)} plan over",
             "volumes": f"--iterations {iterations}: {len(specs)} systems' volumes per iteration",
             "inputs": f"--batch-size {cfg.batch_size}: the batches in flight",
             "processes": "simulate"}
    fixes = {"planner": DATASET_FIX, "trace": f"lower --iterations, or leave {', '.join(cached)} "
             "out of --systems", "volumes": "lower --iterations", "inputs": "lower --batch-size",
             "processes": "use a machine with more memory"}
    refuse_over([estimate_simulate(cardinalities, iterations, cfg, specs)], leads.__getitem__,
                fixes)


@dataclass
class _Trace:
    cfg: TraceConfig
    keys: Callable[[], Iterator[np.ndarray]]
    iterations: int
    total: int
    info: dict = field(default_factory=dict)
    _trace: Any = None

    @property
    def distributed(self) -> bool:
        return self.cfg.runtime == "distributed"

    def capacity(self) -> int:
        """The fixed-capacity caches' rows: --cache-rows, or Bagpipe's peak at --lookahead."""
        if "cache_rows" not in self.info:
            if self.cfg.cache_rows is None:
                self.peak()
            self.info["cache_rows"] = self.cfg.cache_rows or max(1, self.info["bagpipe_peak_resident_rows"])
        return self.info["cache_rows"]

    def peak(self) -> int:
        """Bagpipe's peak resident rows at --lookahead (a planning pass, once)."""
        if "bagpipe_peak_resident_rows" not in self.info:
            self.info["bagpipe_peak_resident_rows"] = plan_peak(
                self.keys(), self.total, self.cfg.lookahead, self.cfg.round)[0]
        return self.info["bagpipe_peak_resident_rows"]

    def trace(self):
        """The run's trace (per batch the unique keys in first-access order), built once."""
        if self._trace is None:
            self._trace = trace_of(self.keys(), self.total)
        return self._trace

    def empty(self, system: str, m: int = 1) -> Volumes:
        i, k = self.iterations, self.cfg.servers
        z = np.zeros((i, k), np.int64)
        # Distributed: a server serves the trainers' requests one after another (lockstep),
        # so a transfer is every trainer's rows on that server, with a latency each.
        return Volumes(system, i, k, np.ones(i, bool), z.copy(), z.copy(), np.zeros((i, m, k), np.int64),
                       z.copy(), *(np.zeros(i, np.int64) for _ in range(3)),
                       messages=self.cfg.trainers if self.distributed else 1, plan_bytes=np.zeros(i, np.int64))

    def slices(self, keys: np.ndarray) -> list[np.ndarray]:
        """The unique keys of each trainer's samples."""
        per = len(keys) // self.cfg.trainers
        return [np.unique(keys[i * per:(i + 1) * per]) for i in range(self.cfg.trainers)]

    def pushed(self, kb: np.ndarray, uniq: np.ndarray) -> np.ndarray:
        """Rows per shard a pushing system fetches and pushes: each trainer's own rows apart,
        in both runtimes (in-process, the requests the trainers' ranks would send)."""
        k = self.cfg.servers
        return sum(by_shard(x, k) for x in self.slices(kb))

    @property
    def key_bytes(self) -> int:
        return plans.key_bytes(self.total)

    def send(self, v: Volumes, b: int, nbytes: int) -> None:
        """Rank 0 sends `nbytes` of plans for the round starting at b (nothing crosses a
        link in-process: the plans stay in the process)."""
        if self.distributed:
            v.plan_bytes[b] += nbytes

    def planned(self, planner: Any, v: Volumes, hold_keys: bool = False
                ) -> Iterator[tuple[RoundPlan, list[np.ndarray]]]:
        """The planner's rounds over the traced batches (each with its batches' keys when
        `hold_keys`), timed into `v` (`simulate/planning.py`); then the end of the plans is sent."""
        yield from timed_rounds(planner, self.keys, self.total, v, hold_keys)
        if self.distributed:
            v.plan_end_bytes += plans.END * (1 if v.plan_trainer_bytes is None else self.cfg.trainers)


def lookahead_volumes(t: _Trace, s: SystemSpec, lookahead: int | None = None,
                      lrpp: bool = True) -> Volumes:
    """The lookahead oracle's rounds (bagpipe): prefetched one round ahead, LRPP's sync lists
    and, with N > 1, its partition's exchanges; at a fixed `lookahead` (rounds of one
    iteration, no LRPP: prefetch) as `engine/planning/builders.py` plans it."""
    cfg, k = t.cfg, t.cfg.servers
    L, C = (cfg.lookahead, cfg.round) if lookahead is None else (lookahead, 1)
    planners = cfg.planners or default_planners(cfg.batch_size * t.info["tables"])
    oracle = Oracle(t.total, L, C, cfg.trainers, None, lrpp=lrpp, threads=False, planners=planners)
    v = t.empty(s.name)
    v.round_start[:], v.prefetch_ahead = False, True
    n, kb = cfg.trainers, t.key_bytes
    # N > 1: each row on the trainers that read it (simulate/partition.py)
    v.exchanges = Exchanges.zeros(t.iterations, n) if oracle.partitioned else None
    v.plan_trainer_bytes = np.zeros(t.iterations, np.int64) if v.exchanges is not None and t.distributed else None
    if v.exchanges is not None:  # each trainer's requests, in both runtimes
        v.messages = n
    making = PlanMaking(n, t.total, planners) if v.exchanges is not None else None  # each its own plan
    for rp, _ in t.planned(oracle, v):
        b0 = rp.iters[0].b
        v.round_start[b0] = True
        mine = record_round(v.exchanges, rp, k) if v.exchanges is not None else None
        if mine is not None:  # each trainer the rows it reads (partitioned), in both runtimes
            v.round_fetch[b0] = mine
        elif not t.distributed:  # a replicated cache in one process fetches each row once
            v.round_fetch[b0] = by_shard(rp.fetch_keys, k)
        else:  # every trainer all but the others' private rows
            v.round_fetch[b0] = sum(by_shard(rp.fetch_for(i)[0], k) for i in range(n))
        for p in rp.iters:
            v.write_back[p.b] = by_shard(p.evict_keys, k)
            v.sync_now[p.b], v.sync_later[p.b] = p.sync_now, p.sync_later
            v.unique_rows[p.b] = len(p.uniq)
        t.send(v, b0, plans.lookahead_plans(kb, n, rp, lrpp, v.plan_trainer_bytes))
        if making is not None:
            making.time(rp)
    if making is not None:
        making.into(v)
    if lookahead is None:  # bagpipe's own: the baselines' default capacity
        t.info["bagpipe_peak_resident_rows"], t.info["round"] = oracle.peak_resident, oracle.C
    if cfg.cache_rows is not None and cfg.cache_rows < oracle.peak_resident:  # as train refuses it
        raise ConfigError(f"cache capacity {cfg.cache_rows} rows is below the lookahead's peak "
                          f"of {oracle.peak_resident} rows ({s.name}); raise --cache-rows or "
                          "lower --lookahead")
    return v


def prefetch_volumes(t: _Trace, s: SystemSpec) -> Volumes:
    """The one-batch prefetch pipeline: the lookahead oracle at L = 1, every row synchronised."""
    return lookahead_volumes(t, s, lookahead=1, lrpp=False)


def policy_volumes(t: _Trace, s: SystemSpec, split: bool = False) -> Volumes:
    """A fixed-capacity cache following its planner policy (`s.planner_decisions()`): misses fetched when
    the iteration starts, victims written back first, by the plan its registry entry builds;
    `split` (hotline): the share of samples computed while the misses are fetched too."""
    k, capacity, kb = t.cfg.servers, t.capacity(), t.key_bytes
    trace = t.trace()
    decisions = s.planner_decisions()(trace, capacity, t.cfg.hot_sample)
    v = t.empty(s.name)
    if split:
        v.popular = np.ones(t.iterations)
    for rp, held in t.planned(PolicyPlanner(decisions, trace, t.total), v, hold_keys=split):
        if not rp.iters:  # the final write-back of every resident row, after training
            if t.distributed:
                v.plan_end_bytes += plans.policy_last(kb, len(rp.pre_evict_keys))
            continue
        p = rp.iters[0]
        # Distributed: the cache is replicated, every trainer fetches the round's misses.
        v.round_fetch[p.b] = by_shard(rp.fetch_keys, k) * (t.cfg.trainers if t.distributed else 1)
        v.pre_evict[p.b] = by_shard(rp.pre_evict_keys, k)
        v.write_back[p.b] = by_shard(p.evict_keys, k)
        v.sync_now[p.b] = p.sync_now
        v.unique_rows[p.b] = len(p.uniq)
        t.send(v, p.b, plans.policy_round(kb, len(rp.fetch_keys), len(rp.pre_evict_keys),
                                          len(p.uniq), len(p.evict_keys)))
        if split and len(rp.fetch_keys):
            v.popular[p.b] = _popular(t, held[0], rp.fetch_keys)
    return v


def hotline_volumes(t: _Trace, s: SystemSpec) -> Volumes:
    """Hotline: fae's plan, each batch split into samples whose rows are all cached and
    those that wait for the round's fetch (`engine/systems/hotline.py`)."""
    return policy_volumes(t, s, split=True)


def _popular(t: _Trace, keys: np.ndarray, fetched: np.ndarray) -> float:
    """The share of a batch's samples with no fetched row, computed before the rows land:
    of the whole batch in-process (one process runs every trainer's popular samples first),
    of the trainer with the fewest over torch.distributed (the others wait for it)."""
    waits = np.isin(keys, fetched).reshape(t.cfg.batch_size, -1).any(axis=1)
    per = 1.0 - waits.reshape(t.cfg.trainers, -1).mean(axis=1)
    return float(per.min() if t.distributed else per.mean())


def _no_plan(t: _Trace) -> Oracle:
    """The planner of a system without a planned cache (engine/planning/builders.py's `no_plan`)."""
    return Oracle(t.total, 1, 1, t.cfg.trainers, None, lrpp=False)


def _planless_round(t: _Trace, s: SystemSpec, v: Volumes, b: int, uniq: np.ndarray) -> None:
    """Rank 0's plan of iteration b of a system without a planned cache: U_b where its
    trainers read the global batch, else |U_b| alone."""
    n = t.cfg.trainers
    t.send(v, b, plans.view_round(t.key_bytes, n, len(uniq)) if s.global_view else plans.count_round(n))


def fetched_volumes(t: _Trace, s: SystemSpec) -> Volumes:
    """No cache (sync): every iteration fetches its rows and pushes their gradients."""
    v = t.empty(s.name)
    v.push_gradients = True
    v.messages = t.cfg.trainers  # each trainer's request, in both runtimes
    v.empty_fetch_message = t.cfg.servers == 1  # a fetch is sent even for no rows
    for rp, (keys,) in t.planned(_no_plan(t), v, hold_keys=True):
        b, uniq = rp.iters[0].b, rp.iters[0].uniq
        v.unique_rows[b] = len(uniq)
        v.read_fetch[b, 0] = v.write_back[b] = t.pushed(keys, uniq)
        _planless_round(t, s, v, b, uniq)
    return v


def stale_volumes(t: _Trace, s: SystemSpec) -> Volumes:
    """A bounded-staleness cache (het): each trainer refetches what is missing or too stale
    (`staleness.HetState`), and pushes its gradients."""
    cfg, k, n = t.cfg, t.cfg.servers, t.cfg.trainers
    v = t.empty(s.name, 1 if t.distributed else n)
    v.push_gradients = True
    state = HetState(t.total, n, cfg.staleness)
    for rp, (keys,) in t.planned(_no_plan(t), v, hold_keys=True):
        b, uniq = rp.iters[0].b, rp.iters[0].uniq
        v.unique_rows[b] = len(uniq)
        needs = state.step(keys, uniq)
        if t.distributed:  # the server serves the trainers' fetches in turn
            needs = [np.concatenate(needs)]
        for i, need in enumerate(needs):
            v.read_fetch[b, i] = by_shard(need, k)
        v.write_back[b] = t.pushed(keys, uniq)
        _planless_round(t, s, v, b, uniq)
    return v


def local_volumes(t: _Trace, s: SystemSpec) -> Volumes:
    """Every table on the trainer (local): nothing moves but the all-reduce of U_b's rows,
    once the tables are copied to the trainers (untimed; each trainer its own copy over
    torch.distributed, one for the process in-process)."""
    v = t.empty(s.name)
    v.setup_rows = t.total * (t.cfg.trainers if t.distributed else 1)
    for rp, _ in t.planned(_no_plan(t), v):
        b, uniq = rp.iters[0].b, rp.iters[0].uniq
        v.unique_rows[b] = v.sync_now[b] = len(uniq)
        _planless_round(t, s, v, b, uniq)
    return v

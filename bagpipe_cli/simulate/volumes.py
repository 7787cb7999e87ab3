"""Per-iteration communication volumes of every system, from a dataset's batch trace.

The plans are the engine's own (`Oracle` for bagpipe, `PolicyPlanner` for lru/lfu/fae,
whose decisions are `bagpipe profile`'s simulators'), run over the batches `bagpipe train`
would read, so the counts are the ones a run records in metrics.csv: rows fetched per
round, written back per iteration, `sync_now` / `sync_later` per iteration. het's
per-trainer fetches replay `HetSystem`'s staleness rule; sync and het push gradients. Rows
are split by shard (`key % K`) because every server has its own link.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from bagpipe_cli.data.format import Dataset, open_dataset, table_offsets
from bagpipe_cli.engine.oracle import Oracle, batch_keys
from bagpipe_cli.engine.planner import PolicyPlanner, trace_of
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.engine.setup import split_rows
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.simulate.model import SYSTEMS, Volumes

RUNTIMES = ("inproc", "distributed")


@dataclass(frozen=True)
class TraceConfig:
    """Which batches are traced and how the systems are set up (as `bagpipe train` options)."""

    data: str  # dataset directory
    batch_size: int = 1024  # global batch size
    iterations: int | None = None  # None: every full batch of the training rows once
    lookahead: int = 16  # bagpipe's L (and lru/lfu/fae's default capacity: bagpipe's peak)
    round: int | None = None  # bagpipe's C (default L/4)
    cache_rows: int | None = None  # lru/lfu/fae capacity (default: bagpipe's peak)
    staleness: int = 0  # het
    trainers: int = 1  # N
    servers: int = 1  # K
    eval_rows: int | None = None  # held-out tail, as `bagpipe train` (default 10%, <= 50,000)
    # inproc: one process for every trainer (what it fetches, it fetches once);
    # distributed: a process per trainer (torch.distributed), each fetching what it needs
    runtime: str = "inproc"
    hot_sample: float = 1.0  # fae: the fraction of the batches whose hottest rows it caches

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


def _train_rows(ds: Dataset, cfg: TraceConfig) -> int:
    """Training rows, split off the held-out tail exactly as `bagpipe train` does."""
    return split_rows(ds, cfg.batch_size, cfg.eval_rows)[0]


def _key_batches(ds: Dataset, cfg: TraceConfig, iterations: int) -> Callable[[], Iterator[np.ndarray]]:
    """The global keys [B*T] of every iteration, wrapping around like `feed.iter_train_batches`."""
    offsets = table_offsets(ds.meta.cardinalities)
    per_epoch = _train_rows(ds, cfg) // cfg.batch_size

    def gen() -> Iterator[np.ndarray]:
        for b in range(iterations):
            lo = (b % per_epoch) * cfg.batch_size
            yield batch_keys(ds.sparse_block(lo, lo + cfg.batch_size), offsets)

    return gen


def _by_shard(keys: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(np.asarray(keys, np.int64) % k, minlength=k)


def trace_volumes(cfg: TraceConfig, systems: tuple[str, ...] | list[str],
                  progress: Callable[[str], None] | None = None) -> tuple[dict[str, Volumes], dict]:
    """Volumes of each system in `systems`, and facts about the trace (peak, capacity, ...)."""
    for s in systems:
        if s not in SYSTEMS:
            raise ConfigError(f"--systems: unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    ds = open_dataset(cfg.data)
    train_rows = _train_rows(ds, cfg)
    iterations = cfg.iterations or train_rows // cfg.batch_size
    t = _Trace(cfg, _key_batches(ds, cfg, iterations), iterations, int(sum(ds.meta.cardinalities)))
    info: dict = {"iterations": iterations, "embedding_rows": t.total, "tables": ds.meta.num_tables,
                  "dense_features": ds.meta.num_dense, "dataset_rows": ds.rows,
                  "train_rows": train_rows}
    say = progress or (lambda s: None)
    specs = [spec(s) for s in systems]
    out: dict[str, Volumes] = {}
    oracle = [s.name for s in specs if s.planner == "oracle"]
    policies = [s.name for s in specs if s.planner == "policy"]
    if oracle or (policies and cfg.cache_rows is None):  # the baselines' default: bagpipe's peak
        say(", ".join(oracle) or "bagpipe's peak")
        v, info["bagpipe_peak_resident_rows"], info["round"] = _oracle_volumes(t)
        out.update({name: replace(v, system=name) for name in oracle})
    if policies:
        info["cache_rows"] = cfg.cache_rows or max(1, info["bagpipe_peak_resident_rows"])
        trace = trace_of(t.keys(), t.total)
        for pol in policies:
            say(pol)
            out[pol] = _policy_volumes(t, pol, trace, info["cache_rows"])
        del trace
    plain = [s for s in specs if s.planner == "none"]
    if plain:
        say(", ".join(s.name for s in plain))
        out.update(_plain_volumes(t, plain))
    return {s: out[s] for s in systems}, info


@dataclass
class _Trace:
    cfg: TraceConfig
    keys: Callable[[], Iterator[np.ndarray]]
    iterations: int
    total: int

    @property
    def distributed(self) -> bool:
        return self.cfg.runtime == "distributed"

    def empty(self, system: str, m: int = 1) -> Volumes:
        i, k = self.iterations, self.cfg.servers
        z = np.zeros((i, k), np.int64)
        # Distributed: a server serves the trainers' requests one after another (lockstep),
        # so a transfer is every trainer's rows on that server, with a latency each.
        return Volumes(system, i, k, np.ones(i, bool), z.copy(), z.copy(),
                       np.zeros((i, m, k), np.int64), z.copy(),
                       np.zeros(i, np.int64), np.zeros(i, np.int64), np.zeros(i, np.int64),
                       messages=self.cfg.trainers if self.distributed else 1,
                       all_gather=self.distributed)

    def slices(self, keys: np.ndarray) -> list[np.ndarray]:
        """The unique keys of each trainer's samples."""
        per = len(keys) // self.cfg.trainers
        return [np.unique(keys[i * per:(i + 1) * per]) for i in range(self.cfg.trainers)]


def _oracle_volumes(t: _Trace) -> tuple[Volumes, int, int]:
    """The lookahead oracle's rounds (bagpipe), its peak and round length."""
    cfg, k = t.cfg, t.cfg.servers
    oracle = Oracle(t.total, cfg.lookahead, cfg.round, cfg.trainers, None)
    v = t.empty("bagpipe")
    v.round_start[:] = False
    v.prefetch_ahead = True
    n = cfg.trainers
    for rp in oracle.plan(t.keys()):
        b0 = rp.iters[0].b
        v.round_start[b0] = True
        if t.distributed:  # each trainer fetches the round but the others' private rows
            v.round_fetch[b0] = sum(_by_shard(rp.fetch_for(i)[0], k) for i in range(n))
        else:
            v.round_fetch[b0] = _by_shard(rp.fetch_keys, k)
        for p in rp.iters:
            v.write_back[p.b] = _by_shard(p.evict_keys, k)
            v.sync_now[p.b], v.sync_later[p.b] = p.sync_now, p.sync_later
            v.unique_rows[p.b] = len(p.uniq)
    return v, oracle.peak_resident, oracle.C


def _policy_volumes(t: _Trace, policy: str, trace, capacity: int) -> Volumes:
    """lru/lfu/fae: misses fetched when the iteration starts, victims written back first."""
    k = t.cfg.servers
    v = t.empty(policy)
    for rp in PolicyPlanner(policy, trace, capacity, t.total, t.cfg.hot_sample).plan(t.keys()):
        if not rp.iters:
            continue  # the final write-back of every resident row, after training
        p = rp.iters[0]
        # Distributed: the cache is replicated, every trainer fetches the round's misses.
        v.round_fetch[p.b] = _by_shard(rp.fetch_keys, k) * (t.cfg.trainers if t.distributed else 1)
        v.pre_evict[p.b] = _by_shard(rp.pre_evict_keys, k)
        v.write_back[p.b] = _by_shard(p.evict_keys, k)
        v.sync_now[p.b] = p.sync_now
        v.unique_rows[p.b] = len(p.uniq)
    return v


def _plain_volumes(t: _Trace, specs: list) -> dict[str, Volumes]:
    """Systems without a planned cache: fetched every iteration and pushed (sync), cached
    with a staleness bound and pushed (het), or every table local (local)."""
    cfg, k, n = t.cfg, t.cfg.servers, t.cfg.trainers
    per_trainer = n if not t.distributed else 1
    out = {s.name: t.empty(s.name, per_trainer if s.store == "stale-cache" else 1) for s in specs}
    stale = any(s.store == "stale-cache" for s in specs)
    het_state = _HetState(t.total, n, cfg.staleness) if stale else None
    for s in specs:
        out[s.name].push_gradients = not s.replicated
        out[s.name].empty_fetch_message = s.store == "none" and k == 1
    for b, kb in enumerate(t.keys()):
        uniq = np.unique(kb)
        # What each process fetches and pushes: U_b in-process, its own samples' rows apart.
        shards = (sum(_by_shard(x, k) for x in t.slices(kb)) if t.distributed else _by_shard(uniq, k))
        stale_needs = het_state.step(kb, uniq) if het_state is not None else []
        if t.distributed and stale_needs:  # the server serves the trainers' fetches in turn
            stale_needs = [np.concatenate(stale_needs)]
        for s in specs:
            v = out[s.name]
            v.unique_rows[b] = len(uniq)
            if s.store == "tables":
                v.sync_now[b] = len(uniq)
            elif s.store == "none":
                v.read_fetch[b, 0] = shards
                v.write_back[b] = shards
            else:
                for i, need in enumerate(stale_needs):
                    v.read_fetch[b, i] = _by_shard(need, k)
                v.write_back[b] = shards
    return out


class _HetState:
    """HetSystem's rule: a trainer refetches a row it has not cached or whose copy lags
    the servers' version by more than `staleness`; every row of U_b gets one version more."""

    def __init__(self, total: int, trainers: int, staleness: int):
        self.version = np.zeros(total, np.int32)
        self.cached = np.full((trainers, total), -1, np.int32)  # cached version, -1: not cached
        self.n, self.s = trainers, staleness

    def step(self, keys: np.ndarray, uniq: np.ndarray) -> list[np.ndarray]:
        per = len(keys) // self.n
        needs = []
        for i in range(self.n):
            kk = np.unique(keys[i * per:(i + 1) * per])
            cv = self.cached[i, kk]
            need = (cv < 0) | (self.version[kk] - cv > self.s)
            nk = kk[need]
            self.cached[i, nk] = self.version[nk]
            needs.append(nk)
        self.version[uniq] += 1
        return needs

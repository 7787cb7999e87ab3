"""Per-iteration communication volumes of every system, from a dataset's batch trace.

The plans are the engine's own (`Oracle` for bagpipe, `PolicyPlanner` for lru/lfu/fae,
whose decisions are `bagpipe profile`'s simulators'), run over the batches `bagpipe train`
would read, so the counts are the ones a run records in metrics.csv: rows fetched per
round, written back per iteration, `sync_now` / `sync_later` per iteration. het's
per-trainer fetches replay `HetSystem`'s staleness rule. Rows are split by shard
(`key % K`) because every server has its own link.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from bagpipe_cli.data.format import Dataset, open_dataset, table_offsets
from bagpipe_cli.engine.oracle import Oracle, batch_keys
from bagpipe_cli.engine.planner import PolicyPlanner, trace_of
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.simulate.model import SYSTEMS, Volumes


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

    def __post_init__(self) -> None:
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
    from bagpipe_cli.engine.trainer import split_rows

    return split_rows(ds, cfg)[0]


def _key_batches(ds: Dataset, cfg: TraceConfig, iterations: int) -> Callable[[], Iterator[np.ndarray]]:
    """The global keys [B*T] of every iteration, wrapping around like `iter_train_batches`."""
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
    keys = _key_batches(ds, cfg, iterations)
    total = int(sum(ds.meta.cardinalities))
    k, n = cfg.servers, cfg.trainers
    info: dict = {"iterations": iterations, "embedding_rows": total, "tables": ds.meta.num_tables,
                  "dense_features": ds.meta.num_dense, "dataset_rows": ds.rows,
                  "train_rows": train_rows}
    out: dict[str, Volumes] = {}
    say = progress or (lambda s: None)

    def empty(system: str, m: int = 1) -> Volumes:
        z = np.zeros((iterations, k), np.int64)
        return Volumes(system, iterations, k, np.ones(iterations, bool), z.copy(), z.copy(),
                       np.zeros((iterations, m, k), np.int64), z.copy(),
                       np.zeros(iterations, np.int64), np.zeros(iterations, np.int64),
                       np.zeros(iterations, np.int64))

    need_peak = any(s in systems for s in ("lru", "lfu", "fae")) and cfg.cache_rows is None
    if need_peak or "bagpipe" in systems:
        say("bagpipe")
        oracle = Oracle(total, cfg.lookahead, cfg.round, n, None)
        v = empty("bagpipe")
        v.round_start[:] = False
        v.prefetch_ahead = True
        for rp in oracle.plan(keys()):
            b0 = rp.iters[0].b
            v.round_start[b0] = True
            v.round_fetch[b0] = _by_shard(rp.fetch_keys, k)
            for p in rp.iters:
                v.write_back[p.b] = _by_shard(p.evict_keys, k)
                v.sync_now[p.b], v.sync_later[p.b] = p.sync_now, p.sync_later
                v.unique_rows[p.b] = len(p.uniq)
        info["bagpipe_peak_resident_rows"] = oracle.peak_resident
        info["round"] = oracle.C
        if "bagpipe" in systems:
            out["bagpipe"] = v
    policies = [s for s in ("lru", "lfu", "fae") if s in systems]
    if policies:
        capacity = cfg.cache_rows or max(1, info["bagpipe_peak_resident_rows"])
        info["cache_rows"] = capacity
        trace = trace_of(keys(), total)
        for pol in policies:
            say(pol)
            v = empty(pol)
            for rp in PolicyPlanner(pol, trace, capacity, total,
                                    getattr(cfg, "hot_sample", 1.0)).plan(keys()):
                if not rp.iters:
                    continue  # the final write-back of every resident row, after training
                p = rp.iters[0]
                v.round_fetch[p.b] = _by_shard(rp.fetch_keys, k)
                v.pre_evict[p.b] = _by_shard(rp.pre_evict_keys, k)
                v.write_back[p.b] = _by_shard(p.evict_keys, k)
                v.sync_now[p.b] = p.sync_now
                v.unique_rows[p.b] = len(p.uniq)
            out[pol] = v
        del trace
    if any(s in systems for s in ("sync", "het", "local")):
        say("sync, het, local")
        sync, local, het = empty("sync"), empty("local"), empty("het", n)
        sync.empty_fetch_message = k == 1
        het.push_gradients = True
        het_state = _HetState(total, n, cfg.staleness) if "het" in systems else None
        for b, kb in enumerate(keys()):
            uniq = np.unique(kb)
            shards = _by_shard(uniq, k)
            for v in (sync, local, het):
                v.unique_rows[b] = len(uniq)
            sync.read_fetch[b, 0] = shards
            sync.write_back[b] = shards
            local.sync_now[b] = len(uniq)
            if het_state is not None:
                for i, need in enumerate(het_state.step(kb, uniq)):
                    het.read_fetch[b, i] = _by_shard(need, k)
                het.write_back[b] = shards
        for s, v in (("sync", sync), ("local", local), ("het", het)):
            if s in systems:
                out[s] = v
    return {s: out[s] for s in systems}, info


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

"""Embedding systems: where an iteration's rows come from and where their updates go.

Every system implements the same three stages, called by the trainer loop:

- `begin_round(round)`: at a round boundary (main thread): e.g. insert prefetched rows and
  start fetching the next round in the background (transport workers);
- `read(step)`: the rows (and optimizer state) of U_b, in `step.plan.uniq` order;
- `update(step, rows, state, grad)`: apply the row optimizer and store the updated rows
  (in a cache, or back on the servers), then write back what the plan evicts;
- `flush()`: when training ends, everything is back on the servers;
- `resident()`: the rows whose newest value is on the trainer, not on the servers (after
  `flush()`); a checkpoint lays them over the servers' tables.

Everything else (model, gradients, optimizers, synchronisation, metrics) is shared, so a
difference between systems is the policy's alone.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from bagpipe_cli.engine.cache import RowCache
from bagpipe_cli.engine.optim import RowOptimizer
from bagpipe_cli.engine.oracle import IterPlan, RoundPlan
from bagpipe_cli.engine.server import gather_shards, scatter_to_shards
from bagpipe_cli.engine.transport import RowsFuture, Transport


@dataclass
class Step:
    """Per-iteration state in flight."""

    plan: IterPlan
    dense: torch.Tensor
    labels: torch.Tensor
    times: dict[str, float] = field(default_factory=dict)
    rows_fetched: int = 0  # rows transferred from the servers for this iteration
    rows_written_back: int = 0
    cache_hits: int = 0  # rows of U_b that were already on the trainer
    emb: torch.Tensor | None = None  # [B*T, dim] values each access reads, if not rows[inverse]
    extra: dict[str, float] = field(default_factory=dict)  # system-specific metrics


class EmbeddingSystem(ABC):
    """The interface every system implements (see the module docstring)."""

    name: str = ""
    planner: str = "oracle"  # what plans the cache: "oracle", "policy" (lru/lfu/fae) or "none"

    def __init__(self, transport: Transport):
        self.transport = transport
        self._pending_writes: list[Future] = []

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        """Prepare a round; returns seconds spent waiting for data."""
        return 0.0

    @abstractmethod
    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]: ...

    def update(self, step: Step, rows: torch.Tensor, state: torch.Tensor, grad: torch.Tensor,
               opt: RowOptimizer) -> None:
        """Apply the row optimizer to U_b's rows and store them."""
        new_rows, new_state = opt.step(rows, state, grad)
        self.write(step, new_rows, new_state)

    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None:
        raise NotImplementedError

    def sync_rows(self, plan: IterPlan) -> tuple[int, int]:
        """Embedding rows all-reduced between trainers: (on the critical path, asynchronously).

        The plan says: bagpipe's LRPP lists, or the baselines' rows with sync_later = 0.
        """
        return plan.sync_now, plan.sync_later

    def _write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> None:
        if len(keys):
            self._pending_writes.extend(self.transport.write_back(keys, rows, state))
        # Completed writes need not be kept; this bounds the list.
        if len(self._pending_writes) > 64:
            self._pending_writes = [f for f in self._pending_writes if not f.done()]

    def flush(self) -> None:
        """Wait until every write-back has landed on the servers."""
        for f in self._pending_writes:
            f.result()
        self._pending_writes = []

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        """(keys, rows, state) held on the trainer with a newer value than the servers'."""
        return np.empty(0, np.int64), torch.empty(0, 0), torch.empty(0, 0)


class SyncSystem(EmbeddingSystem):
    """No cache: fetch U_b from the servers every iteration, write the updates straight back.

    The write-back of iteration b is queued on each server before the fetch of b+1, so the
    next fetch always sees it (servers serve requests in order). Like a parameter server,
    the write-back is the synchronisation: no collective between trainers.
    """

    name = "sync"
    planner = "none"

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        rows, state = self.transport.fetch(step.plan.uniq).result()
        step.times["prefetch_wait"] = time.perf_counter() - t0
        step.rows_fetched = len(step.plan.uniq)
        return rows, state

    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None:
        self._write_back(step.plan.uniq, rows, state)
        step.rows_written_back = len(step.plan.uniq)

    def sync_rows(self, plan: IterPlan) -> tuple[int, int]:
        return 0, 0


class CacheSystem(EmbeddingSystem):
    """A trainer cache run by a plan: bagpipe (oracle, prefetched a round ahead) or the
    lru/lfu/fae baselines (policy planner, fetched on miss when the iteration starts).

    Stages: at the start of round r (main thread) write back the round's victims (lru/lfu),
    get round r's rows (prefetched during round r-1, or fetched now), insert them at the
    plan's slots, and, with prefetch, start fetching round r+1 (the transport's server
    workers do the transfer while the model computes). Per iteration, rows are read and
    updated in the cache by slot; rows the plan evicts are written back asynchronously.
    """

    def __init__(self, name: str, transport: Transport, cache: RowCache, prefetch_ahead: bool):
        super().__init__(transport)
        self.name = name
        self.planner = "oracle" if prefetch_ahead else "policy"
        self.cache = cache
        self.prefetch_ahead = prefetch_ahead
        self._inflight: dict[int, RowsFuture] = {}
        self._pre_evicted = 0
        self.written_back_at_end = 0  # rows still resident when training ended
        # The key held in each slot (-1: free), for checkpoints: set on insert, cleared on eviction.
        self.slot_key = np.full(cache.capacity, -1, dtype=np.int64)

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        t0 = time.perf_counter()
        self._pre_evicted = len(rp.pre_evict_keys)
        if not rp.iters:  # the planner's final round: everything resident goes back
            self.written_back_at_end += self._pre_evicted
        if len(rp.pre_evict_keys):
            rows_out, state_out = self.cache.read(rp.pre_evict_slots)
            self._write_back(rp.pre_evict_keys, rows_out.cpu(), state_out.cpu())
            self.forget(rp.pre_evict_slots)
        fut = self._inflight.pop(rp.r, None)
        if len(rp.fetch_keys):
            rows, state = (fut or self.transport.fetch(rp.fetch_keys)).result()
            self.cache.insert(rp.fetch_slots, rows, state)
            self.slot_key[rp.fetch_slots] = rp.fetch_keys
        waited = time.perf_counter() - t0
        # Every write-back of earlier iterations is already queued, so the servers serve this
        # fetch after them (see the oracle on why that is early enough).
        if self.prefetch_ahead and next_rp is not None and len(next_rp.fetch_keys):
            self._inflight[next_rp.r] = self.transport.fetch(next_rp.fetch_keys)
        return waited

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        p = step.plan
        step.rows_fetched = p.fetched
        step.cache_hits = len(p.uniq) - p.fetched
        return self.cache.read(p.slots)

    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None:
        p = step.plan
        self.cache.write(p.slots, rows, state)
        if len(p.evict_keys):
            rows_out, state_out = self.cache.read(p.evict_slots)
            self._write_back(p.evict_keys, rows_out.cpu(), state_out.cpu())
            self.forget(p.evict_slots)
        step.rows_written_back = len(p.evict_keys) + self._pre_evicted
        self._pre_evicted = 0  # counted with the round's first iteration

    def forget(self, slots: np.ndarray) -> None:
        """Slots whose rows were evicted (their write-back is queued or done)."""
        self.slot_key[slots] = -1

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        slots = np.flatnonzero(self.slot_key >= 0)
        rows, state = self.cache.read(slots)
        return self.slot_key[slots], rows.cpu(), state.cpu()


class LocalSystem(EmbeddingSystem):
    """Every table resident on the trainer: the upper bound, no remote traffic.

    The tables are copied from the servers before training (not timed) and written back
    after it, so evaluation and saved models see the final values.
    """

    name = "local"
    planner = "none"

    def __init__(self, transport: Transport, servers: list):
        super().__init__(transport)
        self.servers = servers
        self.weight, self.state = gather_shards(servers)

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(step.plan.uniq)
        step.cache_hits = len(idx)
        return self.weight.index_select(0, idx), self.state.index_select(0, idx)

    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None:
        idx = torch.from_numpy(step.plan.uniq)
        self.weight.index_copy_(0, idx, rows)
        if self.state.shape[1]:
            self.state.index_copy_(0, idx, state)

    def sync_rows(self, plan: IterPlan) -> tuple[int, int]:
        return len(plan.uniq), 0  # data-parallel replicas: every used row is all-reduced

    def flush(self) -> None:
        scatter_to_shards(self.servers, self.weight, self.state)

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        return np.arange(self.weight.shape[0]), self.weight.clone(), self.state.clone()


class HetSystem(EmbeddingSystem):
    """HET-style bounded staleness: each trainer caches the rows it fetched, and reads its
    copy while it is at most `staleness` versions behind the servers' (HET's clock bound);
    otherwise it fetches the row again. Gradients are pushed to the servers, which apply
    the row optimizer (one version per update). With staleness 0 every read sees the
    latest version, so it equals `sync`; with s > 0 it fetches less and trains on stale rows.
    A trainer's cache keeps every row it fetched (no capacity limit).
    """

    name = "het"
    planner = "none"

    def __init__(self, transport: Transport, total_rows: int, trainers: int, staleness: int,
                 dim: int, batch_size: int):
        super().__init__(transport)
        self.s = staleness
        self.n = trainers
        self.per = batch_size // trainers
        self.version = np.zeros(total_rows, dtype=np.int64)  # servers' version of every row
        self.slot_of = np.full((trainers, total_rows), -1, dtype=np.int32)
        self.cached_version = [np.zeros(0, np.int64) for _ in range(trainers)]
        self.store = [torch.empty(0, dim) for _ in range(trainers)]
        self._count = [0] * trainers  # rows each trainer has cached
        self._pending_updates: list[Future] = []

    def _ensure(self, i: int, need: int) -> None:
        cap = self.store[i].shape[0]
        if need > cap:
            new = max(need, 2 * cap, 1024)
            grown = torch.empty(new, self.store[i].shape[1])
            grown[:cap] = self.store[i]
            self.store[i] = grown
            cv = np.zeros(new, np.int64)
            cv[:cap] = self.cached_version[i]
            self.cached_version[i] = cv

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        p = step.plan
        t_wait = 0.0
        n_tables = len(p.inverse) // (self.per * self.n)
        emb = torch.empty(len(p.inverse), self.store[0].shape[1])
        fetched = stale = 0
        for i in range(self.n):
            pos = slice(i * self.per * n_tables, (i + 1) * self.per * n_tables)
            keys = np.unique(p.uniq[p.inverse[pos]])
            slots = self.slot_of[i, keys]
            have = slots >= 0
            lag = np.zeros(len(keys), np.int64)
            lag[have] = self.version[keys[have]] - self.cached_version[i][slots[have]]
            need = ~have | (lag > self.s)
            stale += int(((lag > 0) & ~need).sum())
            if need.any():
                nk = keys[need]
                new_keys = keys[~have]
                used = self._count[i]
                self._ensure(i, used + len(new_keys))
                self.slot_of[i, new_keys] = np.arange(used, used + len(new_keys))
                self._count[i] = used + len(new_keys)
                t0 = time.perf_counter()
                rows, _ = self.transport.fetch(nk).result()
                t_wait += time.perf_counter() - t0
                s_idx = self.slot_of[i, nk]
                self.store[i][torch.from_numpy(s_idx)] = rows
                self.cached_version[i][s_idx] = self.version[nk]
                fetched += len(nk)
            emb[pos] = self.store[i][torch.from_numpy(self.slot_of[i, p.uniq[p.inverse[pos]]])]
        step.emb = emb
        step.rows_fetched = fetched
        step.cache_hits = len(p.uniq) - fetched if self.n == 1 else 0
        step.extra["stale_reads"] = stale
        step.times["prefetch_wait"] = t_wait
        return emb.new_empty(len(p.uniq), emb.shape[1]), emb.new_empty(len(p.uniq), 0)

    def update(self, step: Step, rows: torch.Tensor, state: torch.Tensor, grad: torch.Tensor,
               opt: RowOptimizer) -> None:
        p = step.plan
        self._pending_updates.extend(self.transport.push_gradients(p.uniq, grad, opt))
        self.version[p.uniq] += 1
        step.rows_written_back = len(p.uniq)

    def sync_rows(self, plan: IterPlan) -> tuple[int, int]:
        return 0, 0  # gradients go to the servers (parameter-server style)

    def flush(self) -> None:
        for f in self._pending_updates:
            f.result()
        self._pending_updates = []
        super().flush()


SYSTEMS = ("sync", "bagpipe", "lru", "lfu", "fae", "het", "local")

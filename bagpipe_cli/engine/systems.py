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

In-process, one system object stands for every trainer. In a torch.distributed run each
trainer rank has its own, built with `member=(i, N)`: it fetches what trainer i needs,
writes back its share of evicted rows (`key % N == i`), and updates rows by position
(`update_rows`), since LRPP gives each trainer its own rows to update. Such a system sends
the same sequence of requests as every other trainer's, empty ones included (the servers
serve the trainers in lockstep, see `engine/distributed.py`).
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

    def update_rows(self, plan: IterPlan, idx: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        """Apply the row optimizer to the rows at positions `idx` of U_b only (a trainer of a
        torch.distributed run); `grad` holds their summed gradients, in `idx` order."""
        raise NotImplementedError(f"{self.name} does not update rows by position")

    def sync_rows(self, plan: IterPlan) -> tuple[int, int]:
        """Embedding rows all-reduced between trainers: (on the critical path, asynchronously).

        The plan says: bagpipe's LRPP lists, or the baselines' rows with sync_later = 0.
        """
        return plan.sync_now, plan.sync_later

    def _write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> None:
        # Sent even when empty: the torch transport keeps every trainer's requests in
        # lockstep (the in-process one sends nothing for no rows).
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

    As trainer i of N (`member`), it fetches every row of a round except the rows private to
    another trainer (`RoundPlan.fetch_for`) and writes back the victims with `key % N == i`.
    """

    def __init__(self, name: str, transport: Transport, cache: RowCache, prefetch_ahead: bool,
                 member: tuple[int, int] | None = None):
        super().__init__(transport)
        self.name = name
        self.planner = "oracle" if prefetch_ahead else "policy"
        self.cache = cache
        self.prefetch_ahead = prefetch_ahead
        self.member = member
        self._inflight: dict[int, RowsFuture] = {}
        self.pre_evicted = 0  # rows this system wrote back at the current round's start
        self.written_back_at_end = 0  # rows still resident when training ended
        # The key held in each slot (-1: free), for checkpoints: set on insert, cleared on eviction.
        self.slot_key = np.full(cache.capacity, -1, dtype=np.int64)

    def _fetch_of(self, rp: RoundPlan) -> tuple[np.ndarray, np.ndarray]:
        return rp.fetch_for(self.member[0]) if self.member else (rp.fetch_keys, rp.fetch_slots)

    def writes_back(self, keys: np.ndarray) -> np.ndarray:
        """Which of the evicted `keys` this system writes back (all of them in-process)."""
        if self.member is None:
            return np.ones(len(keys), dtype=bool)
        i, n = self.member
        return keys % n == i

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        t0 = time.perf_counter()
        self.pre_evicted = 0
        if len(rp.pre_evict_keys):
            mine = self.writes_back(rp.pre_evict_keys)
            self.write_back_slots(rp.pre_evict_keys[mine], rp.pre_evict_slots[mine])
            self.forget(rp.pre_evict_slots)
            self.pre_evicted = int(mine.sum())
        if not rp.iters:  # the planner's final round: everything resident goes back
            self.written_back_at_end += self.pre_evicted
        fut = self._inflight.pop(rp.r, None)
        if len(rp.fetch_keys):
            keys, slots = self._fetch_of(rp)
            rows, state = (fut or self.transport.fetch(keys)).result()
            self.cache.insert(slots, rows, state)
            self.slot_key[slots] = keys
        waited = time.perf_counter() - t0
        # Every write-back of earlier iterations is already queued, so the servers serve this
        # fetch after them (see the oracle on why that is early enough).
        if self.prefetch_ahead and next_rp is not None and len(next_rp.fetch_keys):
            self._inflight[next_rp.r] = self.transport.fetch(self._fetch_of(next_rp)[0])
        return waited

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        p = step.plan
        step.rows_fetched = p.fetched_by(self.member[0]) if self.member else p.fetched
        step.cache_hits = len(p.uniq) - p.fetched
        return self.cache.read(p.slots)

    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None:
        p = step.plan
        self.cache.write(p.slots, rows, state)
        if len(p.evict_keys):
            self.write_back_slots(p.evict_keys, p.evict_slots)
            self.forget(p.evict_slots)
        step.rows_written_back = len(p.evict_keys) + self.pre_evicted
        self.pre_evicted = 0  # counted with the round's first iteration

    def update_rows(self, plan: IterPlan, idx: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        slots = plan.slots[idx]
        rows, state = self.cache.read(slots)
        self.cache.write(slots, *opt.step(rows, state, grad))

    def write_back_slots(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Send the rows at `slots` (holding `keys`) back to their servers."""
        rows, state = self.cache.read(slots)
        self._write_back(keys, rows.cpu(), state.cpu())

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
    after it, so evaluation and saved models see the final values. In-process they are
    copied from the server objects (`servers`); a trainer of a torch.distributed run fetches
    them whole, and trainer 0 writes them back at the end.
    """

    name = "local"
    planner = "none"

    def __init__(self, transport: Transport, servers: list | None = None, total_rows: int = 0,
                 member: tuple[int, int] | None = None, device: str | torch.device = "cpu"):
        super().__init__(transport)
        self.servers = servers
        self.member = member
        if servers is not None:
            self.weight, self.state = gather_shards(servers)
        else:
            self.weight, self.state = transport.fetch(np.arange(total_rows)).result()
        self.weight, self.state = self.weight.to(device), self.state.to(device)

    def _idx(self, keys: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(keys).to(self.weight.device)

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._idx(step.plan.uniq)
        step.cache_hits = len(idx)
        return self.weight.index_select(0, idx), self.state.index_select(0, idx)

    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None:
        self._store(step.plan.uniq, rows, state)

    def _store(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> None:
        idx = self._idx(keys)
        self.weight.index_copy_(0, idx, rows)
        if self.state.shape[1]:
            self.state.index_copy_(0, idx, state)

    def update_rows(self, plan: IterPlan, idx: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        keys = plan.uniq[idx]
        t = self._idx(keys)
        self._store(keys, *opt.step(self.weight.index_select(0, t), self.state.index_select(0, t), grad))

    def sync_rows(self, plan: IterPlan) -> tuple[int, int]:
        return len(plan.uniq), 0  # data-parallel replicas: every used row is all-reduced

    def flush(self) -> None:
        if self.servers is not None:
            scatter_to_shards(self.servers, self.weight, self.state)
            return
        # Every trainer holds the same tables: trainer 0 sends them, the others an empty
        # write-back (lockstep).
        n = self.weight.shape[0] if self.member[0] == 0 else 0
        self._write_back(np.arange(n), self.weight[:n].cpu(), self.state[:n].cpu())
        super().flush()

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        return np.arange(self.weight.shape[0]), self.weight.cpu().clone(), self.state.cpu().clone()


class HetSystem(EmbeddingSystem):
    """HET-style bounded staleness: each trainer caches the rows it fetched, and reads its
    copy while it is at most `staleness` versions behind the servers' (HET's clock bound);
    otherwise it fetches the row again. Gradients are pushed to the servers, which apply
    the row optimizer (one version per update). With staleness 0 every read sees the
    latest version, so it equals `sync`; with s > 0 it fetches less and trains on stale rows.
    A trainer's cache keeps every row it fetched (no capacity limit).

    `mine` are the trainers this object runs (in-process: all of them; a trainer rank of a
    torch.distributed run: itself, and then it sends a fetch every iteration, empty or not).
    Every trainer knows U_b of every iteration, so each keeps the servers' versions itself.
    """

    name = "het"
    planner = "none"

    def __init__(self, transport: Transport, total_rows: int, trainers: int, staleness: int,
                 dim: int, batch_size: int, mine: list[int] | None = None):
        super().__init__(transport)
        self.s = staleness
        self.n = trainers
        self.per = batch_size // trainers
        self.mine = list(range(trainers)) if mine is None else list(mine)
        self.lockstep = mine is not None
        m = len(self.mine)
        self.version = np.zeros(total_rows, dtype=np.int64)  # servers' version of every row
        self.slot_of = np.full((m, total_rows), -1, dtype=np.int32)
        self.cached_version = [np.zeros(0, np.int64) for _ in range(m)]
        self.store = [torch.empty(0, dim) for _ in range(m)]
        self._count = [0] * m  # rows each trainer has cached
        self._pending_updates: list[Future] = []

    def _ensure(self, c: int, need: int) -> None:
        cap = self.store[c].shape[0]
        if need > cap:
            new = max(need, 2 * cap, 1024)
            grown = torch.empty(new, self.store[c].shape[1])
            grown[:cap] = self.store[c]
            self.store[c] = grown
            cv = np.zeros(new, np.int64)
            cv[:cap] = self.cached_version[c]
            self.cached_version[c] = cv

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """Fills `step.emb` at the accesses of this object's trainers (the rows they read)."""
        p = step.plan
        t_wait = 0.0
        n_tables = len(p.inverse) // (self.per * self.n)
        emb = torch.empty(len(p.inverse), self.store[0].shape[1])
        fetched = stale = 0
        for c, i in enumerate(self.mine):
            pos = slice(i * self.per * n_tables, (i + 1) * self.per * n_tables)
            keys = np.unique(p.uniq[p.inverse[pos]])
            slots = self.slot_of[c, keys]
            have = slots >= 0
            lag = np.zeros(len(keys), np.int64)
            lag[have] = self.version[keys[have]] - self.cached_version[c][slots[have]]
            need = ~have | (lag > self.s)
            stale += int(((lag > 0) & ~need).sum())
            if need.any() or self.lockstep:
                nk = keys[need]
                new_keys = keys[~have]
                used = self._count[c]
                self._ensure(c, used + len(new_keys))
                self.slot_of[c, new_keys] = np.arange(used, used + len(new_keys))
                self._count[c] = used + len(new_keys)
                t0 = time.perf_counter()
                rows, _ = self.transport.fetch(nk).result()
                t_wait += time.perf_counter() - t0
                s_idx = self.slot_of[c, nk]
                self.store[c][torch.from_numpy(s_idx)] = rows
                self.cached_version[c][s_idx] = self.version[nk]
                fetched += len(nk)
            emb[pos] = self.store[c][torch.from_numpy(self.slot_of[c, p.uniq[p.inverse[pos]]])]
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
        self.advance(p)
        step.rows_written_back = len(p.uniq)

    def advance(self, plan: IterPlan) -> None:
        """The servers applied iteration b's gradients: every row of U_b is one version newer."""
        self.version[plan.uniq] += 1

    def sync_rows(self, plan: IterPlan) -> tuple[int, int]:
        return 0, 0  # gradients go to the servers (parameter-server style)

    def flush(self) -> None:
        for f in self._pending_updates:
            f.result()
        self._pending_updates = []
        super().flush()


SYSTEMS = ("sync", "bagpipe", "lru", "lfu", "fae", "het", "local")

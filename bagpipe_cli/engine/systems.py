"""Embedding systems: where an iteration's rows come from and where their updates go.

A system object serves the trainers one process runs (`TrainerSet`): every trainer of the
run in-process, one trainer on a torch.distributed trainer rank. The training loop
(`engine/loop.py`) calls, in order:

- `begin_round(round, next_round)`: at a round boundary: write back the round's victims,
  insert its rows (prefetched during the previous round, or fetched now), start fetching
  the next round (bagpipe);
- `view(plan)`: the rows the process's gradients are taken over, and each access's position
  in them: U_b for the replicated systems, the process's own rows for the pushing ones;
- `read(step, keys, index)`: the values every access of the process's samples reads;
- replicated systems (bagpipe, lru, lfu, fae, local) hold every row of U_b on every trainer
  and all-reduce gradients: `update_rows(plan, idx, grad)` applies the summed gradients to
  rows by position in U_b, and `evict(plan, classes)` writes back this process's share of
  the rows the plan evicts;
- pushing systems (sync, het) send their rows' gradients to the servers, which sum every
  trainer's and apply the optimizer: `push(step, keys, grad)`;
- `flush()`: when training ends, everything is back on the servers; `resident()`: the rows
  whose newest value is on the trainer (a checkpoint lays them over the servers' tables).

Everything else (model, gradients, optimizers, synchronisation, metrics) is the loop's, so a
difference between systems is the policy's alone. Over torch.distributed every trainer
sends the servers the same sequence of requests, empty ones included (`transport.lockstep`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from concurrent.futures import Future

import numpy as np
import torch

from bagpipe_cli.engine.cache import RowCache
from bagpipe_cli.engine.optim import RowOptimizer
from bagpipe_cli.engine.oracle import NO_SYNC, SYNC_LATER, SYNC_NOW, IterPlan, RoundPlan
from bagpipe_cli.engine.records import Step
from bagpipe_cli.engine.shards import Shard, scatter_to_shards, shard_tables
from bagpipe_cli.engine.trainer_set import TrainerSet
from bagpipe_cli.engine.transport import RowsFuture, Transport

Rows = tuple[np.ndarray, np.ndarray]  # (keys, cache slots)


class EmbeddingSystem(ABC):
    """The interface every system implements (see the module docstring)."""

    replicated = True

    def __init__(self, transport: Transport, trainers: TrainerSet, device: str | torch.device = "cpu"):
        self.transport = transport
        self.trainers = trainers
        self.device = torch.device(device)
        self._pending: list[Future] = []  # write-backs and pushes not known to have landed
        self.pre_evicted = 0  # rows written back at the current round's start
        self.written_back_at_end = 0  # rows still resident when training ended

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        """Prepare a round; returns seconds spent waiting for rows."""
        return 0.0

    def view(self, plan: IterPlan) -> tuple[np.ndarray, np.ndarray]:
        """(keys, index): the rows gradients are taken over, and each of this set's accesses'
        position in them. Replicated systems: U_b."""
        return plan.uniq, plan.inverse[self.trainers.accesses(plan)]

    @abstractmethod
    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        """The values [accesses, dim] this set's accesses read (`index`: positions in `keys`)."""

    def classes(self, plan: IterPlan) -> np.ndarray | None:
        """Per row of U_b: SYNC_NOW / SYNC_LATER / NO_SYNC (LRPP), or None: all SYNC_NOW."""
        return None

    def update_rows(self, plan: IterPlan, idx: np.ndarray | None, grad: torch.Tensor,
                    opt: RowOptimizer) -> None:
        """Apply the row optimizer to the rows at positions `idx` of U_b (None: every row, in
        order); `grad` holds their summed gradients, in `idx` order."""
        raise NotImplementedError(f"{type(self).__name__} does not update rows here")

    def evict(self, plan: IterPlan, classes: np.ndarray | None) -> tuple[int, Rows]:
        """Write back this set's share of the rows evicted after `plan.b` whose update is
        applied; returns (rows written back, the sync_later ones to write back once settled)."""
        return 0, (np.empty(0, np.int64), np.empty(0, np.int32))

    def push(self, step: Step, keys: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        """Send the summed gradients of `keys` to the servers, which apply `opt`."""
        raise NotImplementedError(f"{type(self).__name__} does not push gradients")

    def write_back_slots(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Send the rows at cache `slots` (holding `keys`) back to their servers."""
        raise NotImplementedError(f"{type(self).__name__} has no cache slots")

    def _send(self, futures: list[Future]) -> None:
        self._pending.extend(futures)
        if len(self._pending) > 64:  # completed ones need not be kept
            self._pending = [f for f in self._pending if not f.done()]

    def _write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> None:
        # Sent even when empty: the torch transport keeps every trainer's requests in
        # lockstep (the in-process one sends nothing for no rows).
        self._send(self.transport.write_back(keys, rows, state))

    def flush(self) -> None:
        """Wait until every write-back and push has landed on the servers."""
        for f in self._pending:
            f.result()
        self._pending = []

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        """(keys, rows, state) held on the trainer with a newer value than the servers'."""
        return np.empty(0, np.int64), torch.empty(0, 0), torch.empty(0, 0)


class CacheSystem(EmbeddingSystem):
    """A trainer cache run by a plan: bagpipe (oracle, prefetched a round ahead, LRPP) or the
    lru/lfu/fae baselines (policy planner, fetched on miss when the iteration starts).

    At the start of round r: write back the round's victims (lru/lfu), get round r's rows
    (prefetched during round r-1, or fetched now), insert them at the plan's slots, and, with
    prefetch, start fetching round r+1 (the transport does the transfer while the model
    computes). Rows are read and updated by slot; evicted rows are written back
    asynchronously. A set of some trainers fetches every row of a round except the other
    trainers' private rows (`RoundPlan.fetch_owner`) and writes back its share of victims.
    """

    def __init__(self, transport: Transport, trainers: TrainerSet, cache: RowCache,
                 prefetch_ahead: bool, lrpp: bool, device: str | torch.device = "cpu"):
        super().__init__(transport, trainers, device)
        self.cache = cache
        self.prefetch_ahead = prefetch_ahead
        self.lrpp = lrpp
        self._inflight: dict[int, RowsFuture] = {}
        self._read: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (b, U_b's rows, state)
        # The key held in each slot (-1: free), for checkpoints: set on insert, cleared on eviction.
        self.slot_key = np.full(cache.capacity, -1, dtype=np.int64)

    def _fetch_of(self, rp: RoundPlan) -> Rows:
        if self.trainers.all:
            return rp.fetch_keys, rp.fetch_slots
        return rp.fetch_for(self.trainers.first, self.trainers.count)

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        t0 = time.perf_counter()
        self.pre_evicted = 0
        if len(rp.pre_evict_keys):
            mine = self.trainers.shares(rp.pre_evict_keys)
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

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        p = step.plan
        step.rows_fetched = p.fetched if self.trainers.all else p.fetched_by(self.trainers.first,
                                                                              self.trainers.count)
        step.cache_hits = len(p.uniq) - p.fetched
        rows, state = self.cache.read(p.slots)
        self._read = (p.b, rows, state)  # nothing writes these slots before b's update
        return rows.index_select(0, index)

    def classes(self, plan: IterPlan) -> np.ndarray | None:
        return plan.row_class if self.lrpp else None

    def update_rows(self, plan: IterPlan, idx: np.ndarray | None, grad: torch.Tensor,
                    opt: RowOptimizer) -> None:
        if idx is None and self._read is not None and self._read[0] == plan.b:
            slots, rows, state = plan.slots, self._read[1], self._read[2]
        else:
            slots = plan.slots if idx is None else plan.slots[idx]
            rows, state = self.cache.read(slots)
        self._read = None
        self.cache.write(slots, *opt.step(rows, state, grad))

    def evict(self, plan: IterPlan, classes: np.ndarray | None) -> tuple[int, Rows]:
        """no_sync rows are written back by their user, the others by trainer `key % N`: now
        if their update is applied, once it is settled for sync_later rows."""
        ek, es = plan.evict_keys, plan.evict_slots
        share = self.trainers.shares(ek)
        if classes is None:  # every row of U_b was synchronised on the critical path
            now, later = share, np.zeros(len(ek), dtype=bool)
        else:
            pos = np.searchsorted(plan.uniq, ek)
            c = classes[pos]
            now = ((c == NO_SYNC) & self.trainers.owns(plan.owner[pos])) | ((c == SYNC_NOW) & share)
            later = (c == SYNC_LATER) & share
        self.write_back_slots(ek[now], es[now])  # sent even when empty (lockstep)
        self.forget(es)  # evicted from the logical cache on every trainer
        return int(now.sum() + later.sum()), (ek[later], es[later])

    def write_back_slots(self, keys: np.ndarray, slots: np.ndarray) -> None:
        rows, state = self.cache.read(slots)
        self._write_back(keys, rows.cpu(), state.cpu())

    def forget(self, slots: np.ndarray) -> None:
        """Slots whose rows were evicted (their write-back is queued or done)."""
        self.slot_key[slots] = -1

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        slots = np.flatnonzero(self.slot_key >= 0)
        rows, state = self.cache.read(slots)
        return self.slot_key[slots], rows.cpu(), state.cpu()


TABLE_CHUNK = 1 << 20  # rows per request when a whole table crosses to or from a trainer


class LocalSystem(EmbeddingSystem):
    """Every table resident on the trainer: the upper bound, no remote traffic.

    The tables are copied from the servers before training (not timed) and written back
    after it, so evaluation and saved models see the final values. In-process they are
    the server objects' (`servers`: one shard is trained in place, several are copied); a
    trainer rank of a torch.distributed run
    fetches them whole, and trainer 0 writes them back at the end.
    """

    def __init__(self, transport: Transport, trainers: TrainerSet, total_rows: int,
                 servers: list[Shard] | None = None, device: str | torch.device = "cpu"):
        super().__init__(transport, trainers, device)
        self.servers = servers
        self._read: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (b, U_b's index, rows)
        if servers is not None:  # one shard: train it in place
            weight, state = shard_tables(servers)
        else:  # in pieces, so that no side holds a second copy of the tables
            for lo in range(0, total_rows, TABLE_CHUNK):
                hi = min(lo + TABLE_CHUNK, total_rows)
                w, st = transport.fetch(np.arange(lo, hi)).result()
                if lo == 0:
                    weight, state = torch.empty(total_rows, w.shape[1]), torch.empty(total_rows, st.shape[1])
                weight[lo:hi], state[lo:hi] = w, st
        self.weight, self.state = weight.to(self.device), state.to(self.device)

    def _idx(self, keys: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(keys).to(self.device)

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        step.cache_hits = len(keys)
        t = self._idx(keys)
        rows = self.weight.index_select(0, t)
        self._read = (step.plan.b, t, rows)  # nothing writes these rows before b's update
        return rows.index_select(0, index)

    def update_rows(self, plan: IterPlan, idx: np.ndarray | None, grad: torch.Tensor,
                    opt: RowOptimizer) -> None:
        if idx is None and self._read is not None and self._read[0] == plan.b:
            _, t, rows = self._read
        else:
            t = self._idx(plan.uniq if idx is None else plan.uniq[idx])
            rows = self.weight.index_select(0, t)
        self._read = None
        rows, state = opt.step(rows, self.state.index_select(0, t), grad)
        self.weight.index_copy_(0, t, rows)
        if self.state.shape[1]:
            self.state.index_copy_(0, t, state)

    def flush(self) -> None:
        if self.servers is not None:
            scatter_to_shards(self.servers, self.weight, self.state)
            return
        # Every trainer holds the same tables: trainer 0 sends them, the others as many
        # empty write-backs (lockstep), in pieces of TABLE_CHUNK rows, one piece in flight
        # (the transport copies each piece per server), and then lets its copy go.
        total = self.weight.shape[0]
        for lo in range(0, total, TABLE_CHUNK):
            hi = min(lo + TABLE_CHUNK, total) if self.trainers.first == 0 else lo
            self._write_back(np.arange(lo, hi), self.weight[lo:hi].cpu(), self.state[lo:hi].cpu())
            self.transport.drain()
        super().flush()
        self.weight, self.state = self.weight.new_empty(0, self.weight.shape[1]), self.state.new_empty(0, self.state.shape[1])

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        return np.arange(self.weight.shape[0]), self.weight.cpu().clone(), self.state.cpu().clone()


class _PushingSystem(EmbeddingSystem):
    """A parameter-server system: the process fetches its own samples' rows and pushes
    their summed gradients; the servers sum every trainer's in trainer order and apply the
    row optimizer. The push of iteration b is queued on each server before the fetch of
    b+1, so the next fetch always sees it (servers serve requests in order)."""

    replicated = False

    def view(self, plan: IterPlan) -> tuple[np.ndarray, np.ndarray]:
        if self.trainers.all:
            return plan.uniq, plan.inverse
        keys, index = np.unique(plan.uniq[plan.inverse[self.trainers.accesses(plan)]],
                                return_inverse=True)
        return keys, index.reshape(-1)

    def push(self, step: Step, keys: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        self._send(self.transport.push_gradients(keys, grad.cpu(), opt))
        step.rows_written_back = len(keys)


class SyncSystem(_PushingSystem):
    """No cache: fetch this process's rows of U_b every iteration, push their gradients."""

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        rows, _ = self.transport.fetch(keys).result()
        step.times["prefetch_wait"] += time.perf_counter() - t0
        step.rows_fetched = len(keys)
        return rows.to(self.device).index_select(0, index)


class HetSystem(_PushingSystem):
    """HET-style bounded staleness: each trainer caches the rows it fetched, and reads its
    copy while it is at most `staleness` versions behind the servers' (HET's clock bound);
    otherwise it fetches the row again. Gradients are pushed to the servers (one version
    per update). With staleness 0 every read sees the latest version, so it equals `sync`;
    with s > 0 it fetches less and trains on stale rows. A trainer's cache keeps every row
    it fetched (no capacity limit). Every trainer knows U_b of every iteration, so each
    process counts the servers' versions itself.
    """

    def __init__(self, transport: Transport, trainers: TrainerSet, total_rows: int, staleness: int,
                 dim: int, device: str | torch.device = "cpu"):
        super().__init__(transport, trainers, device)
        self.s = staleness
        m = trainers.count
        self.version = np.zeros(total_rows, dtype=np.int64)  # servers' version of every row
        self.slot_of = np.full((m, total_rows), -1, dtype=np.int32)
        self.cached_version = [np.zeros(0, np.int64) for _ in range(m)]
        self.store = [torch.empty(0, dim) for _ in range(m)]
        self._count = [0] * m  # rows each trainer has cached

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

    def _refresh(self, c: int, keys: np.ndarray) -> tuple[int, int, float]:
        """Fetch trainer c's rows that are missing or too stale; (fetched, stale reads, wait)."""
        slots = self.slot_of[c, keys]
        have = slots >= 0
        lag = np.zeros(len(keys), np.int64)
        lag[have] = self.version[keys[have]] - self.cached_version[c][slots[have]]
        need = ~have | (lag > self.s)
        stale = int(((lag > 0) & ~need).sum())
        if not (need.any() or self.transport.lockstep):
            return 0, stale, 0.0
        nk, new_keys = keys[need], keys[~have]
        used = self._count[c]
        self._ensure(c, used + len(new_keys))
        self.slot_of[c, new_keys] = np.arange(used, used + len(new_keys))
        self._count[c] = used + len(new_keys)
        t0 = time.perf_counter()
        rows, _ = self.transport.fetch(nk).result()
        waited = time.perf_counter() - t0
        s_idx = self.slot_of[c, nk]
        self.store[c][torch.from_numpy(s_idx)] = rows
        self.cached_version[c][s_idx] = self.version[nk]
        return len(nk), stale, waited

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        p = step.plan
        per = len(p.inverse) // self.trainers.total  # accesses of one trainer
        out = torch.empty(self.trainers.count * per, self.store[0].shape[1])
        fetched = stale = 0
        for c, i in enumerate(self.trainers.indices()):
            used = p.uniq[p.inverse[i * per:(i + 1) * per]]
            n, s, waited = self._refresh(c, np.unique(used))
            fetched, stale = fetched + n, stale + s
            step.times["prefetch_wait"] += waited
            out[c * per:(c + 1) * per] = self.store[c][torch.from_numpy(self.slot_of[c, used])]
        step.rows_fetched = fetched
        step.cache_hits = len(p.uniq) - fetched if self.trainers.total == 1 else 0
        step.stale_reads = stale
        return out.to(self.device)

    def push(self, step: Step, keys: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        super().push(step, keys, grad, opt)
        # The servers apply iteration b's gradients: every row of U_b is one version newer.
        self.version[step.plan.uniq] += 1

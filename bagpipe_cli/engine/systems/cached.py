"""A trainer cache run by a plan: Bagpipe's (prefetched a round ahead, LRPP) and the
fixed-capacity baselines' (fetched on miss)."""

from __future__ import annotations

import time

import numpy as np
import torch

from bagpipe_cli.engine.comm.transport import RowsFuture, Transport
from bagpipe_cli.engine.planning.plans import NO_SYNC, SYNC_LATER, SYNC_NOW, IterPlan, RoundPlan
from bagpipe_cli.engine.records.metrics import Step
from bagpipe_cli.engine.records.trace import READ_FLOW
from bagpipe_cli.engine.systems.base import EmbeddingSystem, Rows, SystemParts
from bagpipe_cli.engine.trainer.cache import RowCache
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet


class CacheSystem(EmbeddingSystem):
    """A trainer cache run by a plan: the oracle's (prefetched a round ahead, with LRPP for
    bagpipe) or a fixed-capacity policy's (its planner's, fetched on miss when the iteration
    starts): every registry entry whose `build_system` is `CacheSystem.build`.

    At the start of round r: grow the cache if the plan's capacity grew (a growing oracle's),
    write back the round's victims (an evicting policy's), get round r's rows
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
        # The sync_later rows `evict` deferred, by id: (their keys, each trainer's share).
        self._later: dict[int, tuple[np.ndarray, list[np.ndarray] | None]] = {}

    @classmethod
    def build(cls, p: SystemParts, prefetch_ahead: bool, lrpp: bool) -> CacheSystem:
        cache = RowCache(p.slots, p.setup.row_dim, p.setup.rowopt.state_dim, p.device)
        return cls(p.transport, p.trainers, cache, prefetch_ahead, lrpp, p.device)

    def _fetch_of(self, rp: RoundPlan) -> Rows:
        if self.trainers.all:
            return rp.fetch_keys, rp.fetch_slots
        return rp.fetch_for(self.trainers.first, self.trainers.count)

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        t0 = time.perf_counter()
        self.make_room(rp)
        fut = self._inflight.pop(rp.r, None)
        if len(rp.fetch_keys):
            self.insert(rp, fut or self.transport.fetch(self._fetch_of(rp)[0], self._asked(rp)))
        waited = time.perf_counter() - t0
        # Every write-back of earlier iterations is already queued, so the servers serve this
        # fetch after them (see the oracle on why that is early enough).
        if self.prefetch_ahead and next_rp is not None and len(next_rp.fetch_keys):
            keys = self._fetch_of(next_rp)[0]
            with self.tracer.span("prefetch issued", "request", rows=len(keys), target=next_rp.r):
                self._inflight[next_rp.r] = self.transport.fetch(keys, self._asked(next_rp))
                self._trace_reads(next_rp)
        return waited

    def _split(self) -> bool:
        """Whether this process stands for several trainers of a partitioned cache (bagpipe
        in-process, N > 1): it then counts, and its transport charges, what each trainer's
        rank would fetch and write back (`partitioned.PartitionedCache`)."""
        return self.lrpp and self.trainers.all and self.trainers.count > 1

    def _asked(self, rp: RoundPlan) -> list[np.ndarray] | None:
        """Round `rp`'s fetch as each trainer's rank asks for it: the rows fetched for an
        iteration it reads them at (None: this process's one request)."""
        if not self._split() or not rp.iters or rp.iters[0].part is None:
            return None
        return [np.concatenate([p.uniq[m[p.part.src[m] < 0]] for p in rp.iters
                                for m in [p.part.rows_of(i)]]) for i in self.trainers.indices()]

    def _by_home(self, plan: IterPlan, keys: np.ndarray) -> list[np.ndarray] | None:
        """Evicted `keys` of `plan` by the trainer that writes each back (its home), as the
        trainers' ranks send them (None: this process's one request)."""
        if not self._split() or plan.part is None:
            return None
        home = plan.part.home[np.searchsorted(plan.uniq, keys)]
        return [keys[home == i] for i in self.trainers.indices()]

    def make_room(self, rp: RoundPlan) -> None:
        """A round's start before its rows arrive: grow the cache if the plan's capacity grew
        (a growing oracle's), put a resumed cache's rows back (waited for: the round's plan
        counts on them) and write back the round's victims (lru/lfu)."""
        self.pre_evicted = self.warmed = 0
        if rp.capacity is not None and rp.capacity > self.cache.capacity:
            self._grow(rp.capacity)
        if rp.warm is not None:
            keys, slots = rp.warm
            with self.tracer.span("warm cache", "request", rows=len(keys)):
                self._put(keys, slots, self.transport.fetch(keys))
            self.warmed = len(keys)
        if len(rp.pre_evict_keys):
            mine = self.trainers.shares(rp.pre_evict_keys)
            with self.tracer.span("evict", "evict", rows=int(mine.sum())):
                self.write_back_slots(rp.pre_evict_keys[mine], rp.pre_evict_slots[mine])
            self.forget(rp.pre_evict_slots)
            self.pre_evicted = int(mine.sum())
        if not rp.iters:  # the planner's final round: everything resident goes back
            self.written_back_at_end += self.pre_evicted

    def insert(self, rp: RoundPlan, fetched: RowsFuture) -> None:
        """Wait for round `rp`'s rows (`fetched`) and put them in their slots."""
        self._put(*self._fetch_of(rp), fetched)

    def _put(self, keys: np.ndarray, slots: np.ndarray, fetched: RowsFuture) -> None:
        rows, state = fetched.result()  # landed
        with self.tracer.span("insert rows", "insert", rows=len(keys)):
            self.cache.insert(slots, rows, state)
        self.slot_key[slots] = keys

    def _grow(self, capacity: int) -> None:
        with self.tracer.span("grow cache", "insert", rows=capacity):
            self.cache.grow(capacity)
            key = np.full(capacity, -1, dtype=np.int64)
            key[:len(self.slot_key)] = self.slot_key
            self.slot_key = key

    def _trace_reads(self, rp: RoundPlan) -> None:
        """Arrows from round `rp`'s prefetch to each of its iterations that reads rows of it."""
        if not self.tracer.enabled:
            return
        i, n = self.trainers.first, self.trainers.count
        for it in rp.iters:
            if it.fetched_by(i, n):
                self.tracer.flow_out(READ_FLOW, i, it.b)

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        p = step.plan
        step.rows_fetched = p.fetched if self.trainers.all else p.fetched_by(self.trainers.first,
                                                                              self.trainers.count)
        step.cache_hits = len(p.uniq) - p.fetched
        coll = self.collective
        if p.part is not None and coll is not None and coll.size > 1:
            # In-process, the partitioned cache's deliveries (engine/planning/partition.py),
            # emulated; its fetches counted as the trainers' ranks make them (a row each of
            # its readers fetches counts once for each).
            f = p.part.moves(p.row_class, coll.size)
            step.rows_fetched = int(f.fetched.sum()) if self._split() else step.rows_fetched
            coll.move_rows(f.delivered_sent, f.delivered_received,
                           4 * (self.cache.weight.shape[1] + self.cache.state.shape[1]))
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
        self.write_back_slots(ek[now], es[now], self._by_home(plan, ek[now]))  # sent even when empty
        self.forget(es)  # evicted from the logical cache on every trainer
        deferred = ek[later]
        if classes is not None and plan.sync_later:  # written back once settled (the loop)
            self._later[id(deferred)] = (deferred, self._by_home(plan, deferred))
        return int(now.sum() + later.sum()), (deferred, es[later])

    def write_back_slots(self, keys: np.ndarray, slots: np.ndarray,
                         asked: list[np.ndarray] | None = None) -> None:
        """`asked`: each trainer's share (`_by_home`); the sync_later rows `evict` deferred
        carry theirs."""
        held = self._later.pop(id(keys), None)
        if asked is None and held is not None and held[0] is keys:
            asked = held[1]
        rows, state = self.cache.read(slots)
        self._write_back(keys, rows.cpu(), state.cpu(), asked)

    def forget(self, slots: np.ndarray) -> None:
        """Slots whose rows were evicted (their write-back is queued or done)."""
        self.slot_key[slots] = -1

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        slots = np.flatnonzero(self.slot_key >= 0)
        rows, state = self.cache.read(slots)
        return self.slot_key[slots], rows.cpu(), state.cpu()

"""Bagpipe's cache on a trainer rank, physically partitioned (LRPP: engine/planning/partition.py).

A trainer holds the rows its own samples read and the rows it is home of, in slots of its
own (`LocalSlots`): a round's rows fetched for its iterations (prefetched a round ahead,
as the replicated cache's are), the rows delivered to it for an iteration (freed after it),
and the rows whose home it is (kept until their next use, or written back when evicted).
Per iteration it receives its rows from their homes before it reads them (`deliver`), and
after the backward sends its partial gradients to their homes and sums, in trainer order,
those of the rows it is home of (`reduce`); `sync_now` rows on the critical path,
`sync_later` ones in the background. The values are those of the replicated cache: the
same rows are summed in the same order and take the same optimizer steps.

In-process every trainer is in one process and the replicated `CacheSystem` holds the one
logical cache (`bagpipe_system`): the values are the same.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from bagpipe_cli.engine.comm.transport import RowsFuture, Transport
from bagpipe_cli.engine.planning.plans import NO_SYNC, SYNC_LATER, SYNC_NOW, IterPlan, RoundPlan
from bagpipe_cli.engine.records.metrics import Step
from bagpipe_cli.engine.systems.base import EmbeddingSystem, Rows, SystemParts
from bagpipe_cli.engine.systems.cached import CacheSystem
from bagpipe_cli.engine.trainer.cache import RowCache
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet

_FIRST_SLOTS = 1024


def bagpipe_system(p: SystemParts) -> EmbeddingSystem:
    """Bagpipe's system for one process: the partitioned cache on a trainer rank of several,
    the replicated one (the logical cache) where one process runs every trainer."""
    if p.trainers.all:
        return CacheSystem.build(p, prefetch_ahead=True, lrpp=True)
    return PartitionedCache(p.transport, p.trainers, p.setup.row_dim, p.setup.rowopt.state_dim,
                            p.device)


class LocalSlots:
    """A trainer's own slots: the keys it holds, sorted, with their slots (a table of the
    whole key space would cost every trainer 4 bytes a row of the model), a stack of free
    slots, and the cache's storage, which grows by an eighth at least when it is full."""

    def __init__(self, dim: int, state_dim: int, device: torch.device):
        self.cache = RowCache(_FIRST_SLOTS, dim, state_dim, device)
        self.keys = np.empty(0, np.int64)
        self.slot = np.empty(0, np.int32)  # of each of `keys`
        self.free = np.arange(_FIRST_SLOTS - 1, -1, -1, dtype=np.int32)  # a stack: top last
        self.peak = 0

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """The slots of `keys`, every one held."""
        return self.slot[np.searchsorted(self.keys, keys)]

    def put(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> None:
        """Hold `keys` (none held yet) with these values."""
        n = len(keys)
        if n > len(self.free):
            cap = self.cache.capacity
            new = cap + max(n - len(self.free), cap // 8)
            self.cache.grow(new)
            self.free = np.concatenate([np.arange(new - 1, cap - 1, -1, dtype=np.int32), self.free])
        slots = self.free[len(self.free) - n:][::-1].copy()
        self.free = self.free[:len(self.free) - n]
        self.cache.insert(slots, rows, state)
        keys = np.concatenate([self.keys, keys])
        order = np.argsort(keys, kind="stable")
        self.keys, self.slot = keys[order], np.concatenate([self.slot, slots])[order]
        self.peak = max(self.peak, len(self.keys))

    def drop(self, keys: np.ndarray) -> None:
        """Stop holding `keys` (held ones)."""
        if not len(keys):
            return
        pos = np.searchsorted(self.keys, keys)
        self.free = np.concatenate([self.free, self.slot[pos]])
        keep = np.ones(len(self.keys), dtype=bool)
        keep[pos] = False
        self.keys, self.slot = self.keys[keep], self.slot[keep]


class _Later:
    """A background exchange of sync_later partials: `result()` is the sums of the rows
    this trainer is home of, in trainer order."""

    def __init__(self, sum_of, fut):
        self.sum_of, self.fut = sum_of, fut

    def result(self) -> torch.Tensor:
        return self.sum_of(self.fut.result())


class PartitionedCache(EmbeddingSystem):
    """Trainer `i`'s piece of Bagpipe's cache (see the module docstring)."""

    partitioned = True

    def __init__(self, transport: Transport, trainers: TrainerSet, dim: int, state_dim: int,
                 device: torch.device):
        super().__init__(transport, trainers, device)
        self.i = trainers.first
        self.local = LocalSlots(dim, state_dim, self.device)
        self._inflight: dict[int, RowsFuture] = {}
        self._delivered = -1  # the last iteration whose rows were delivered
        self.rows_moved = {"delivered": 0, "partials": 0}

    # ------------------------------------------------------------------ rounds: the servers

    def _fetch_of(self, rp: RoundPlan) -> np.ndarray:
        """Keys of the rows fetched for the round's iterations that this trainer reads."""
        out = [p.uniq[m[p.part.src[m] < 0]] for p in rp.iters for m in [self._mine(p)]]
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        t0 = time.perf_counter()
        # Every trainer asks the servers alike (lockstep), with rows or without.
        fut = self._inflight.pop(rp.r, None)
        if rp.fetch_count:
            keys = self._fetch_of(rp)
            rows, state = (fut or self.transport.fetch(keys)).result()
            with self.tracer.span("insert rows", "insert", rows=len(keys)):
                self.local.put(keys, rows, state)
        waited = time.perf_counter() - t0
        if next_rp is not None and next_rp.fetch_count:
            keys = self._fetch_of(next_rp)
            with self.tracer.span("prefetch issued", "request", rows=len(keys), target=next_rp.r):
                self._inflight[next_rp.r] = self.transport.fetch(keys)
        return waited

    # ------------------------------------------------------------------ an iteration

    def _mine(self, p: IterPlan) -> np.ndarray:
        """Positions in U_b of the rows this trainer reads at b."""
        mine = getattr(p, "_mine", None)
        if mine is None:
            mine = p.part.rows_of(self.i)
            p._mine = mine  # type: ignore[attr-defined]
        return mine

    def _at(self, p: IterPlan) -> np.ndarray:
        """By position in U_b: the row's position among this trainer's rows (`_mine`)."""
        at = getattr(p, "_at", None)
        if at is None:
            mine = self._mine(p)
            at = np.full(len(p.uniq), -1, dtype=np.int32)
            at[mine] = np.arange(len(mine), dtype=np.int32)
            p._at = at  # type: ignore[attr-defined]
        return at

    def view(self, plan: IterPlan) -> tuple[np.ndarray, np.ndarray]:
        return plan.uniq[self._mine(plan)], self._at(plan)[self.trainers.inverse(plan)]

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        p = step.plan
        if self._delivered != p.b:
            self._deliver(p)
            self._delivered = p.b
        mine = self._mine(p)
        step.rows_fetched = int((p.part.src[mine] < 0).sum())
        step.cache_hits = p.unique_rows - p.fetched  # of U_b, as the logical cache's (in-process)
        # The slots of b's rows (`keys`: by `_mine`) stay theirs while they are held, which
        # is until after their updates (sync_later ones: their home keeps them).
        p._slots = self.local.slots(keys)  # type: ignore[attr-defined]
        rows, _ = self.local.cache.read(p._slots)
        return rows.index_select(0, index)

    def _deliver(self, p: IterPlan) -> None:
        """Each row this trainer reads at b from its home (see engine/planning/partition.py)."""
        part, n, i = p.part, self.collective.size, self.i
        mine = self._mine(p)
        src = part.src[mine].astype(np.int64)
        take = mine[(src >= 0) & (src != i)]
        take = take[np.argsort(part.src[take], kind="stable")]
        counts = np.bincount(part.src[take].astype(np.int64), minlength=n)
        homed = np.flatnonzero(part.src == i)  # rows whose home this trainer is before b
        row = part.pair_row
        out_pairs = np.flatnonzero((part.src[row] == i) & (part.writers != i))
        out_pairs = out_pairs[np.argsort(part.writers[out_pairs], kind="stable")]
        to = np.bincount(part.writers[out_pairs].astype(np.int64), minlength=n)
        rows, state = self.local.cache.read(self.local.slots(p.uniq[row[out_pairs]]))
        values = torch.cat([rows, state], dim=1).cpu()
        got = self.collective.exchange(list(values.split(to.tolist())), counts.tolist())
        got = torch.cat(got)
        dim = rows.shape[1]
        # The rows it was home of and no longer reads go (their home is now a writer of b).
        self.local.drop(p.uniq[np.setdiff1d(homed, mine, assume_unique=True)])
        self.local.put(p.uniq[take], got[:, :dim], got[:, dim:])
        self.rows_moved["delivered"] += len(take)

    def classes(self, plan: IterPlan) -> np.ndarray | None:
        return plan.row_class

    def reduce(self, plan: IterPlan, grad: torch.Tensor, classes: np.ndarray, loss: torch.Tensor
               ) -> tuple[np.ndarray, torch.Tensor, np.ndarray, _Later | None, list[float]]:
        """Partial gradients (`grad`: by this trainer's rows, `view`) to their homes; returns
        (positions in U_b of the rows to update now, their sums; positions of the
        sync_later ones, a Future of their sums; every trainer's loss, in trainer order).
        The losses travel with the sync_now partials: a row to each other trainer."""
        mine = self._mine(plan)
        c = classes[mine]
        own = mine[c == NO_SYNC]  # its one writer is its home: nothing to send
        own_grad = grad[self._idx(np.flatnonzero(c == NO_SYNC))]
        carried = grad.new_zeros(1, grad.shape[1])
        carried[0, 0] = loss
        now_idx, (now_sum, losses) = self._sum(plan, grad, classes, SYNC_NOW, later=False,
                                               carried=carried)
        later_idx, later = np.empty(0, np.int64), None
        if plan.sync_later:  # (every trainer knows whether any row is)
            later_idx, later = self._sum(plan, grad, classes, SYNC_LATER, later=True)
        idx = np.concatenate([now_idx, own])
        return idx, torch.cat([now_sum, own_grad]), later_idx, later, losses

    def _sum(self, plan: IterPlan, grad: torch.Tensor, classes: np.ndarray, cls: int, later: bool,
             carried: torch.Tensor | None = None):
        """The rows of class `cls`: this trainer's partials go to their homes, the other
        writers' come to it for the rows it is home of; (positions of those rows, their sums
        in trainer order, or with `later` a Future of them). `carried`: a row more to every
        other trainer, after the partials; the sums come with every trainer's carried row's
        first value, in trainer order (its own included)."""
        n, i, part, mine = self.collective.size, self.i, plan.part, self._mine(plan)
        row, w = part.pair_row, part.writers
        send = np.flatnonzero((classes[mine] == cls) & (part.home[mine] != i))  # of my rows
        send = send[np.argsort(part.home[mine[send]], kind="stable")]
        to = np.bincount(part.home[mine[send]].astype(np.int64), minlength=n)
        pairs = np.flatnonzero((part.home[row] == i) & (classes[row] == cls))  # what I sum
        wp, rp = w[pairs], row[pairs]  # rp: sorted, each row's pairs in trainer order
        come = np.flatnonzero(wp != i)  # by position among `pairs`
        come = come[np.argsort(wp[come], kind="stable")]
        counts = np.bincount(wp[come].astype(np.int64), minlength=n)
        parts = list(grad[self._idx(send)].cpu().split(to.tolist()))
        if carried is not None:
            row1 = carried.cpu()
            parts = [p if j == i else torch.cat([p, row1]) for j, p in enumerate(parts)]
            counts = counts + (np.arange(n) != i)
        first = np.ones(len(rp), dtype=bool)
        first[1:] = rp[1:] != rp[:-1]
        idx = rp[first]  # the rows this trainer sums, by position in U_b
        seg = np.cumsum(first) - 1  # each pair's row among them
        own_pair = np.flatnonzero(wp == i)
        own_at = self._at(plan)[rp[own_pair]]
        self.rows_moved["partials"] += len(send)

        def sum_of(got: list[torch.Tensor]):
            if carried is not None:  # each other trainer's last row
                firsts = [float(carried[0, 0]) if j == i else float(g[-1, 0]) for j, g in enumerate(got)]
                got = [g if j == i else g[:-1] for j, g in enumerate(got)]
            vals = grad.new_empty(len(pairs), grad.shape[1])
            vals[self._idx(come)] = torch.cat(got).to(grad.device)
            vals[self._idx(own_pair)] = grad[self._idx(own_at)]
            sums = _in_trainer_order(vals, seg, len(idx), self._idx)
            return sums if carried is None else (sums, firsts)

        if later:
            return idx, _Later(sum_of, self.collective.exchange(parts, counts.tolist(), later=True))
        return idx, sum_of(self.collective.exchange(parts, counts.tolist()))

    def _idx(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(a, dtype=np.int64)).to(self.device)

    def update_rows(self, plan: IterPlan, idx: np.ndarray | None, grad: torch.Tensor,
                    opt: RowOptimizer) -> None:
        slots = plan._slots[self._at(plan)[idx]]  # type: ignore[attr-defined]
        rows, state = self.local.cache.read(slots)
        self.local.cache.write(slots, *opt.step(rows, state, grad))

    def evict(self, plan: IterPlan, classes: np.ndarray | None) -> tuple[int, Rows]:
        """The home writes back its evicted rows (sync_later ones once settled); the rows
        this trainer read at b and is not home of go."""
        part, mine = plan.part, self._mine(plan)
        self.local.drop(plan.uniq[mine[part.home[mine] != self.i]])
        ek = plan.evict_keys
        pos = np.searchsorted(plan.uniq, ek)
        homed = part.home[pos] == self.i
        now = homed & (classes[pos] == NO_SYNC)
        later = homed & (classes[pos] == SYNC_LATER)
        self.write_back_slots(ek[now], self.local.slots(ek[now]))  # sent even when empty (lockstep)
        return int(now.sum() + later.sum()), (ek[later], self.local.slots(ek[later]))

    def write_back_slots(self, keys: np.ndarray, slots: np.ndarray) -> None:
        rows, state = self.local.cache.read(slots)
        self._write_back(keys, rows.cpu(), state.cpu())
        self.local.drop(keys)

    @property
    def peak_held(self) -> int | None:
        return self.local.peak

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        rows, state = self.local.cache.read(self.local.slot)
        return self.local.keys.copy(), rows.cpu(), state.cpu()


def _in_trainer_order(vals: torch.Tensor, row: np.ndarray, rows: int, idx) -> torch.Tensor:
    """Per row, the sum of its pairs' values (`row`: each pair's row, pairs in row then
    trainer order) as `ordered_sum` adds them: ((v0 + v1) + v2) + ..."""
    out = vals.new_zeros(rows, vals.shape[1])
    if not len(row):
        return out
    first = np.ones(len(row), dtype=bool)
    first[1:] = row[1:] != row[:-1]
    start = np.flatnonzero(first)
    rank = np.arange(len(row)) - np.repeat(start, np.diff(np.append(start, len(row))))
    out[idx(row[first])] = vals[idx(start)]
    for k in range(1, int(rank.max()) + 1):  # the k-th writer of every row that has one
        at = np.flatnonzero(rank == k)
        out[idx(row[at])] += vals[idx(at)]
    return out

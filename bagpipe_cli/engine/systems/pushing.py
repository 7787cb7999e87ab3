"""Parameter-server systems: trainers fetch rows and push their gradients to the servers
(`sync`, and `het`'s bounded-staleness copies)."""

from __future__ import annotations

import time

import numpy as np
import torch

from bagpipe_cli.engine.comm.transport import Transport
from bagpipe_cli.engine.planning.plans import IterPlan
from bagpipe_cli.engine.records.metrics import Step
from bagpipe_cli.engine.systems.base import EmbeddingSystem, SystemParts
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet


class _PushingSystem(EmbeddingSystem):
    """A parameter-server system: the process fetches its own samples' rows and pushes
    their summed gradients; the servers sum every trainer's in trainer order and apply the
    row optimizer. The push of iteration b is queued on each server before the fetch of
    b+1, so the next fetch always sees it (servers serve requests in order)."""

    replicated = False

    def view(self, plan: IterPlan) -> tuple[np.ndarray, np.ndarray]:
        if self.trainers.all or plan.global_rows is not None:  # (the latter: its own rows)
            return plan.uniq, self.trainers.inverse(plan)
        keys, index = np.unique(plan.uniq[self.trainers.inverse(plan)], return_inverse=True)
        return keys, index.reshape(-1)

    def push(self, step: Step, keys: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        asked = self.own_rows(step.plan)
        self._send(self.transport.push_gradients(keys, grad.cpu(), opt, asked))
        step.rows_written_back = len(keys) if asked is None else sum(map(len, asked))

    def own_rows(self, plan: IterPlan) -> list[np.ndarray] | None:
        """Where this process runs several trainers: the rows each trainer's samples read,
        which its rank fetches and pushes (the servers count and charge those requests:
        `Transport`'s `asked`); None: one trainer, whose rows are the process's."""
        if self.trainers.count == 1:
            return None
        own = getattr(plan, "_own_rows", None)
        if own is None:
            own = [np.unique(plan.uniq[plan.accesses_of(i, 1, self.trainers.total)])
                   for i in self.trainers.indices()]
            plan._own_rows = own  # type: ignore[attr-defined]
        return own


class SyncSystem(_PushingSystem):
    """No cache: fetch this process's rows of U_b every iteration, push their gradients."""

    @classmethod
    def build(cls, p: SystemParts) -> SyncSystem:
        return cls(p.transport, p.trainers, p.device)

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        asked = self.own_rows(step.plan)  # each trainer's rank fetches its own rows
        rows, _ = self.transport.fetch(keys, asked).result()
        step.times["prefetch_wait"] += time.perf_counter() - t0
        step.rows_fetched = len(keys) if asked is None else sum(map(len, asked))
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

    @classmethod
    def build(cls, p: SystemParts) -> HetSystem:
        return cls(p.transport, p.trainers, p.setup.total_rows, p.setup.cfg.staleness,
                   p.setup.row_dim, p.device)

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
        per = len(self.trainers.inverse(p)) // self.trainers.count  # accesses of one trainer
        out = torch.empty(self.trainers.count * per, self.store[0].shape[1])
        fetched = stale = 0
        for c, i in enumerate(self.trainers.indices()):
            used = p.uniq[p.accesses_of(i, 1, self.trainers.total)]
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

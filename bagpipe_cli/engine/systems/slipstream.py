"""Slipstream (Maboud et al., 2024): fae's hot set, and samples whose rows have stopped
changing are skipped.

The trainer cache holds fae's hot set (`policy_plan`, by fae's decisions): a hot row, once inserted,
stays in its slot, while the other rows pass through the cache for one iteration. Every K
iterations (--snapshot-every), once the iteration's updates are applied and its passing
rows evicted, the cache holds exactly the hot rows, and a snapshot of them is taken. A hot
row's *drift* is the L2 norm of its change between the last two snapshots (unknown, so
never stale, for a row not in both). For the K iterations that follow, a row is *stale*
when its drift is below the threshold T, and a sample is skipped when at least a share α
(--stale-share) of its rows are stale: with k = ceil(α x tables), when the k-th smallest
drift among its rows is below T.

T is found from the drop target D (--drop-target) at the first iteration after each
snapshot, on that iteration's samples, a fresh sample of the hot rows in use: each trainer
takes the D-quantile of its own samples' k-th smallest drifts, so that a share D of them
would be skipped, and keeps T until the next snapshot. Each trainer decides from its own
samples and the replicated cache, so a trainer rank decides as the in-process runtime does.
A skipped sample has no forward or backward and adds nothing to the gradients; the loss
stays the sum over the global batch's samples divided by its size. A trainer may skip all
of its samples; an iteration in which every trainer did records a loss of NaN (the loop
sums the computed samples' count: `skips_samples`), and its dense optimizer steps on zero
gradients. Once a whole snapshot period trains nothing, the hot rows stop changing,
their drifts become 0 and tie, and the samples that read them stay skipped. With D = 0, T = 0 and
nothing is skipped: the run is fae's, bitwise.

Each iteration's `samples_skipped` and T (`stale_threshold`, trainer 0's) go into its
record; summary.json has the totals and each T with the iteration it was set.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bagpipe_cli.engine.comm.transport import Transport
from bagpipe_cli.engine.records.metrics import Step
from bagpipe_cli.engine.systems.base import Phase, SystemParts
from bagpipe_cli.engine.systems.cached import CacheSystem
from bagpipe_cli.engine.trainer.cache import RowCache
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet


def threshold(kth_drift: np.ndarray, drop: float) -> float:
    """The T that skips a share `drop` of samples whose k-th smallest drift is `kth_drift`
    (skipped: drift < T): the smallest value at or above the share's rank; 0 skips nothing."""
    n = len(kth_drift)
    want = math.ceil(drop * n)
    if want == 0 or n == 0:
        return 0.0
    ordered = np.sort(kth_drift)
    finite = ordered[np.isfinite(ordered)]
    if len(finite) == 0:
        return 0.0  # no sample has enough rows with a known drift
    if want >= n or not np.isfinite(ordered[want]):
        return float(np.nextafter(finite[-1], np.inf))  # every sample with a known drift
    return float(ordered[want]) if ordered[want] > ordered[want - 1] else float(
        np.nextafter(ordered[want - 1], np.inf))


class SlipstreamSystem(CacheSystem):
    """fae's hot set, snapshotted every K iterations; stale samples skipped (see above)."""

    def __init__(self, transport: Transport, trainers: TrainerSet, cache: RowCache,
                 snapshot_every: int, drop_target: float, stale_share: float, tables: int,
                 device: str | torch.device = "cpu"):
        super().__init__(transport, trainers, cache, prefetch_ahead=False, lrpp=False,
                         device=device)
        self.every, self.drop = snapshot_every, drop_target
        self.skips_samples = drop_target > 0
        self.k = max(1, math.ceil(stale_share * tables - 1e-9))  # stale rows that skip a sample
        self._snap: tuple[np.ndarray, torch.Tensor] | None = None  # (slot keys, values)
        self._drift = np.full(cache.capacity, np.inf)  # per slot, since the last two snapshots
        self._thresholds: list[float] | None = None  # per trainer slice, until the next snapshot

    @classmethod
    def build(cls, p: SystemParts) -> SlipstreamSystem:
        cfg = p.setup.cfg
        cache = RowCache(p.slots, p.setup.row_dim, p.setup.rowopt.state_dim, p.device)
        return cls(p.transport, p.trainers, cache, cfg.snapshot_every, cfg.drop_target,
                   cfg.stale_share, p.setup.ds.meta.num_tables, p.device)

    def phases(self, step: Step, index: torch.Tensor, slices: list[slice]) -> list[Phase] | None:
        """Every trainer slice's samples but the stale ones (None: nothing can be stale)."""
        if self.drop == 0 or not np.isfinite(self._drift).any():
            return None
        samples = sum(sl.stop - sl.start for sl in slices)
        drift = self._drift[step.plan.slots[index.cpu().numpy()]].reshape(samples, -1)
        kth = np.partition(drift, self.k - 1, axis=1)[:, self.k - 1] if self.k <= drift.shape[1] \
            else np.full(samples, np.inf)
        if self._thresholds is None:  # the first iteration since the snapshot
            self._thresholds = [threshold(kth[sl], self.drop) for sl in slices]
        if self.trainers.first == 0:
            step.stale_threshold = self._thresholds[0]
        keep = [np.flatnonzero(kth[sl] >= t) + sl.start
                for sl, t in zip(slices, self._thresholds, strict=True)]
        step.samples_skipped = samples - sum(len(x) for x in keep)
        return [Phase(keep)]

    def after_iteration(self, step: Step) -> None:
        """Every K iterations: a snapshot of the hot rows, and their drift since the last."""
        if (step.plan.b + 1) % self.every or self.drop == 0:
            return
        keys = self.slot_key.copy()
        values = self.cache.weight[:len(keys)].clone()
        self._drift = np.full(len(keys), np.inf)
        if self._snap is not None:
            old_keys, old = self._snap
            n = min(len(old_keys), len(keys))
            same = np.flatnonzero((keys[:n] >= 0) & (keys[:n] == old_keys[:n]))
            if len(same):
                idx = torch.from_numpy(same).to(values.device)
                change = (values.index_select(0, idx) - old.index_select(0, idx)).norm(dim=1)
                self._drift[same] = change.cpu().double().numpy()
        self._snap = (keys, values)
        self._thresholds = None

    def _grow(self, capacity: int) -> None:
        super()._grow(capacity)
        self._drift = np.concatenate([self._drift, np.full(capacity - len(self._drift), np.inf)])

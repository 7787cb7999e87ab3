"""Hotline (Adnan et al., ISCA 2024): a hot set on the trainer, and each mini-batch split so
that the samples it can serve compute while the others' rows are gathered.

The trainer cache holds fae's hot set (the hottest rows, sized like fae's: --cache-rows, or
bagpipe's peak by default; `policy_plan` plans it by fae's decisions), so the rows a batch needs beyond
it are known when its round starts. There the fetch of those rows is issued and not waited
for. Each trainer's samples are split into *popular* ones, whose every row is in the hot
set, and the rest: the popular samples run forward and backward while the fetch is in
flight, then the rows land, then the rest run; either part of a trainer's share may be
empty. One optimizer step covers both, so the parameters are sync's up to the order in
which each gradient's terms are summed (the test reports the largest difference).

`popular_samples` and `fetch_overlap` (seconds computed while the rows were in flight) go
into every iteration's record; summary.json has their share and total.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from bagpipe_cli.engine.comm.transport import RowsFuture
from bagpipe_cli.engine.planning.plans import RoundPlan
from bagpipe_cli.engine.records.metrics import Step
from bagpipe_cli.engine.systems.base import Phase, SystemParts
from bagpipe_cli.engine.systems.cached import CacheSystem
from bagpipe_cli.engine.trainer.cache import RowCache


class HotlineSystem(CacheSystem):
    """fae's hot set, with each batch split into popular samples and the rest (see above)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, prefetch_ahead=False, lrpp=False, **kwargs)
        self._fetching: tuple[RoundPlan, RowsFuture, float] | None = None  # (round, rows, issued)

    @classmethod
    def build(cls, p: SystemParts) -> HotlineSystem:
        cache = RowCache(p.slots, p.setup.row_dim, p.setup.rowopt.state_dim, p.device)
        return cls(p.transport, p.trainers, cache, device=p.device)

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        """Make room and issue the round's fetch; nothing waits for it here (a resumed
        cache's rows aside)."""
        t0 = time.perf_counter()
        self.make_room(rp)
        waited = time.perf_counter() - t0
        self._fetching = None
        if len(rp.fetch_keys):
            keys = self._fetch_of(rp)[0]
            with self.tracer.span("fetch issued", "request", rows=len(keys), target=rp.r):
                self._fetching = (rp, self.transport.fetch(keys), time.perf_counter())
        return waited

    def phases(self, step: Step, index: torch.Tensor, slices: list[slice]) -> list[Phase] | None:
        """Popular samples first; the rest once the round's rows have landed."""
        samples = sum(sl.stop - sl.start for sl in slices)
        if self._fetching is None:  # every row of the batch is hot
            step.popular_samples = samples
            return None
        rp = self._fetching[0]
        missing = np.isin(step.plan.uniq, rp.fetch_keys, assume_unique=True)
        waits = missing[index.cpu().numpy()].reshape(samples, -1).any(axis=1)
        step.popular_samples = int(samples - waits.sum())
        popular = [np.flatnonzero(~waits[sl]) + sl.start for sl in slices]
        rest = [np.flatnonzero(waits[sl]) + sl.start for sl in slices]
        return [Phase(popular), Phase(rest, before=self._land)]

    def _land(self, step: Step) -> None:
        rp, fetched, issued = self._fetching
        self._fetching = None
        t = time.perf_counter()
        step.fetch_overlap = t - issued
        self.insert(rp, fetched)
        step.times["prefetch_wait"] += time.perf_counter() - t

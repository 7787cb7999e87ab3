"""The planner's time in the model: its rounds over the traced batches, timed.

The batches reach the planner as a run's rank 0 hands them: read and indexed (UniqueKeys) by
its loader workers, in parallel with the planning, so their reading is not the planner's
time (`Batches`). The time is thread CPU time, which another process's load hardly changes.
An oracle planning in slices (`planners` workers, run here one after the other on this
thread, each timed apart: `engine/planning/slices.py`) takes its own thread's part plus its
busiest worker's: the time of K workers on K cores.

Into the Volumes: `plan_ms` (that sum), `plan_worker_ms` (the busiest worker's) and
`plan_serial_ms` (the oracle thread's), milliseconds a batch, each the median over the rounds
of a round's time per batch (the mean would take in the first touches of the planner's
tables, which a long run does not pay every round); `planners`, the workers.

Where each trainer gets its own plan (a partitioned cache, N > 1), rank 0 also makes and
encodes for the wire the N plans of every round (in-process, to count their bytes), after the
round is planned, by as many threads as the oracle has workers, in two phases
(`engine/distributed/shares.py`): each thread buckets a chunk of the round's entries by
group of trainers (`RoundIndex.fill`), then makes and encodes its group's plans
(`group_encoded`). `PlanMaking` times each task on the first MAKE_SAMPLES rounds, and the
median per batch of the busiest bucketing plus the busiest making, `plan_make_ms`, is added
to `plan_ms`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from bagpipe_cli.engine.planning.keys import KeySets, UniqueKeys
from bagpipe_cli.engine.planning.plans import RoundPlan
from bagpipe_cli.simulate.inputs import Volumes


class Batches:
    """The traced batches, read and indexed here; `cpu`: the thread CPU seconds that took
    (not the planner's); `held` keeps each batch's keys until its round is planned (`hold`)."""

    def __init__(self, keys: Callable[[], Iterator[np.ndarray]], total: int, hold: bool):
        self.keys, self.total, self.hold = keys, total, hold
        self.cpu = 0.0
        self.held: deque[np.ndarray] = deque()

    def __iter__(self) -> Iterator[UniqueKeys]:
        keysets = KeySets(self.total)
        it = self.keys()
        while True:
            t0 = time.thread_time()
            keys = next(it, None)
            if keys is None:
                return
            u = keysets.unique(keys)
            if self.hold:
                self.held.append(keys)
            self.cpu += time.thread_time() - t0
            yield u


MAKE_SAMPLES = 8  # rounds whose trainers' own plans are made and timed (`PlanMaking`)


class PlanMaking:
    """Rank 0's making and encoding of every trainer's own plan of a round by `groups`
    threads: the busiest thread's CPU seconds a batch, on the first MAKE_SAMPLES rounds (see
    the module docstring)."""

    def __init__(self, trainers: int, total_rows: int, groups: int):
        from bagpipe_cli.engine.distributed.rounds import (  # torch: not for --help
            id_dtype,
            key_dtype,
        )
        from bagpipe_cli.engine.distributed.shares import trainer_groups

        self.n, self.keys, self.ids = trainers, key_dtype(total_rows), id_dtype(trainers)
        self.groups = trainer_groups(trainers, groups)
        self.per_batch: list[float] = []

    def time(self, rp: RoundPlan) -> None:
        if len(self.per_batch) >= MAKE_SAMPLES or not rp.iters:
            return
        from bagpipe_cli.engine.distributed.shares import RoundIndex, group_encoded

        def busiest(task: Callable[[int], Any]) -> float:
            """The most thread CPU seconds of task(j), j over the groups, one after the other
            here, each on a thread of its own there."""
            most = 0.0
            for j in range(len(self.groups)):
                t0 = time.thread_time()
                task(j)
                most = max(most, time.thread_time() - t0)
            return most

        ix = RoundIndex(rp, self.n, self.groups) if len(self.groups) > 1 else None
        bucketing = busiest(ix.fill) if ix is not None else 0.0
        if ix is not None:
            ix.done()
        making = busiest(lambda j: group_encoded(rp, self.n, self.keys, self.ids, *self.groups[j],
                                                 ix.buckets(j) if ix is not None else None))
        self.per_batch.append((bucketing + making) / len(rp.iters))

    def into(self, v: Volumes) -> None:
        """Its median into `v`: `plan_make_ms`, and added to the planning stage's `plan_ms`."""
        v.plan_make_ms = 1e3 * float(np.median(self.per_batch)) if self.per_batch else 0.0
        v.plan_ms += v.plan_make_ms


def timed_rounds(planner: Any, keys: Callable[[], Iterator[np.ndarray]], total: int, v: Volumes,
                 hold: bool = False) -> Iterator[tuple[RoundPlan, list[np.ndarray]]]:
    """`planner`'s rounds over the batches `keys()` yields (each with its batches' keys when
    `hold`); when they are done, its time is in `v` (see the module docstring)."""
    batches = Batches(keys, total, hold)
    rounds = planner.plan(batches)
    workers = getattr(planner, "workers", None)
    per_batch: list[float] = []
    busiest: list[float] = []
    serial: list[float] = []
    while True:
        c0, read0 = time.thread_time(), batches.cpu
        w0 = workers.cpu.copy() if workers is not None else np.zeros(1)
        rp = next(rounds, None)
        if rp is None:
            break
        w = (workers.cpu - w0) if workers is not None else np.zeros(1)
        own = max(0.0, time.thread_time() - c0 - (batches.cpu - read0) - float(w.sum()))
        if rp.iters:
            n = len(rp.iters)
            per_batch += [(own + float(w.max())) / n] * n
            busiest += [float(w.max()) / n] * n
            serial += [own / n] * n
        yield rp, [batches.held.popleft() for _ in rp.iters] if hold else []

    def ms(x: list[float]) -> float:
        return 1e3 * float(np.median(x)) if x else 0.0

    v.plan_ms, v.plan_worker_ms, v.plan_serial_ms = ms(per_batch), ms(busiest), ms(serial)
    v.planners = workers.k if workers is not None else 1

"""The batch and plan feed: global batches in order, read ahead, planned a round at a time.

    batch_stream:    batch b.. of the training rows, read and indexed (U_b and its inverse:
                     `engine/planning/keys.py`) by `workers` threads ahead of the planner, in order
    planned_rounds:  those batches -> the planner -> (RoundPlan, the round's batches)

Reading a batch and finding U_b is most of the feed's work and depends on nothing but the
batch, so workers do it for several batches at once (numpy releases the GIL); the planner's
pass, which carries state from batch to batch, consumes their results in order.

The in-process runtime runs `planned_rounds` on its planner thread (`engine/local/planner.py`);
rank 0 of a distributed run runs it directly, on keys alone, and sends each round's plan
(`engine/distributed/planner.py`), while every trainer reads its own samples (`SliceReader`).
The training loop reads `Round`s: a round's plan and, per iteration, the dense features and
labels of the samples this process trains on.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from bagpipe_cli.data.format import Dataset, read_rows
from bagpipe_cli.engine.planning.keys import KeySets, UniqueKeys
from bagpipe_cli.engine.planning.plans import RoundPlan

if TYPE_CHECKING:
    from bagpipe_cli.engine.config import TrainConfig


MAX_LOADER_WORKERS = 8  # more reader threads than this only contend with the oracle's pass


class Planner(Protocol):
    """What plans a cache round by round: `oracle.Oracle`, `planner.PolicyPlanner` (which imports
    this module, so it is not named here)."""

    def plan(self, batches: Iterable[np.ndarray | UniqueKeys]) -> Iterator[RoundPlan]: ...


@dataclass
class Round:
    """A round's plan and, per iteration, the dense features and labels of this process's samples."""

    plan: RoundPlan
    dense: list[np.ndarray]
    labels: list[np.ndarray]


@dataclass
class Samples:
    """Global batch b as the feed carries it: its keys as U_b and inverse (the planner's
    input), its dense features and labels (the trainers')."""

    b: int
    keys: UniqueKeys
    dense: np.ndarray
    labels: np.ndarray


def batch_start(cfg: TrainConfig, train_rows: int, b: int) -> int:
    """The first row of global batch b: batches in dataset order, wrapping around at the end
    of the training rows (batch b is the same whatever a run starts at: resuming is exact)."""
    return (b % (train_rows // cfg.batch_size)) * cfg.batch_size


def key_batches(ds: Dataset, cfg: TrainConfig, train_rows: int, offsets: np.ndarray
                ) -> Iterator[np.ndarray]:
    """The global row keys [B*T] of every batch of the run (planning passes)."""
    for b in range(cfg.iterations):
        lo = batch_start(cfg, train_rows, b)
        yield ds.keys_block(lo, lo + cfg.batch_size, offsets)


class _Reader:
    """Reads and indexes batches; each thread has its own KeySets (its table of the keys).
    Without `samples` only the keys are read (a distributed run's rank 0: every trainer reads
    its own samples, `SliceReader`)."""

    def __init__(self, ds: Dataset, cfg: TrainConfig, train_rows: int, offsets: np.ndarray,
                 samples: bool = True):
        self.ds, self.cfg, self.train_rows, self.offsets = ds, cfg, train_rows, offsets
        self.samples = samples
        self.total = int(sum(ds.meta.cardinalities))
        self._local = threading.local()

    def __call__(self, b: int) -> Samples:
        ks = getattr(self._local, "keysets", None)
        if ks is None:
            ks = self._local.keysets = KeySets(self.total)
        lo = batch_start(self.cfg, self.train_rows, b)
        hi = lo + self.cfg.batch_size
        ds = self.ds
        keys = ks.unique(ds.keys_block(lo, hi, self.offsets))
        if not self.samples:
            return Samples(b, keys, _NONE, _NONE)
        return Samples(b, keys, read_rows(ds.dense, lo, hi), read_rows(ds.labels, lo, hi))


_NONE = np.empty(0, np.float32)


class SliceReader:
    """Trainer i of n's samples of global batch b, read from the dataset's columns: the keys
    (int64, sample by sample), dense features and labels of rows [i B/n, (i+1) B/n) of it."""

    def __init__(self, ds: Dataset, cfg: TrainConfig, train_rows: int, offsets: np.ndarray,
                 i: int, n: int):
        self.ds, self.cfg, self.train_rows, self.offsets = ds, cfg, train_rows, offsets
        self.per = cfg.batch_size // n
        self.first = i * self.per

    def __call__(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo = batch_start(self.cfg, self.train_rows, b) + self.first
        hi = lo + self.per
        ds = self.ds
        return ds.keys_block(lo, hi, self.offsets), read_rows(ds.dense, lo, hi), read_rows(ds.labels, lo, hi)


def batch_stream(ds: Dataset, cfg: TrainConfig, train_rows: int, offsets: np.ndarray,
                 start: int = 0, workers: int = 1, samples: bool = True) -> Iterator[Samples]:
    """Batches start.. in order, each read and indexed by one of `workers` threads, at most
    2 x workers batches ahead of the consumer (without `samples`: their keys only)."""
    read = _Reader(ds, cfg, train_rows, offsets, samples)
    if workers <= 1:
        for b in range(start, cfg.iterations):
            yield read(b)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="loader")
    ahead: deque[Future] = deque()
    try:
        for b in range(start, cfg.iterations):
            ahead.append(pool.submit(read, b))
            if len(ahead) >= 2 * workers:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def planned_rounds(ds: Dataset, cfg: TrainConfig, train_rows: int, planner: Planner,
                   offsets: np.ndarray, start: int = 0, workers: int = 1,
                   samples: bool = True) -> Iterator[tuple[RoundPlan, list[Samples]]]:
    """(plan, batches) of every round of iterations start.. (a resumed run plans only those:
    its planner counts from 0, so plans are shifted to start..); without `samples` the
    batches carry their keys only."""
    held: deque[Samples] = deque()

    def keys() -> Iterator[UniqueKeys]:
        for s in batch_stream(ds, cfg, train_rows, offsets, start, workers, samples):
            held.append(s)
            yield s.keys

    for rp in planner.plan(keys()):
        if start:
            for it in rp.iters:
                it.b += start
        yield rp, [held.popleft() for _ in rp.iters]

"""A batch's LRPP classes and its fetched and evicted rows, as the oracle's planning workers
fill them slice by slice (`engine/planning/slices.py`, `oracle.py`'s `_step`).

- `BatchClasses`: each row's class (sync_now: U_b and U_b+1; no_sync: one writer and evicted
  after b; sync_later: the rest) and its one user (its first writer: meaningful for no_sync
  rows), the counts of sync_now and no_sync rows and each trainer's no_sync rows;
- `BatchLists`: the rows fetched for b (with the one trainer each is private to: a row
  fetched for b and no_sync at b lives in the cache for b alone, on one trainer) and the
  rows evicted after b, by position in U_b;
- `joined`: the K slices' lists, and their Partitions laid into the batch's, by the K
  workers chunk by chunk of U_b.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from bagpipe_cli.engine.planning.partition import NO_SYNC, SYNC_LATER, SYNC_NOW, Partition
from bagpipe_cli.engine.planning.slices import ALL, Workers


@dataclass
class BatchLists:
    """A batch's fetched rows (positions in U_b, sorted) with the trainer each is private
    to (-1: every trainer's), and its evicted rows (positions, sorted)."""

    fetched: np.ndarray
    evicted: np.ndarray
    private: np.ndarray


class BatchClasses:
    """A batch's LRPP classes (docs/architecture.md), filled slice by slice (`add`): each
    row's class and one user (its first writer: meaningful for no_sync rows), the count of
    sync_now and no_sync rows and each trainer's no_sync rows. Without LRPP (`unclassed`):
    no classes, every row synchronised."""

    def __init__(self, rows: int, n: int):
        self.row_class: np.ndarray | None = np.empty(rows, dtype=np.int8)
        self.owner: np.ndarray | None = np.empty(rows, dtype=np.int64)
        self.owner_rows = np.zeros(n, dtype=np.int64)
        self.now = self.none = 0
        self._lock = threading.Lock()

    @classmethod
    def unclassed(cls, in_next: np.ndarray, n: int) -> BatchClasses:
        c = cls(0, n)
        c.row_class = c.owner = None
        c.now = int(in_next.sum())
        return c

    def add(self, at, evicted: np.ndarray, in_next: np.ndarray, part: Partition | None,
            fetched: np.ndarray) -> np.ndarray:
        """The classes of a slice's rows (positions `at` in U_b): evicted after b, used at b+1,
        and their partition (None: one trainer, every row's one user); returns the trainer
        each row `fetched` for b is private to, -1 for none: a row fetched for b and no_sync
        at b lives in the cache for b alone, on one trainer."""
        if part is None:
            single, owner = np.ones(len(evicted), dtype=bool), np.zeros(len(evicted), dtype=np.int64)
        else:  # a row's one user, where it has one, is its writer
            single = part.count == 1
            owner = part.writers[part.first].astype(np.int64)
        no_sync = single & evicted
        row_class = np.full(len(evicted), SYNC_LATER, dtype=np.int8)
        row_class[in_next] = SYNC_NOW
        row_class[no_sync] = NO_SYNC
        if at is ALL:  # one slice: the batch's own arrays
            self.row_class, self.owner = row_class, owner
        else:
            self.row_class[at], self.owner[at] = row_class, owner
        mine = np.bincount(owner[no_sync], minlength=len(self.owner_rows))
        with self._lock:
            self.owner_rows += mine
            self.now += int(in_next.sum())
            self.none += int(no_sync.sum())
        return np.where(row_class[fetched] == NO_SYNC, owner[fetched], -1)


def joined(workers: Workers, parts: list, done: tuple, private: np.ndarray, evicted: np.ndarray,
           arrays: tuple[np.ndarray, ...] | None) -> tuple[BatchLists, Partition | None]:
    """The K slices' results (`parts`: each slice's positions in U_b; `done`: each one's
    Partition of its rows) joined by the K workers, chunk by chunk of U_b: the batch's
    fetched rows (with their `private` trainers, -2 where not fetched) and `evicted` rows
    and, partitioned (`arrays`: count, home and src as the slices wrote them, and each row's
    first pair to fill), the batch's Partition."""
    rows, k = len(private), workers.k
    count, home, src, first = arrays if arrays is not None else (None,) * 4
    bounds, totals, lists = [c * rows // k for c in range(k + 1)], np.zeros(k, np.int64), [None] * k

    def chunk(c: int) -> None:
        lo, hi = bounds[c], bounds[c + 1]
        got = np.flatnonzero(private[lo:hi] > -2) + lo
        lists[c] = (got, np.flatnonzero(evicted[lo:hi]) + lo, private[got])
        if arrays is not None and hi > lo:
            ends = np.cumsum(count[lo:hi], dtype=np.int64)
            totals[c] = ends[-1]
            first[lo:hi] = ends - count[lo:hi]

    workers.run(chunk)
    batch_lists = BatchLists(*(np.concatenate(x) for x in zip(*lists, strict=True)))
    if arrays is None:
        return batch_lists, None
    offsets = (np.cumsum(totals) - totals).tolist()

    def shift(c: int) -> None:  # the chunk's pairs start after those of the chunks before
        first[bounds[c]:bounds[c + 1]] += offsets[c]

    workers.run(shift)
    # The slices' writers laid into the batch's pairs: each row's, in trainer order, at
    # its place in row order.
    writers = np.empty(int(totals.sum()), dtype=np.int16)

    def lay(s: int) -> None:
        p, at = done[s], parts[s]
        writers[np.repeat(first[at] - p.first, p.count.astype(np.int64)) + np.arange(len(p.writers))] = p.writers

    workers.run(lay)
    return batch_lists, Partition(count, writers, home, src, _first=first)

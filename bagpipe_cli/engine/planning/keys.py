"""Global row keys of a batch, and their sorted unique set U_b with each access's position in it.

Key = table offset + id, so the keys of all tables share one space of `total_rows` keys.
`KeySets.unique` is the feed's hot spot (every planner calls it once per batch): when the
key space is small next to a batch, it marks the batch's keys in a table of the key space
and reads the marked keys back in order, which costs a pass over the keys and one over the
table instead of a sort (15x faster than `np.unique` at Criteo Kaggle's size); on a sparse
space it sorts (`np.unique`). Both give the same arrays.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Mark in a table while the key space is at most this many times the batch's keys: a
# byte per key scanned against a sort's ~log2(keys) passes over the batch.
DENSE_FACTOR = 128


class UniqueKeys(NamedTuple):
    """A batch's keys as U (sorted unique keys, int64) and the inverse (int32 position in U of
    every access, sample by sample)."""

    uniq: np.ndarray
    inverse: np.ndarray


def batch_keys(sparse: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Global row keys [B*T] of a batch of ids [B, T], row-major (sample by sample)."""
    return (sparse + offsets[None, :]).reshape(-1)


class KeySets:
    """Sorted unique keys and inverse of batches of keys in [0, `total_rows`) (see module doc).

    Holds a table of the key space (5 bytes a key) when it is used; one per thread. Positions
    are int32: a batch has fewer than 2^31 accesses.
    """

    def __init__(self, total_rows: int):
        self.total_rows = int(total_rows)
        self._mark: np.ndarray | None = None
        self._pos: np.ndarray | None = None

    def _dense(self, n: int) -> bool:
        return self.total_rows <= DENSE_FACTOR * max(n, 1)

    def of(self, batch: np.ndarray | UniqueKeys) -> UniqueKeys:
        """A batch given as its keys, or already as a UniqueKeys (a loader worker's)."""
        return batch if isinstance(batch, UniqueKeys) else self.unique(batch)

    def unique(self, keys: np.ndarray) -> UniqueKeys:
        """(U: sorted unique keys as int64, inverse: int32 position in U of every key)."""
        keys = np.asarray(keys)
        if not self._dense(len(keys)):
            uniq, inverse = np.unique(keys, return_inverse=True)
            return UniqueKeys(uniq.astype(np.int64, copy=False), inverse.reshape(-1).astype(np.int32))
        if self._mark is None:
            self._mark = np.zeros(self.total_rows, dtype=bool)
            self._pos = np.empty(self.total_rows, dtype=np.int32)
        mark, pos = self._mark, self._pos
        mark[keys] = True
        uniq = np.flatnonzero(mark)
        mark[uniq] = False  # the table is all False again for the next batch
        pos[uniq] = np.arange(len(uniq), dtype=np.int32)
        return UniqueKeys(uniq, pos[keys])

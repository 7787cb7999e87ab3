"""The plan in slices of the key space: K planning workers, each owning the rows of one slice.

Every decision of the oracle is per row (docs/architecture.md, "The plan in slices"): a row's
fetch, eviction, LRPP class and home depend only on its own accesses in the window and on
which trainers read it at b and b+1. So the rows are cut into K slices by their key
(`(key // BLOCK) mod K`: blocks of BLOCK consecutive ids, and so each table's hot head, go
round the slices; a block is a cache line or two of the oracle's per-key tables, which so no
two workers write at once), worker s
makes the window pass and the partition of slice s's rows, and the results are laid into
the arrays of the whole batch by position in U_b: the same arrays, so the same plan and the
same bits, whatever K is.

    split:     each row of U_b -> its slice; worker s finds its rows' positions (`take`)
    marks:     worker w marks the (row, trainer) pairs of the w-th K-th of the batch's
               trainers in one table of the batch (over processes this is an all-to-all of
               each trainer's pairs to their slices' owners)
    per slice: worker s reads its rows' pairs, then makes their window pass and partition

`Workers` runs a phase's K tasks on a thread pool (numpy releases the GIL), or one after
the other on the calling thread (`threads=False`, what `simulate` measures with), and
counts each worker's thread CPU time, which another process's load hardly changes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

ALL = slice(None)  # the one slice of a planner of one worker: every row of U_b
# The default number of planning workers: one per this many accesses of a batch (rows read
# by samples, tables included), so that a worker's share stays about as large at any N: on
# the 2-core machine of docs/benchmarks.md the busiest worker's share took 8-14 ms of CPU a
# batch from 8 to 64 trainers ("The plan in slices").
ACCESSES_PER_PLANNER = 1 << 18
MAX_PLANNERS = 64
BLOCK = 32  # consecutive keys in one slice: 64 bytes of an int16 per-key table, 128 of an int32
FEW_GROUPS = 3  # up to this many groups, entries are bucketed by a pass a group (`pieces`)


def default_planners(accesses_per_batch: int, cores: int | None = None) -> int:
    """K for a batch of `accesses_per_batch` (B x tables): one worker per
    ACCESSES_PER_PLANNER accesses, at most `cores` (the cores left to the feed)."""
    k = max(1, math.ceil(accesses_per_batch / ACCESSES_PER_PLANNER))
    return max(1, min(k, MAX_PLANNERS, cores if cores else k))


@dataclass
class Split:
    """U_b cut into K slices (`split`): `parts[s]`, slice s's positions in U_b (sorted);
    `local`, each row's position in its slice, and `at`, its position in the batch's rows
    laid slice after slice (None with one slice: the positions themselves); `starts[s]`
    where slice s starts there."""

    parts: list[Any]
    local: np.ndarray | None
    at: np.ndarray | None = None
    pieces: list[list[np.ndarray]] | None = None  # [chunk][slice] (`bucket`)
    starts: list[int] | None = None


def split(uniq: np.ndarray, k: int) -> Split:
    """The slices of U_b (`uniq`, sorted keys): rows with (key // BLOCK) mod k == s in slice s. Nothing is
    read here: k tasks find them, each a chunk of U_b (`bucket`), then each its slice's
    (`take`)."""
    if k == 1:
        return Split([ALL], None)
    return Split([None] * k, np.empty(len(uniq), dtype=np.int32), np.empty(len(uniq), dtype=np.int32),
                 [[] for _ in range(k)])


def pieces(group: np.ndarray, g: int, base: int) -> list[np.ndarray]:
    """The indices (from `base`) of the entries of each of groups 0..g-1 (`group`, unsigned),
    each in ascending order."""
    if g <= FEW_GROUPS:  # a pass for each group costs less than the sort
        return [np.flatnonzero(group == j) + base for j in range(g)]
    order = np.argsort(group, kind="stable")  # a radix sort of one or two bytes
    order += base
    ends = np.cumsum(np.bincount(group, minlength=g + 1))
    return [order[a:b] for a, b in zip([0, *ends[:g - 1]], ends[:g], strict=True)]


def bucket(sp: Split, uniq: np.ndarray, c: int) -> None:
    """Task c of a split: the rows of chunk c of U_b (a K-th), by slice."""
    k = len(sp.parts)
    lo, hi = c * len(uniq) // k, (c + 1) * len(uniq) // k
    sp.pieces[c] = pieces(((uniq[lo:hi] // BLOCK) % k).astype(np.uint8 if k < 256 else np.uint16), k, lo)


def take(sp: Split, s: int) -> Any:
    """Worker s's rows of the batch (once every `bucket` is done): their positions in U_b,
    sorted; each one's position among them in `sp.local` and in the rows slice after slice
    in `sp.at`."""
    if sp.local is not None and sp.parts[s] is None:
        if sp.starts is None:
            sizes = [sum(len(ch[j]) for ch in sp.pieces) for j in range(len(sp.parts))]
            sp.starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        at = np.concatenate([ch[s] for ch in sp.pieces])
        sp.local[at] = np.arange(len(at))
        sp.at[at] = np.arange(sp.starts[s], sp.starts[s + 1])
        sp.parts[s] = at
    return sp.parts[s]


def positions(part: Any, mask: np.ndarray) -> np.ndarray:
    """Positions in U_b of the rows of a slice where `mask` (by position in the slice) holds."""
    return np.flatnonzero(mask) if part is ALL else part[mask]


def size(part: Any, rows: int) -> int:
    return rows if part is ALL else len(part)


def mark_accesses(mark: np.ndarray, inverse: np.ndarray, at: np.ndarray, trainers: np.ndarray,
                  n: int, lo: int, hi: int) -> None:
    """Accesses lo..hi-1 of a batch marked in `mark` [|U_b| x n] at (row, trainer), its rows
    laid slice after slice (`Split.at`): a worker's share of the batch, cut at trainers'
    boundaries so that no two workers write the same entry."""
    mark[np.multiply(at[inverse[lo:hi]], n, dtype=np.int64) + trainers[lo:hi]] = True


def slice_pairs(mark: np.ndarray, start: int, rows: int, n: int) -> np.ndarray:
    """A slice's (row, trainer) pairs as sorted codes `position in the slice * n + trainer`,
    read from the batch's marks (`mark_accesses`) of its `rows` rows from `start`, which it
    then clears for the next batch."""
    mine = mark[start * n:(start + rows) * n]
    codes = np.flatnonzero(mine)
    mine[codes] = False
    return codes


class Workers:
    """K planning workers (see the module docstring): `run(fn)` is [fn(0), ..., fn(K-1)],
    each call timed in its thread's CPU time into `cpu[s]`."""

    def __init__(self, k: int, threads: bool = True):
        self.k, self.threads = k, threads and k > 1
        self.cpu = np.zeros(k)
        self._pool: ThreadPoolExecutor | None = None

    def _timed(self, fn: Callable[[int], Any], s: int) -> Any:
        t = time.thread_time()
        try:
            return fn(s)
        finally:
            self.cpu[s] += time.thread_time() - t

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        if not self.threads:
            return [self._timed(fn, s) for s in range(self.k)]
        if self._pool is None:  # made on the planner's thread: its workers share its cores
            self._pool = ThreadPoolExecutor(self.k, thread_name_prefix="plan-slice")
        return list(self._pool.map(lambda s: self._timed(fn, s), range(self.k)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

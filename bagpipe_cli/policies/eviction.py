"""The fixed-capacity cache engine that the lru, lfu and belady simulators share.

`EvictingCache.step(u, lo, primary)` runs one batch (its unique rows `u`, at trace
positions [lo, lo + len(u))): it fetches the batch's missing rows, then evicts the
resident rows with the smallest (priority, stamp) keys until at most `capacity` remain,
never a row of the batch. The policies differ only in the priority
(`bagpipe_cli.policies.simulators`); the engine's planner drives the same cache to know which
rows each iteration evicts.
"""

from __future__ import annotations

import numpy as np

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.policies.trace import Trace

_WINDOW = 4096  # fewest queue entries examined at a time when evicting


class SortedRuns:
    """A priority queue of (key, row) entries kept as a few sorted runs, with lazy deletion.

    `add` appends a batch's entries as a new run and merges the newest runs while the one
    before is at most twice as large, so there are O(log n) runs and each entry is copied
    O(log n) times (one sorted queue would copy all of it for every batch). `pop(n, live)`
    removes and returns, ascending, the `n` smallest entries that `live(keys, rows)` accepts.
    """

    def __init__(self, row_dtype: np.dtype):
        self.keys: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []
        self.heads: list[int] = []  # entries before heads[i] of run i are popped
        self.row_dtype = row_dtype

    def __len__(self) -> int:
        return sum(k.size - h for k, h in zip(self.keys, self.heads, strict=True))

    def add(self, keys: np.ndarray, rows: np.ndarray) -> None:
        order = np.argsort(keys)
        self.keys.append(keys[order])
        self.rows.append(rows[order].astype(self.row_dtype, copy=False))
        self.heads.append(0)
        while len(self.keys) > 1 and self.keys[-2].size - self.heads[-2] <= 2 * self.keys[-1].size:
            self._merge_last_two()

    def _merge_last_two(self) -> None:
        h = self.heads[-2]
        a, ar = self.keys[-2][h:], self.rows[-2][h:]
        b, br = self.keys.pop(), self.rows.pop()
        self.heads.pop()
        if not a.size or a[-1] < b[0]:  # lru: the new keys are above every queued one
            k, r = np.concatenate([a, b]), np.concatenate([ar, br])
        else:
            at = np.searchsorted(a, b)
            k, r = np.insert(a, at, b), np.insert(ar, at, br)
        self.keys[-1], self.rows[-1], self.heads[-1] = k, r, 0

    def keep(self, live) -> None:
        """Drop every entry `live` rejects (each run stays sorted)."""
        for i in range(len(self.keys)):
            k, r = self.keys[i][self.heads[i]:], self.rows[i][self.heads[i]:]
            m = live(k, r)
            self.keys[i], self.rows[i], self.heads[i] = k[m], r[m], 0

    def pop(self, n: int, live) -> tuple[np.ndarray, np.ndarray]:
        """The `n` smallest live entries, ascending (fewer only if fewer are live)."""
        cand_k, cand_r, cand_run, cand_pos = [], [], [], []
        for i, (k, r) in enumerate(zip(self.keys, self.rows, strict=True)):
            # The n smallest live entries overall are among the first n live ones of each run.
            pos, found = self.heads[i], 0
            while found < n and pos < k.size:
                w = min(k.size - pos, max(2 * (n - found), _WINDOW))
                hit = np.flatnonzero(live(k[pos : pos + w], r[pos : pos + w]))[: n - found] + pos
                if not found:  # stale entries never become live again: skip them for good
                    self.heads[i] = int(hit[0]) if hit.size else pos + w
                cand_k.append(k[hit])
                cand_r.append(r[hit])
                cand_run.append(np.full(hit.size, i, np.int32))
                cand_pos.append(hit)
                found += hit.size
                pos += w
        if not cand_k:
            return np.zeros(0, np.int64), np.zeros(0, self.row_dtype)
        ck = np.concatenate(cand_k)
        take = np.argsort(ck, kind="stable")[:n]
        runs, pos = np.concatenate(cand_run)[take], np.concatenate(cand_pos)[take]
        for i in np.unique(runs):  # a run gives up a prefix of its live entries
            self.heads[i] = int(pos[runs == i].max()) + 1
        return ck[take], np.concatenate(cand_r)[take]


class EvictingCache:
    """Fixed-capacity cache evicting the resident row with the smallest priority key.

    A row's key is `(primary << shift) | stamp`, where `stamp` is the position of the
    access in the concatenated trace (unique, increasing in batch then first-access
    order), so ties on `primary` go to the earlier use. The queue (`SortedRuns`) holds
    (key, row) entries; an entry is live iff its key is its row's current key and the row
    is resident (lazy deletion). Only per-row state and the queue are held, never the
    trace, so a spilled trace can be streamed through it; the queue is built from the
    rows' current keys when the cache first overflows (until then nothing is evicted).
    """

    def __init__(self, capacity: int, trace: Trace, primary_max: int):
        self.capacity = int(capacity)
        n = trace.unique_accesses
        self.shift = max(1, int(n).bit_length())
        if int(primary_max).bit_length() + self.shift > 62:
            raise ConfigError("trace too long for this simulator (priority keys overflow 62 bits); "
                              "profile fewer samples")
        self.resident = np.zeros(trace.num_rows, dtype=bool)
        self.cur = np.full(trace.num_rows, -1, dtype=np.int64)  # current key of each row
        self.row_dtype = trace.keys.dtype
        self.queue: SortedRuns | None = None  # built when the cache first overflows
        self.n_res = 0
        self.peak = 0
        self.evicted: list[np.ndarray] = []  # rows evicted by the last step (the engine writes them back)

    def step(self, u: np.ndarray, lo: int, primary: np.ndarray | None) -> int:
        """Run the batch of unique rows `u` at trace positions [lo, lo + len(u)); returns
        the rows fetched."""
        self.evicted = []
        fetched = len(u) - int(np.count_nonzero(self.resident[u]))
        self.resident[u] = True
        self.n_res += fetched
        keys = np.arange(lo, lo + len(u), dtype=np.int64)
        if primary is not None:
            keys |= primary.astype(np.int64) << self.shift
        self.cur[u] = keys  # the rows' older queue entries are now stale
        excess = self.n_res - self.capacity
        if excess > 0 and self.queue is None:
            self.queue = self._queue_of_resident(u)
        if excess > 0:
            _, gone = self.queue.pop(excess, self._live)
            if gone.size != excess:  # cannot happen: every resident row outside u has a live entry
                raise RuntimeError("cache queue underflow")
            self.resident[gone] = False
            self.evicted.append(gone)
            self.n_res -= excess
        if self.queue is not None:
            if len(self.queue) > 2 * self.capacity + _WINDOW:  # drop stale entries: at most capacity stay
                self.queue.keep(self._live)
            self.queue.add(keys, u)
        self.peak = max(self.peak, self.n_res)
        return fetched

    def _queue_of_resident(self, u: np.ndarray) -> SortedRuns:
        """The queue's live entries, from the rows' current keys: every resident row but
        the batch's `u` (whose new keys are added after the eviction). Until the cache first
        overflows nothing is evicted, so no queue is kept."""
        mask = self.resident.copy()
        mask[u] = False
        rows = np.flatnonzero(mask)
        q = SortedRuns(self.row_dtype)
        q.add(self.cur[rows], rows)
        return q

    def _live(self, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return (self.cur[rows] == keys) & self.resident[rows]

"""The fixed-capacity cache engine that the lru, lfu and belady simulators share.

`EvictingCache.step(lo, hi, primary)` runs one batch (trace positions [lo, hi)): it
fetches the batch's missing rows, then evicts the resident rows with the smallest
(priority, stamp) keys until at most `capacity` remain, never a row of the batch. The
policies differ only in the priority (`bagpipe_cli.profile.policies`); the engine's
planner drives the same cache to know which rows each iteration evicts.
"""

from __future__ import annotations

import numpy as np

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.profile.trace import Trace


class EvictingCache:
    """Fixed-capacity cache evicting the resident row with the smallest priority key.

    A row's key is `(primary << shift) | stamp`, where `stamp` is the position of the
    access in the concatenated trace (unique, increasing in batch then first-access
    order), so ties on `primary` go to the earlier use. The queue holds keys sorted
    ascending; an entry is live iff it equals its row's current key (lazy deletion).
    The stamp also finds the entry's row: `row = trace.keys[key & mask]`.
    """

    def __init__(self, capacity: int, trace: Trace, primary_max: int):
        self.capacity = int(capacity)
        self.trace_keys = trace.keys
        n = trace.unique_accesses
        self.shift = max(1, int(n).bit_length())
        if int(primary_max).bit_length() + self.shift > 62:
            raise ConfigError("trace too long for this simulator (priority keys overflow 62 bits); "
                              "profile fewer samples")
        self.mask = np.int64((1 << self.shift) - 1)
        self.resident = np.zeros(trace.num_rows, dtype=bool)
        self.cur = np.full(trace.num_rows, -1, dtype=np.int64)  # current key of each row
        self.q = np.zeros(max(1024, 2 * self.capacity), dtype=np.int64)
        self.head = 0
        self.tail = 0
        self.n_res = 0
        self.peak = 0

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        return self.trace_keys[keys & self.mask]

    def step(self, lo: int, hi: int, primary: np.ndarray | None) -> int:
        """Run the batch whose accesses are trace positions [lo, hi); returns rows fetched."""
        u = self.trace_keys[lo:hi]
        m = hi - lo
        self.evicted: list[np.ndarray] = []  # rows evicted by this step (the engine writes them back)
        fetched = m - int(np.count_nonzero(self.resident[u]))
        self.resident[u] = True
        self.n_res += fetched
        keys = np.arange(lo, hi, dtype=np.int64)
        if primary is not None:
            keys |= primary.astype(np.int64) << self.shift
        self.cur[u] = keys  # the rows' older queue entries are now stale
        excess = self.n_res - self.capacity
        if excess > 0:
            self._evict(excess)
        self._push(keys, sorted_above=primary is None)
        self.peak = max(self.peak, self.n_res)
        return fetched

    def _live(self, keys: np.ndarray) -> np.ndarray:
        rows = self._rows(keys)
        return (self.cur[rows] == keys) & self.resident[rows]

    def _evict(self, excess: int) -> None:
        h, left = self.head, excess
        while left > 0:
            w = min(self.tail - h, max(2 * left, 4096))
            if w <= 0:  # cannot happen: every resident row outside U_b has a live entry
                raise RuntimeError("cache queue underflow")
            window = self.q[h : h + w]
            live = np.flatnonzero(self._live(window))
            take = live[:left]
            gone = self._rows(window[take])
            self.resident[gone] = False
            self.evicted.append(gone)
            left -= take.size
            h += int(take[-1]) + 1 if left == 0 else w
        self.head = h
        self.n_res -= excess

    def _push(self, keys: np.ndarray, sorted_above: bool) -> None:
        live = self.q[self.head : self.tail]
        compacted = live.size > 2 * self.capacity + 4096
        if compacted:  # drop stale entries; afterwards at most `capacity` remain
            live = live[self._live(live)]
        if sorted_above:
            # lru: new keys are larger than every queued key, so append.
            if compacted or self.tail + keys.size > self.q.size:
                need = live.size + keys.size
                buf = self.q if 2 * need <= self.q.size else np.zeros(4 * need, np.int64)
                buf[: live.size] = live  # numpy copes with the overlap
                self.q = buf
                self.head, self.tail = 0, live.size
            self.q[self.tail : self.tail + keys.size] = keys
            self.tail += keys.size
        else:
            keys = np.sort(keys)
            merged = np.insert(live, np.searchsorted(live, keys), keys)
            self.q, self.head, self.tail = merged, 0, merged.size

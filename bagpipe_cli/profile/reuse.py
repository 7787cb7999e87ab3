"""What lookahead buys: how many of a batch's distinct rows the batches just before it
read, and how often a batch reuses its own rows.

Definitions (global batch b of n, `U_b` its distinct rows as in `policies/trace.py`; per
table, `U_b` holds only that table's rows; "overall", every table's together):

- `in_batch` share at distance k = sum_b |U_{b+k} ∩ U_b| / sum_b |U_{b+k}|, over every b
  with 0 <= b and b+k <= n-1: of the distinct rows of the batch k after b, the share that
  batch b read too (weighted by distinct rows: a ratio of sums, not a mean of ratios).
- `in_window` share at k = sum_b |U_{b+k} ∩ (U_b ∪ ... ∪ U_{b+k-1})| / sum_b |U_{b+k}|,
  over the same b: the share that one of the k batches before it read, which is what
  Bagpipe at lookahead k keeps (1 - its fetches / its unique accesses once k batches have
  passed).
- for k = 1 .. K, K = min(the largest --lookahead, MAX_K, n - 1). The overall share sums
  every table's numerator and denominator. A table no batch b+k reads has no share (None).
- reuse factor of batch b = its accesses (samples x tables) / |U_b|; summarised over the
  full batches (each counts once; a final partial batch, whose fewer samples repeat fewer
  rows, only when it is the only batch) by its median, p10 and p90 (numpy's
  linear-interpolated percentiles) and a histogram of REUSE_BINS equal-width bins from the
  smallest to the largest.

How (one pass, streaming, `ReuseCounter.step` per batch): a ring holds an entry per
distinct row of each of the last K batches: its key, its batch, and a K-bit mask whose bit
j says the row was in the batch j+1 before it. One int32 per row points at the ring slot
of the row's latest entry (stale when that slot holds another key or a batch more than K
back). A row of batch b whose latest entry is at batch p = b - d gets the mask
`((mask_p << 1) | 1) << (d - 1)`; bit k-1 of it counts the row for `in_batch` at k (a
histogram of the masks' byte values per table gives every bit's count at once), and d <= k
for `in_window` at k. Work per batch: a few vectorised passes over U_b; memory: an int32
per row (int64 once the ring passes 2^31 slots), and 16 bytes a slot of a ring of 1 to 2
times the most distinct rows K batches in a row have had (1,024 slots at least).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.policies.trace import key_dtype

MAX_K = 64  # the largest distance k measured (a 64-bit mask per ring entry)
MIN_RING_SLOTS = 1024  # the ring's first size, at least
REUSE_BINS = 30  # bins of the reuse factor's histogram
ALL = "(all)"  # the overall row's name in the CSV tables (as skew_tables.csv)
# Bit i of every byte value v: [256, 8].
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(np.float64)


def reuse_depth(lookahead: int, batches: int) -> int:
    """K: the distances measured, min(the largest --lookahead, MAX_K, batches - 1)."""
    return max(0, min(int(lookahead), MAX_K, int(batches) - 1))


@dataclass(frozen=True)
class LookaheadReuse:
    """Per table t and distance k = 1..K (column k-1): rows = sum_b |U^t_{b+k}|, and the rows
    of those counted by `in_batch` and by `in_window` (module doc)."""

    lookahead: int  # the largest --lookahead
    depth: int  # K
    tables: list[str]
    rows: np.ndarray  # int64 [T, K]
    in_batch: np.ndarray  # int64 [T, K]
    in_window: np.ndarray  # int64 [T, K]

    @property
    def ks(self) -> list[int]:
        return list(range(1, self.depth + 1))

    def overall(self) -> dict[str, np.ndarray]:
        """rows, in_batch and in_window summed over the tables: int64 [K] each."""
        return {n: getattr(self, n).sum(axis=0) for n in ("rows", "in_batch", "in_window")}

    @staticmethod
    def share(part: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """part / rows, NaN where rows is 0."""
        return np.divide(part, rows, out=np.full(part.shape, np.nan), where=rows > 0)

    def _lines(self) -> list[tuple[str, dict[str, np.ndarray]]]:
        per_table = [(n, {k: getattr(self, k)[t] for k in ("rows", "in_batch", "in_window")})
                     for t, n in enumerate(self.tables)]
        return [(ALL, self.overall()), *per_table]

    def frame(self) -> pd.DataFrame:
        """lookahead_reuse.csv: one row per (table, k), the overall rows first."""
        parts = []
        for name, c in self._lines():
            parts.append(pd.DataFrame({
                "table": name, "k": self.ks, "rows": c["rows"], "in_batch_rows": c["in_batch"],
                "in_window_rows": c["in_window"],
                "in_batch_share": self.share(c["in_batch"], c["rows"]),
                "in_window_share": self.share(c["in_window"], c["rows"])}))
        cols = ["table", "k", "rows", "in_batch_rows", "in_window_rows", "in_batch_share",
                "in_window_share"]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)

    def to_json(self) -> dict[str, Any]:
        def entry(c: dict[str, np.ndarray]) -> dict[str, list]:
            return {"rows": c["rows"].tolist(), "in_batch_rows": c["in_batch"].tolist(),
                    "in_window_rows": c["in_window"].tolist(),
                    "in_batch_share": self.share(c["in_batch"], c["rows"]).tolist(),
                    "in_window_share": self.share(c["in_window"], c["rows"]).tolist()}

        lines = self._lines()
        return {
            "definition": "share at k = sum_b |U_{b+k} ∩ X| / sum_b |U_{b+k}| over every b "
                          "where b+k exists; in_batch: X = U_b; in_window: X = U_b ∪ ... ∪ "
                          "U_{b+k-1}; per table on its rows, overall on all",
            "lookahead": self.lookahead, "max_k": self.depth, "max_k_cap": MAX_K, "k": self.ks,
            "overall": entry(lines[0][1]),
            "tables": [{"name": n, **entry(c)} for n, c in lines[1:]],
        }


@dataclass(frozen=True)
class ReuseFactor:
    """Accesses and distinct rows of every batch: its reuse factor is their ratio."""

    accesses: np.ndarray  # int64 [batches]
    distinct_rows: np.ndarray  # int64 [batches]
    partial_last: bool  # the last batch has fewer samples than the others

    @property
    def factor(self) -> np.ndarray:
        return self.accesses / np.maximum(self.distinct_rows, 1)

    @property
    def counted(self) -> np.ndarray:
        """Whether each batch enters the summary and the histogram (module doc)."""
        c = np.ones(self.accesses.size, bool)
        if self.partial_last and c.size > 1:
            c[-1] = False
        return c

    def summary(self) -> dict[str, float]:
        f = self.factor[self.counted]
        if not f.size:
            return {k: float("nan") for k in ("median", "p10", "p90", "mean", "min", "max")}
        p10, med, p90 = np.percentile(f, [10, 50, 90])
        return {"median": float(med), "p10": float(p10), "p90": float(p90),
                "mean": float(f.mean()), "min": float(f.min()), "max": float(f.max())}

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(edges [bins + 1], batches per bin [bins])."""
        counts, edges = np.histogram(self.factor[self.counted], bins=REUSE_BINS)
        return edges, counts

    def frame(self) -> pd.DataFrame:
        """reuse_factor.csv: one row per batch."""
        return pd.DataFrame({"batch": np.arange(self.accesses.size), "accesses": self.accesses,
                             "distinct_rows": self.distinct_rows, "reuse_factor": self.factor,
                             "counted": self.counted})

    def histogram_frame(self) -> pd.DataFrame:
        """reuse_histogram.csv: one row per bin [low, high) (the last one closed)."""
        edges, counts = self.histogram()
        return pd.DataFrame({"low": edges[:-1], "high": edges[1:], "batches": counts})

    def to_json(self) -> dict[str, Any]:
        edges, counts = self.histogram()
        return {"definition": "accesses of a batch (samples x tables) / its distinct rows; "
                              "percentiles over the full batches (a final partial one only "
                              "when alone), linear interpolation",
                "batches": int(self.counted.sum()), **self.summary(),
                "histogram": {"edges": edges.tolist(), "batches": counts.tolist()}}


class ReuseCounter:
    """Streams the batches (`step(U_b, multiplicities)` in order), then `results(...)`."""

    def __init__(self, depth: int, table_starts: np.ndarray, num_rows: int):
        self.depth = k = int(depth)
        if not 0 <= k <= MAX_K:
            raise ValueError(f"depth {k} outside 0..{MAX_K}")
        self.ends = np.asarray(table_starts, np.int64)[1:]  # a key's table: searchsorted
        self.tables = t = len(table_starts)
        self.batches = 0
        self.accesses: list[int] = []
        self.distinct: list[int] = []
        self.rows_total = np.zeros(t, np.int64)  # sum_b |U^t_b|
        self.rows_head = np.zeros((k, t), np.int64)  # |U^t_b| of the first K batches
        self.in_batch = np.zeros((t, k + 1), np.int64)  # [t, k]; column 0 unused
        self.near = np.zeros((t, k + 1), np.int64)  # rows at distance d of batches b >= K
        self.in_window_head = np.zeros((t, k + 1), np.int64)  # in_window of batches b < K
        self.full = np.uint64((1 << k) - 1) if k else np.uint64(0)
        self.latest = np.zeros(num_rows if k else 0, np.int32)  # ring slot of the latest entry
        self.kdt = key_dtype(num_rows)
        self._ring(0)
        self.head = 0
        self.window: deque[int] = deque(maxlen=max(k, 1))  # |U_b| of the last K batches

    def _ring(self, cap: int) -> None:
        self.cap = cap
        self.key = np.full(cap, -1, self.kdt)
        self.batch = np.zeros(cap, np.int32)
        self.mask = np.zeros(cap, np.uint64)

    def step(self, u: np.ndarray, counts: np.ndarray) -> None:
        b, k = self.batches, self.depth
        self.accesses.append(int(np.sum(counts, dtype=np.int64)))
        self.distinct.append(int(u.size))
        t = np.searchsorted(self.ends, u, side="right")
        sizes = np.bincount(t, minlength=self.tables)
        self.rows_total += sizes
        if b < k:
            self.rows_head[b] = sizes
        if k:
            self._count(b, u, t)
        self.batches = b + 1

    def _count(self, b: int, u: np.ndarray, t: np.ndarray) -> None:
        k, width = self.depth, self.depth + 1
        new = np.zeros(u.size, np.uint64)
        if self.cap:
            slot = self.latest[u]
            ok = (self.key[slot] == u) & (self.batch[slot] >= b - k)
            s, tk = slot[ok], t[ok]
            d = b - self.batch[s].astype(np.int64)  # 1..K
            m = (((self.mask[s] << np.uint64(1)) | np.uint64(1)) << (d - 1).astype(np.uint64)) & self.full
            new[ok] = m
            near = np.bincount(tk * width + d, minlength=self.tables * width).reshape(-1, width)
            if b >= k:
                self.near += near
            else:  # only the distances k <= b have a batch b - k
                self.in_window_head[:, 1 : b + 1] += np.cumsum(near, axis=1)[:, 1 : b + 1]
            self.in_batch[:, 1:] += self._bits_per_table(m, tk)
        self._write(b, u, new)

    def _bits_per_table(self, m: np.ndarray, tk: np.ndarray) -> np.ndarray:
        """[t, j]: how many masks `m` of rows of table t have bit j set (j < K): a histogram of
        each byte's values per table, times the bits of every byte value."""
        nbytes, bins = -(-self.depth // 8), self.tables * 256
        at = m.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8)[:, :nbytes].astype(np.int64)
        at += (tk * 256)[:, None]
        at += np.arange(0, nbytes * bins, bins)
        h = np.bincount(at.ravel(), minlength=nbytes * bins).reshape(nbytes, self.tables, 256)
        bits = np.rint(h @ _BYTE_BITS)  # [byte, t, bit of the byte]; exact below 2^53
        return bits.astype(np.int64).transpose(1, 0, 2).reshape(self.tables, 8 * nbytes)[:, : self.depth]

    def _write(self, b: int, u: np.ndarray, mask: np.ndarray) -> None:
        """Add batch b's entries; the ring keeps the K - 1 batches before it."""
        self.window.append(u.size)
        need = sum(self.window)
        if need > self.cap or not self.cap:
            self._grow(need - u.size, max(2 * self.cap, need + need // 2, MIN_RING_SLOTS))
        n, head = u.size, self.head
        first = min(n, self.cap - head)  # up to the ring's end, then from its start
        for lo, hi, part in ((head, head + first, slice(0, first)), (0, n - first, slice(first, n))):
            self.key[lo:hi], self.batch[lo:hi], self.mask[lo:hi] = u[part], b, mask[part]
        at = np.arange(head, head + n)
        at[first:] -= self.cap
        self.latest[u] = at
        self.head = (head + n) % self.cap

    def _grow(self, live: int, cap: int) -> None:
        """A ring of `cap` slots holding the `live` entries before the head, in order."""
        old = (self.head - live + np.arange(live)) % self.cap if self.cap else np.zeros(0, np.int64)
        key, batch, mask = self.key[old], self.batch[old], self.mask[old]
        current = self.latest[key] == old  # entries that are their row's latest
        if cap > np.iinfo(self.latest.dtype).max:  # batches of over 2^24 accesses
            self.latest = self.latest.astype(np.int64)
        self._ring(cap)
        self.key[:live], self.batch[:live], self.mask[:live] = key, batch, mask
        self.latest[key[current]] = np.flatnonzero(current)
        self.head = live

    def results(self, lookahead: int, names: list[str], partial_last: bool
                ) -> tuple[LookaheadReuse, ReuseFactor]:
        k = self.depth
        rows = self.rows_total[:, None] - np.cumsum(self.rows_head, axis=0).T  # [T, K]
        in_window = np.cumsum(self.near, axis=1) + self.in_window_head
        reuse = LookaheadReuse(lookahead=int(lookahead), depth=k, tables=list(names),
                               rows=rows.reshape(self.tables, k),
                               in_batch=self.in_batch[:, 1:], in_window=in_window[:, 1:])
        return reuse, ReuseFactor(np.asarray(self.accesses, np.int64),
                                  np.asarray(self.distinct, np.int64), partial_last)

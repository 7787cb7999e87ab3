"""Access skew: how concentrated the embedding accesses are on few rows.

Definitions (exact):
- accesses: every (table, id) of every sample, id 0 included; rows: every id of every
  table, `R_total` = sum of the cardinalities (rows never accessed count too).
- `top_share(p)` = share of all accesses taken by the `ceil(p * R)` most-accessed rows
  (R = R_total overall, the table's cardinality per table; the ceiling is computed in
  exact rational arithmetic). Ties do not matter: only the counts enter. It is defined
  (None otherwise, "n/a" when shown) only when `p * R >= 1`: in a smaller table even its one
  most-accessed row is more than the fraction p of its rows (one of a table's two rows is
  half of it, and its share says nothing about skew).
- access CDF: fraction of rows (most-accessed first) vs fraction of accesses.
- Zipf exponent of a table: minus the least-squares slope of `log(count)` against
  `log(rank)` over every row with count > 0 (rank 1 = most accessed, one point per row).
  Rows accessed once form a plateau at the tail, which flattens the fit on small data.

Everything is computed from one count per row (`np.bincount` per table), and the sorted
counts are represented by their value histogram, so no sort of the rows is needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from bagpipe_cli.data.format import Dataset, read_rows
from bagpipe_cli.policies.trace import add_counts

TOP_FRACTIONS = (Fraction(1, 1000), Fraction(1, 100), Fraction(1, 10))  # 0.1%, 1%, 10%
COUNT_CHUNK = 1 << 23  # ids per bincount call
CDF_POINTS = 300  # log-spaced points of each stored CDF


def top_rows(fraction: Fraction, rows: int) -> int:
    """ceil(fraction * rows), exactly."""
    return math.ceil(Fraction(fraction) * rows)


def share_label(share: float | None) -> str:
    """A top share as shown: '12.3%', or 'n/a' where it is not defined."""
    return "n/a" if share is None else f"{share:.1%}"


def fraction_label(f: Fraction) -> str:
    """Fraction(1, 1000) -> '0.1%'."""
    return f"{float(f) * 100:g}%"


@dataclass(frozen=True)
class SortedCounts:
    """Per-row access counts sorted descending, as (value, number of rows) runs."""

    values: np.ndarray  # int64, strictly decreasing, all > 0
    rows: np.ndarray  # int64, rows having each value
    total_rows: int  # rows in the population (zero-count rows included)

    @classmethod
    def of(cls, counts: np.ndarray) -> SortedCounts:
        c = np.asarray(counts, dtype=np.int64)
        nz = c[c > 0]
        if nz.size == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), c.size)
        mx = int(nz.max())
        if mx <= 4 * nz.size:  # value histogram: linear time
            h = np.bincount(nz)
            v = np.flatnonzero(h)[::-1]
            return cls(v.astype(np.int64), h[v].astype(np.int64), c.size)
        v, n = np.unique(nz, return_counts=True)  # few rows with large counts: sort them
        return cls(v[::-1].astype(np.int64), n[::-1].astype(np.int64), c.size)

    @property
    def accessed_rows(self) -> int:
        return int(self.rows.sum())

    @property
    def accesses(self) -> int:
        return int((self.values * self.rows).sum())

    def top_accesses(self, k: np.ndarray | int) -> np.ndarray:
        """Accesses taken by the k most-accessed rows (vectorised over k)."""
        k = np.asarray(k, dtype=np.int64)
        cum_rows = np.cumsum(self.rows)
        cum_acc = np.cumsum(self.values * self.rows)
        if cum_rows.size == 0:
            return np.zeros(k.shape, np.int64)
        idx = np.searchsorted(cum_rows, k, side="left")  # bucket holding the k-th row
        full = idx >= cum_rows.size
        idx_c = np.minimum(idx, cum_rows.size - 1)
        rows_before = np.where(idx_c > 0, cum_rows[idx_c - 1], 0)
        acc_before = np.where(idx_c > 0, cum_acc[idx_c - 1], 0)
        part = acc_before + (k - rows_before) * self.values[idx_c]
        return np.where(full, cum_acc[-1], part)

    def top_share(self, fraction: Fraction) -> float | None:
        """Share of the accesses taken by the top `fraction` of the rows; None when there
        are fewer than 1 / fraction rows (see the module doc)."""
        if Fraction(fraction) * self.total_rows < 1:
            return None
        a = self.accesses
        return float(self.top_accesses(top_rows(fraction, self.total_rows))) / a if a else 0.0

    def cdf(self, points: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
        """(fraction of rows, fraction of accesses) at log-spaced row counts (exact values)."""
        d = self.accessed_rows
        if d == 0 or self.total_rows == 0:
            return np.zeros(0), np.zeros(0)
        ks = np.unique(np.round(np.logspace(0, math.log10(d), points)).astype(np.int64))
        ks = np.unique(np.concatenate([ks, [d]]))
        x = ks / self.total_rows
        y = self.top_accesses(ks) / self.accesses
        if d < self.total_rows:  # rows never accessed: the curve is flat up to 1
            x, y = np.append(x, 1.0), np.append(y, 1.0)
        return x, y

    def zipf_exponent(self) -> float | None:
        """Minus the least-squares slope of log(count) vs log(rank), ranks with count > 0."""
        d = self.accessed_rows
        if d < 2:
            return None
        logr = np.log(np.arange(1, d + 1, dtype=np.float64))
        csum = np.concatenate([[0.0], np.cumsum(logr)])
        ends = np.cumsum(self.rows)
        starts = ends - self.rows
        logv = np.log(self.values.astype(np.float64))
        sx, sxx = csum[-1], float(np.dot(logr, logr))
        sy = float(np.dot(self.rows, logv))
        sxy = float(np.dot(csum[ends] - csum[starts], logv))
        den = d * sxx - sx * sx
        return -(d * sxy - sx * sy) / den if den > 0 else None


@dataclass(frozen=True)
class TableSkew:
    """Skew statistics of one table."""

    name: str
    cardinality: int
    accesses: int
    accessed_rows: int  # rows with at least one access
    top_rows: dict[str, int]  # '1%' -> ceil(0.01 * cardinality)
    top_share: dict[str, float | None]  # '1%' -> share of the table's accesses (None: n/a)
    zipf_exponent: float | None
    cdf_rows: np.ndarray = field(repr=False, compare=False, default=None)
    cdf_accesses: np.ndarray = field(repr=False, compare=False, default=None)

    def to_json(self) -> dict:
        return {
            "name": self.name, "cardinality": self.cardinality, "accesses": self.accesses,
            "accessed_rows": self.accessed_rows, "top_rows": self.top_rows,
            "top_share": self.top_share, "zipf_exponent": self.zipf_exponent,
        }


@dataclass(frozen=True)
class SkewResult:
    """Skew statistics of a dataset: overall and per table."""

    embedding_rows: int  # R_total
    accesses: int
    accessed_rows: int
    top_rows: dict[str, int]
    top_share: dict[str, float | None]  # None: fewer rows than 1 / fraction
    tables: list[TableSkew]
    row_counts: np.ndarray = field(repr=False, compare=False, default=None)  # int64 [R_total]
    cdf_rows: np.ndarray = field(repr=False, compare=False, default=None)
    cdf_accesses: np.ndarray = field(repr=False, compare=False, default=None)

    def to_json(self) -> dict:
        return {
            "embedding_rows": self.embedding_rows, "accesses": self.accesses,
            "accessed_rows": self.accessed_rows, "top_rows": self.top_rows,
            "top_share": self.top_share,
            "zipf_fit": "minus the least-squares slope of log(count) vs log(rank), "
                        "one point per row with count > 0",
            "tables": [t.to_json() for t in self.tables],
        }


def access_counts(ds: Dataset, progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Accesses of every row (global key order), int64 [R_total]. `progress(accesses)`."""
    meta = ds.meta
    out = np.zeros(sum(spec.cardinality for spec in meta.tables), dtype=np.int64)
    lo_key = 0
    for t, spec in enumerate(meta.tables):  # each table counted into its slice of `out`
        col = ds.sparse(t)
        c = out[lo_key:lo_key + spec.cardinality]
        lo_key += spec.cardinality
        for lo in range(0, meta.rows, COUNT_CHUNK):
            hi = min(meta.rows, lo + COUNT_CHUNK)
            add_counts(c, read_rows(col, lo, hi))
            if progress:
                progress(hi - lo)
    return out


def skew_stats(ds: Dataset, progress: Callable[[int], None] | None = None) -> SkewResult:
    """Count every access of `ds` and summarise the skew (see the module doc)."""
    meta = ds.meta
    counts = access_counts(ds, progress)
    return skew_from_counts(counts, [t.name for t in meta.tables], meta.cardinalities)


def skew_from_counts(counts: np.ndarray, names: list[str], cardinalities: list[int]) -> SkewResult:
    """Skew statistics from per-row counts laid out table after table."""
    tables = []
    lo = 0
    for name, card in zip(names, cardinalities, strict=True):
        sc = SortedCounts.of(counts[lo : lo + card])
        lo += card
        x, y = sc.cdf()
        tables.append(TableSkew(
            name=name, cardinality=card, accesses=sc.accesses, accessed_rows=sc.accessed_rows,
            top_rows={fraction_label(f): top_rows(f, card) for f in TOP_FRACTIONS},
            top_share={fraction_label(f): sc.top_share(f) for f in TOP_FRACTIONS},
            zipf_exponent=sc.zipf_exponent(), cdf_rows=x, cdf_accesses=y,
        ))
    sc = SortedCounts.of(counts)
    x, y = sc.cdf()
    return SkewResult(
        embedding_rows=int(counts.size), accesses=sc.accesses, accessed_rows=sc.accessed_rows,
        top_rows={fraction_label(f): top_rows(f, counts.size) for f in TOP_FRACTIONS},
        top_share={fraction_label(f): sc.top_share(f) for f in TOP_FRACTIONS},
        tables=tables, row_counts=counts, cdf_rows=x, cdf_accesses=y,
    )

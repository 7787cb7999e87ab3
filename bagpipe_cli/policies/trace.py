"""The batch trace: for every global batch, the unique embedding rows it touches.

A row is identified by a *global key* `offset[t] + id`, where `offset` is the cumulative
sum of the table cardinalities (table 0 first), so keys lie in `[0, R_total)`.

Global batch `b` is samples `[b*B, (b+1)*B)` in dataset order; the last batch may be
partial (it is kept). `U_b` lists the batch's unique keys in order of *first access*,
row-major: sample by sample, and within a sample table by table. That order is what the
LRU/LFU/Belady tie rules refer to. Alongside each key the trace keeps how many times the
batch accessed it (its multiplicity), which LFU counts.

Deduplication is sort-free: a scratch array sized `R_total` receives, via
`np.minimum.at`, the first position of every key in the batch; an access is the first
one of its key iff that position is its own. Work is linear in the accesses and memory is
bounded by the rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bagpipe_cli.data.format import Dataset, DatasetMeta
from bagpipe_cli.data.format import table_offsets as format_table_offsets
from bagpipe_cli.errors import ConfigError

_INT32_MAX = 2**31 - 1
CHUNK_ACCESSES = 1 << 21  # accesses read from the dataset at a time
SPILL_ENTRIES = 1 << 25  # unique accesses a trace holds in memory before it spills to disk
READ_ENTRIES = 1 << 23  # entries of a spilled trace read back at a time by `Trace.chunks()`


class SpillDir:
    """A temporary folder removed once nothing refers to it (or at exit)."""

    def __init__(self, parent: str | Path | None = None):
        self.path = Path(tempfile.mkdtemp(prefix="bagpipe-trace-", dir=parent))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True)


class DiskArray:
    """A 1-D array stored in a file, read by slices with `pread` into fresh memory.

    Never memory-mapped, so what it read does not stay in the process's resident set.
    Supports `len()`, `a[lo:hi]` and `a[lo:hi] = values` (step 1 only).
    """

    def __init__(self, spill: SpillDir, name: str, dtype: np.dtype | type, length: int):
        self.spill, self.path = spill, spill.path / name  # holding `spill` keeps the folder
        self.dtype, self.length = np.dtype(dtype), int(length)
        if not self.path.exists():
            with open(self.path, "wb") as f:
                f.truncate(self.length * self.dtype.itemsize)

    def __len__(self) -> int:
        return self.length

    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    def head(self, n: int) -> DiskArray:
        """The first `n` entries (the same file, no copy)."""
        return DiskArray(self.spill, self.path.name, self.dtype, min(n, self.length))

    def __getitem__(self, s: slice) -> np.ndarray:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("DiskArray supports only a[lo:hi]")
        lo, hi, _ = s.indices(self.length)
        out = np.empty(max(0, hi - lo), self.dtype)
        buf, done = memoryview(out).cast("B"), 0
        with open(self.path, "rb", buffering=0) as f:
            f.seek(lo * self.dtype.itemsize)
            while done < out.nbytes:  # one read returns at most ~2 GiB
                got = f.readinto(buf[done:])
                if not got:
                    raise OSError(f"{self.path}: short read ({done} of {out.nbytes} bytes)")
                done += got
        return out

    def __setitem__(self, s: slice, values: np.ndarray) -> None:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("DiskArray supports only a[lo:hi] = values")
        lo, hi, _ = s.indices(self.length)
        v = np.ascontiguousarray(np.broadcast_to(values, (max(0, hi - lo),)), dtype=self.dtype)
        buf, done = memoryview(v).cast("B"), 0
        fd = os.open(self.path, os.O_WRONLY)
        try:
            while done < v.nbytes:
                done += os.pwrite(fd, buf[done:], lo * self.dtype.itemsize + done)
        finally:
            os.close(fd)


Column = np.ndarray | DiskArray


def add_counts(total: np.ndarray, keys: np.ndarray, weights: np.ndarray | None = None) -> None:
    """`total[k] += ` the accesses (or `weights`) of every key k in `keys`, in place; the
    bincount spans only up to the largest key, not all of `total`."""
    bc = np.bincount(keys, weights=weights)
    total[: bc.size] += bc if weights is None else bc.astype(np.int64)


def table_offsets(meta: DatasetMeta) -> np.ndarray:
    """Global key of id 0 of each table: int64 [T] (cumulative cardinalities)."""
    return format_table_offsets(meta.cardinalities)


def key_dtype(num_rows: int) -> np.dtype:
    """int32 keys while they fit, else int64."""
    return np.dtype(np.int32 if num_rows <= _INT32_MAX else np.int64)


@dataclass(frozen=True)
class Trace:
    """Per-batch unique row keys, concatenated.

    Batch `b` is `keys[offsets[b]:offsets[b+1]]` (first-access order) and
    `counts[offsets[b]:offsets[b+1]]` its multiplicities (None: 1 each, i.e. only the
    unique rows are known).
    """

    keys: Column  # int32/int64 [N]: the unique keys of every batch, batch after batch
    offsets: np.ndarray  # int64 [batches + 1]: batch boundaries in `keys`
    counts: Column | None  # int32 [N]: accesses of each key within its batch
    num_rows: int  # size of the key space (every key < num_rows)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __iter__(self) -> Iterator[np.ndarray]:
        for b in range(len(self)):
            yield self.batch(b)

    def batch(self, b: int) -> np.ndarray:
        return self.keys[self.offsets[b] : self.offsets[b + 1]]

    def batch_counts(self, b: int) -> np.ndarray:
        lo, hi = self.offsets[b], self.offsets[b + 1]
        if self.counts is None:
            return np.ones(hi - lo, dtype=np.int32)
        return self.counts[lo:hi]

    @property
    def spilled(self) -> bool:
        """True when the keys live on disk (see the module doc)."""
        return isinstance(self.keys, DiskArray)

    def chunks(self, entries: int = READ_ENTRIES) -> Iterator[tuple[int, int, np.ndarray, np.ndarray | None]]:
        """`(b0, b1, keys, counts)` for consecutive runs of whole batches [b0, b1), each of
        about `entries` unique accesses (at least one batch); counts None if unknown."""
        nb = len(self)
        if not self.spilled:  # in memory: one chunk, no copy
            if nb:
                yield 0, nb, self.keys, self.counts  # type: ignore[misc]
            return
        b0 = 0
        while b0 < nb:
            lo = int(self.offsets[b0])
            b1 = max(b0 + 1, int(np.searchsorted(self.offsets, lo + entries, side="right")) - 1)
            b1 = min(b1, nb)
            hi = int(self.offsets[b1])
            yield b0, b1, self.keys[lo:hi], None if self.counts is None else self.counts[lo:hi]
            b0 = b1

    def prefix(self, k: int) -> Trace:
        """The trace of the first `k` batches (sharing this one's storage)."""
        if k >= len(self):
            return self
        end = int(self.offsets[k])

        def head(c: Column) -> Column:
            return c.head(end) if isinstance(c, DiskArray) else c[:end]

        counts = None if self.counts is None else head(self.counts)
        return Trace(head(self.keys), self.offsets[: k + 1], counts, self.num_rows)

    @property
    def batch_sizes(self) -> np.ndarray:
        """|U_b| for every batch."""
        return np.diff(self.offsets)

    @property
    def unique_accesses(self) -> int:
        """Sum over batches of |U_b|."""
        return int(self.offsets[-1])

    @property
    def accesses(self) -> int:
        """Every (sample, table) access; equals unique_accesses when counts are unknown."""
        if self.counts is None:
            return self.unique_accesses
        return sum(int(c.sum(dtype=np.int64)) for _, _, _, c in self.chunks())  # type: ignore[union-attr]

    @property
    def max_batch_rows(self) -> int:
        """max over b of |U_b| (0 for an empty trace)."""
        return int(self.batch_sizes.max()) if len(self) else 0

    @classmethod
    def from_batches(
        cls,
        batches: Iterable[Sequence[int] | np.ndarray],
        counts: Iterable[Sequence[int] | np.ndarray] | None = None,
        num_rows: int | None = None,
    ) -> Trace:
        """Build a trace from per-batch key lists (each free of duplicates, in first-access order).

        `counts` optionally gives each key's multiplicity in its batch; `num_rows` defaults
        to the largest key + 1.
        """
        arrs = [np.asarray(b, dtype=np.int64).reshape(-1) for b in batches]
        for i, a in enumerate(arrs):
            if a.size and a.min() < 0:
                raise ValueError(f"trace batch {i}: negative row key")
            if np.unique(a).size != a.size:
                raise ValueError(f"trace batch {i}: duplicate row keys (batches must be unique)")
        keys = np.concatenate(arrs) if arrs else np.zeros(0, np.int64)
        offsets = np.zeros(len(arrs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([a.size for a in arrs])
        cnt = None
        if counts is not None:
            carrs = [np.asarray(c, dtype=np.int32).reshape(-1) for c in counts]
            if [c.size for c in carrs] != [a.size for a in arrs]:
                raise ValueError("trace counts must have one entry per key of every batch")
            cnt = np.concatenate(carrs) if carrs else np.zeros(0, np.int32)
            if cnt.size and cnt.min() < 1:
                raise ValueError("trace counts must be >= 1")
        n = int(keys.max()) + 1 if keys.size else 0
        if num_rows is None:
            num_rows = n
        elif num_rows < n:
            raise ValueError(f"num_rows {num_rows} is below the largest key + 1 ({n})")
        return cls(keys.astype(key_dtype(num_rows)), offsets, cnt, int(num_rows))


def as_trace(trace: Trace | Iterable[Sequence[int] | np.ndarray]) -> Trace:
    """Accept a Trace or a list of per-batch key arrays."""
    return trace if isinstance(trace, Trace) else Trace.from_batches(trace)


def num_batches(rows: int, batch_size: int) -> int:
    return -(-rows // batch_size)


def check_batch_size(meta: DatasetMeta, batch_size: int) -> None:
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1 (got {batch_size})")
    if batch_size > meta.rows:
        raise ConfigError(
            f"--batch-size {batch_size:,} is larger than the dataset ({meta.rows:,} samples); "
            "lower --batch-size"
        )


class _Dedup:
    """Per-batch unique keys in first-access order, with multiplicities (see module doc)."""

    def __init__(self, num_rows: int, max_batch_accesses: int):
        self.first = np.empty(num_rows, dtype=np.int32)  # scratch: contents never read unwritten
        self.pos = np.arange(max_batch_accesses, dtype=np.int32)

    def __call__(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = k.shape[0]
        pos = self.pos[:n]
        self.first[k] = n
        np.minimum.at(self.first, k, pos)
        first = self.first[k]  # position of each access's first occurrence in the batch
        is_first = first == pos
        counts = np.bincount(first, minlength=n)[is_first].astype(np.int32)
        return k[is_first], counts


def iter_batch_keys(
    ds: Dataset,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
    rows: int | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield `(U_b, multiplicities)` for every batch (the last may be partial).

    Keys have the dtype of `key_dtype(R_total)`. `progress(n)` is called with the number
    of samples read after every chunk. `rows` limits the trace to the first samples.
    """
    meta = ds.meta
    check_batch_size(meta, batch_size)
    total = meta.rows if rows is None else min(rows, meta.rows)
    offs = table_offsets(meta)
    num_rows = int(sum(meta.cardinalities))
    kdt = key_dtype(num_rows)
    t = meta.num_tables
    dedup = _Dedup(num_rows, batch_size * t)
    per_chunk = max(1, CHUNK_ACCESSES // max(1, batch_size * t))  # batches per read
    nb = num_batches(total, batch_size)
    for c0 in range(0, nb, per_chunk):
        lo = c0 * batch_size
        hi = min(total, (c0 + per_chunk) * batch_size)
        block = ds.sparse_block(lo, hi)
        block += offs  # global keys; row-major flattening = sample by sample, table by table
        flat = block.reshape(-1).astype(kdt, copy=False)
        for s in range(0, hi - lo, batch_size):
            e = min(s + batch_size, hi - lo)
            yield dedup(flat[s * t : e * t])
        if progress:
            progress(hi - lo)


def batch_trace(
    ds: Dataset,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
    rows: int | None = None,
) -> Trace:
    """The trace of `ds` (or its first `rows` samples) at `batch_size`.

    In memory (about 8 bytes per unique access) up to `SPILL_ENTRIES`, spilled beyond.
    """
    w = TraceWriter(int(sum(ds.meta.cardinalities)))
    for u, c in iter_batch_keys(ds, batch_size, progress, rows):
        w.add(u, c)
    return w.finish()


def trace_from_parts(keys: list[np.ndarray], counts: list[np.ndarray], num_rows: int) -> Trace:
    """Concatenate already-deduplicated per-batch arrays (no validation)."""
    w = TraceWriter(num_rows)
    for k, c in zip(keys, counts, strict=True):
        w.add(k, c)
    return w.finish()


class TraceWriter:
    """Builds a trace batch by batch; past `spill_entries` unique accesses it moves to disk.

    `add(U_b, counts_b)` per batch in order, then `finish()`. Memory while in memory is the
    trace itself; once spilled, one buffer of at most `spill_entries` entries.
    """

    def __init__(self, num_rows: int, spill_entries: int | None = None):
        self.num_rows = int(num_rows)
        self.kdt = key_dtype(self.num_rows)
        self.limit = SPILL_ENTRIES if spill_entries is None else int(spill_entries)
        self.sizes: list[int] = []
        self.keys: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        self.buffered = 0
        self.files: tuple[SpillDir, object, object] | None = None  # (dir, keys file, counts file)

    def add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        self.sizes.append(len(keys))
        self.keys.append(np.asarray(keys).astype(self.kdt, copy=False))
        self.counts.append(np.asarray(counts).astype(np.int32, copy=False))
        self.buffered += len(keys)
        if self.buffered > self.limit:
            self._flush()

    def _flush(self) -> None:
        if self.files is None:
            spill = SpillDir()
            self.files = (spill, open(spill.path / "keys", "wb"), open(spill.path / "counts", "wb"))
        _, kf, cf = self.files
        for part, f in ((self.keys, kf), (self.counts, cf)):
            for a in part:
                f.write(memoryview(np.ascontiguousarray(a)).cast("B"))  # type: ignore[attr-defined]
            part.clear()
        self.buffered = 0

    def finish(self) -> Trace:
        offsets = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(self.sizes)
        n = int(offsets[-1])
        if self.files is None:
            keys = np.concatenate(self.keys) if self.keys else np.zeros(0, self.kdt)
            counts = np.concatenate(self.counts) if self.counts else np.zeros(0, np.int32)
            return Trace(keys, offsets, counts, self.num_rows)
        self._flush()
        spill, kf, cf = self.files
        kf.close()  # type: ignore[attr-defined]
        cf.close()  # type: ignore[attr-defined]
        return Trace(DiskArray(spill, "keys", self.kdt, n), offsets,
                     DiskArray(spill, "counts", np.int32, n), self.num_rows)


def spill_like(trace: Trace, name: str, dtype: np.dtype | type) -> Column:
    """An array of one entry per trace position: on disk next to a spilled trace's keys,
    else in memory (uninitialised)."""
    n = trace.unique_accesses
    if isinstance(trace.keys, DiskArray):
        return DiskArray(trace.keys.spill, name, dtype, n)
    return np.empty(n, dtype=dtype)

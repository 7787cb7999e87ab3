"""`advise --scale K`: the user's log K times larger, with its tables' sizes and skew.

The scaled dataset is the log read K times over (pass c = 0..K-1, in the log's order), each
row as it is (its dense features and label), each of its ids replaced by one of K siblings
drawn at random: id x > 0 of a table becomes (x - 1) K + 1 + u, u uniform in 0..K-1; id 0
(missing) stays 0. So:

- every table has (cardinality - 1) K + 1 rows: its size times K;
- the log has K times the rows;
- a sibling of x is read, in expectation, as often as x was (K times the reads, spread over
  K siblings), so a table's access counts, sorted, are its own stretched K times: the share
  of accesses of its top p% of rows (the profile's skew) is the same.

The siblings are drawn from `seed`, so a scale is the same dataset every time. Written in
chunks, into an atomic folder: a failure leaves nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bagpipe_cli.data.format import TableSpec, open_dataset, read_rows
from bagpipe_cli.data.writer import DatasetWriter
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.atomic import atomic_dir
from bagpipe_cli.limits import check_disk, check_table_rows

CHUNK = 1 << 16
MAX_SCALE = 10_000


def scaled_tables(tables: list[TableSpec], k: int) -> list[TableSpec]:
    """The tables of the log K times larger: (cardinality - 1) K + 1 rows each."""
    return [TableSpec(t.name, (t.cardinality - 1) * k + 1) for t in tables]


def scale_ids(ids: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Each id x > 0 replaced by a random one of its K siblings (x - 1) K + 1 + u; 0 stays 0."""
    out = (ids.astype(np.int64) - 1) * k + 1 + rng.integers(0, k, size=ids.shape)
    return np.where(ids > 0, out, 0)


def write_scaled(data: str | Path, k: int, out: Path, seed: int = 0, progress=None,
                 overwrite: bool = False) -> Path:
    """Write DATA's log K times larger to `out` (see the module docstring); `progress(rows)`
    after each chunk."""
    if not 2 <= k <= MAX_SCALE:
        raise ConfigError(f"--scale {k}: give a whole number from 2 to {MAX_SCALE:,} (1: the log as it is)")
    ds = open_dataset(data)
    meta = ds.meta
    tables = scaled_tables(meta.tables, k)
    check_table_rows(f"--scale {k}", len(tables), max(t.cardinality for t in tables),
                     sum(t.cardinality for t in tables))
    per_row = sum(t.dtype.itemsize for t in tables) + 4 * meta.num_dense + 4
    check_disk(per_row * meta.rows * k, out.parent, f"--scale {k} of {data}", "give a smaller --scale")
    rng = np.random.default_rng([seed, k])
    with atomic_dir(out, overwrite) as tmp:
        w = DatasetWriter(tmp, tables, meta.dense_features, meta.label or "label")
        for _ in range(k):
            for lo in range(0, meta.rows, CHUNK):
                hi = min(meta.rows, lo + CHUNK)
                sparse = [scale_ids(read_rows(ds.sparse(t), lo, hi), k, rng).astype(tables[t].dtype)
                          for t in range(meta.num_tables)]
                labels = read_rows(ds.labels, lo, hi) if ds.labels is not None else np.zeros(hi - lo, np.float32)
                w.write(read_rows(ds.dense, lo, hi), sparse, labels)
                if progress:
                    progress(hi - lo)
        w.finish(name=f"{meta.name}-x{k}", source={"kind": "scaled", "of": str(Path(data).resolve()),
                                                   "scale": k, "seed": seed})
    return out

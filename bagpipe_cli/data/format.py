"""The dataset directory format.

A dataset is a directory holding `meta.json` and one `.npy` array per column, all of
length `rows` (row i of every array is sample i):

- `cat_000.npy` ... `cat_{T-1}.npy`: ids of each categorical table, int32 (int64 where the
  table's cardinality exceeds 2^31 - 1). Id 0 is reserved for missing/out-of-vocabulary
  values and is counted in the table's cardinality, so ids lie in [0, cardinality).
- `dense.npy`: float32 [rows, D] dense features (D may be 0).
- `labels.npy`: float32 [rows] labels in {0, 1} (absent for an unlabeled dataset).

`meta.json` holds `schema_version`, `name`, `rows`, `tables` (list of `{name,
cardinality}`), `dense_features`, `label` (column name or null), `source`, `options`,
`checksums` (sha256 of each array file's raw data, after its .npy header) and `extra`.
Arrays are plain .npy files, so `numpy.load(path, mmap_mode="r")` maps them. Contiguous
reads (`Dataset.sparse_block`, `Dataset.slice`, `read_rows`) copy the rows out and release
the mapped pages, so a pass over a dataset larger than memory keeps a bounded resident set.
This module holds the format's names and metadata and reads datasets (`open_dataset`,
`iter_batches`); `writer` writes them.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bagpipe_cli import __version__
from bagpipe_cli.data.checks import NPY_HEADER, check_arrays
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.files.records import KINDS, load_record, shown

SCHEMA_VERSION = 1
META_FILE = "meta.json"
DENSE_FILE = "dense.npy"
LABELS_FILE = "labels.npy"
_INT32_MAX = 2**31 - 1
MAX_KEYS = 2**62  # row keys (table offset + id) are int64, with room to add


def table_offsets(cardinalities: Sequence[int]) -> np.ndarray:
    """Global row key of id 0 of each table: int64 [T] (cumulative cardinalities).

    Rows of all tables share one key space, key = offset[t] + id, in [0, sum(cardinalities)).
    """
    card = np.asarray(cardinalities, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(card)[:-1]]).astype(np.int64)


def sparse_file(t: int) -> str:
    """File name of table `t`'s id array."""
    return f"cat_{t:03d}.npy"


@dataclass(frozen=True)
class TableSpec:
    """One categorical feature / embedding table."""

    name: str
    cardinality: int  # number of embedding rows, id 0 (missing/OOV) included

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int32 if self.cardinality <= _INT32_MAX else np.int64)


@dataclass
class DatasetMeta:
    """Contents of `meta.json`."""

    name: str
    rows: int
    tables: list[TableSpec]
    dense_features: list[str]
    label: str | None
    source: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    bagpipe_version: str = __version__
    schema_version: int = SCHEMA_VERSION

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def num_dense(self) -> int:
        return len(self.dense_features)

    @property
    def cardinalities(self) -> list[int]:
        return [t.cardinality for t in self.tables]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tables"] = [{"name": t.name, "cardinality": t.cardinality} for t in self.tables]
        # schema_version first: it is what a reader checks before anything else.
        return {"schema_version": d.pop("schema_version"), **d}

    @classmethod
    def from_json(cls, d: Any, where: str) -> DatasetMeta:
        """Parse and validate a meta.json object; `where` names the file in errors."""
        if not isinstance(d, dict):
            raise DataError(f"{where}: expected a JSON object")
        if "schema_version" not in d:
            raise DataError(f"{where}: no schema_version; not a bagpipe dataset")
        if d["schema_version"] != SCHEMA_VERSION:
            raise DataError(
                f"{where}: schema_version {d['schema_version']!r} is not supported by "
                f"bagpipe {__version__} (expects {SCHEMA_VERSION}); re-create the dataset "
                "with this version"
            )

        def need(key: str, typ: type | tuple[type, ...]) -> Any:
            if key not in d:
                raise DataError(f"{where}: missing field {key!r}")
            if not isinstance(d[key], typ) or isinstance(d[key], bool) and typ is int:
                raise DataError(f"{where}: field {key!r} has the wrong type ({shown(d[key])}, "
                                f"expected {'an integer' if typ is int else 'a list'})")
            return d[key]

        rows = need("rows", int)
        if rows < 0:
            raise DataError(f"{where}: rows must be >= 0")
        tables = []
        for i, t in enumerate(need("tables", list)):
            if (
                not isinstance(t, dict)
                or not isinstance(t.get("name"), str)
                or not isinstance(t.get("cardinality"), int)
                or isinstance(t["cardinality"], bool)
                or t["cardinality"] < 1
            ):
                raise DataError(f"{where}: tables[{i}] must be {{name, cardinality >= 1}}")
            if any(u.name == t["name"] for u in tables):  # a model file keys tables by name
                raise DataError(f"{where}: tables[{i}] is named {t['name']!r} like an earlier "
                                "table; each table needs its own name")
            tables.append(TableSpec(t["name"], t["cardinality"]))
        if sum(t.cardinality for t in tables) > MAX_KEYS:
            raise DataError(f"{where}: the tables' cardinalities add up to "
                            f"{sum(t.cardinality for t in tables):,} rows, more than the "
                            f"{MAX_KEYS:,} (2^62) row keys a dataset may have")
        dense = need("dense_features", list)
        if not all(isinstance(x, str) for x in dense):
            raise DataError(f"{where}: dense_features must be a list of names")
        label = d.get("label")
        if label is not None and not isinstance(label, str):
            raise DataError(f"{where}: label must be a column name or null")
        return cls(
            name=str(d.get("name", "")),
            rows=rows,
            tables=tables,
            dense_features=list(dense),
            label=label,
            **{k: _mapping(d, k, where) for k in ("source", "options", "checksums", "extra")},
            created=str(d.get("created", "")),
            bagpipe_version=str(d.get("bagpipe_version", "")),
        )


def _mapping(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """Field `key` of meta.json: a JSON object, or absent/null (empty)."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise DataError(f"{where}: field {key!r} must be a JSON object")
    return dict(v)


# --------------------------------------------------------------------------- reading


@dataclass
class Batch:
    """One batch: dense float32 [B, D], sparse int64 ids [B, T], labels float32 [B] or None."""

    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray | None
    index: int = 0  # batch number in the iteration


def read_rows(a: np.ndarray, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
    """A copy of `a[start:stop]` (into `out` if given); where `a` is a file mapping, its
    pages for those rows are then released from this process (the page cache keeps them;
    a later read maps them again), so streaming over a large file does not grow the
    resident set by the file."""
    if out is None:
        out = np.array(a[start:stop])
    else:
        out[...] = a[start:stop]
    release_rows(a, start, stop)
    return out


def release_rows(a: np.ndarray, start: int, stop: int) -> None:
    """Release the pages of rows [start, stop) of a file mapping `a` from this process."""
    mm = getattr(a, "_mmap", None)
    if mm is None or stop <= start or not isinstance(a, np.memmap) or a.base is not mm or not a.nbytes:
        return  # (an array of no bytes, such as a dataset's dense [N, 0], maps only its header)
    row = a.strides[0]
    lo = a.offset % mmap.ALLOCATIONGRANULARITY + start * row  # byte position in the mapping
    hi = min(len(mm), lo + (stop - start) * row)
    lo -= lo % mmap.PAGESIZE
    if hi > lo:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class Dataset:
    """A validated, memory-mapped dataset directory (see the module docstring)."""

    def __init__(self, path: Path, meta: DatasetMeta, arrays: dict[str, np.ndarray]):
        self.path = path
        self.meta = meta
        self._arrays = arrays

    @property
    def rows(self) -> int:
        return self.meta.rows

    @property
    def dense(self) -> np.ndarray:
        return self._arrays[DENSE_FILE]

    @property
    def labels(self) -> np.ndarray | None:
        return self._arrays.get(LABELS_FILE)

    def sparse(self, t: int) -> np.ndarray:
        """Ids of table `t` (memory-mapped, int32 or int64)."""
        return self._arrays[sparse_file(t)]

    def sparse_block(self, start: int, stop: int) -> np.ndarray:
        """Ids of rows [start, stop) of every table as int64 [n, T]."""
        out = np.empty((stop - start, self.meta.num_tables), dtype=np.int64)
        for t in range(self.meta.num_tables):
            read_rows(self.sparse(t), start, stop, out[:, t])
        return out

    def keys_block(self, start: int, stop: int, offsets: np.ndarray) -> np.ndarray:
        """Global row keys (id + its table's offset) of rows [start, stop), sample by sample:
        int64 [(stop - start) * T], read straight from the columns."""
        out = np.empty((stop - start, self.meta.num_tables), dtype=np.int64)
        for t in range(self.meta.num_tables):
            col = self.sparse(t)
            np.add(col[start:stop], offsets[t], out=out[:, t])
            release_rows(col, start, stop)
        return out.reshape(-1)

    def take(self, rows: np.ndarray, index: int = 0) -> Batch:
        """The samples at positions `rows` as a Batch."""
        sparse = np.empty((len(rows), self.meta.num_tables), dtype=np.int64)
        for t in range(self.meta.num_tables):
            sparse[:, t] = self.sparse(t)[rows]
        labels = self.labels[rows] if self.labels is not None else None
        return Batch(np.asarray(self.dense[rows]), sparse, labels, index)

    def slice(self, start: int, stop: int, index: int = 0) -> Batch:
        """Samples [start, stop) as a Batch (contiguous reads)."""
        labels = read_rows(self.labels, start, stop) if self.labels is not None else None
        return Batch(read_rows(self.dense, start, stop), self.sparse_block(start, stop), labels, index)

    def verify(self) -> None:
        """Check every array against its checksum (its values are checked on opening)."""
        for fname, digest in self.meta.checksums.items():
            a = self._arrays.get(fname)
            if a is None:
                continue
            h = hashlib.sha256()
            flat = a.reshape(-1)
            step = 1 << 22
            for i in range(0, flat.shape[0], step):
                h.update(np.ascontiguousarray(flat[i : i + step]).data.cast("B"))
            if h.hexdigest() != digest:
                raise DataError(f"{self.path / fname}: checksum mismatch; the file is corrupt")

    def check_values(self) -> None:
        """Every id within its table, every label 0 or 1, every dense value finite (`checks`)."""
        m = self.meta
        check_arrays(self.path,
                     [(sparse_file(t), self.sparse(t), s.cardinality, s.name)
                      for t, s in enumerate(m.tables)],
                     (DENSE_FILE, self.dense, m.dense_features),
                     (LABELS_FILE, self.labels) if self.labels is not None else None, release_rows)


def read_meta(path: Path) -> DatasetMeta:
    """Read and validate `path/meta.json` with a clear error for a non-dataset directory."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"dataset {path}: no such directory")
    if not path.is_dir():
        raise ConfigError(f"dataset {path}: not a directory")
    mpath = path / META_FILE
    why = _not_regular(mpath)
    if why == "missing":
        raise DataError(f"{path} is not a bagpipe dataset (no {META_FILE}); create one with "
                        "`bagpipe synth` or `bagpipe preprocess`")
    if why is not None:
        raise DataError(f"{mpath}: {why}; expected the dataset's JSON description")
    # Size and depth limited, schema_version checked (a newer one: which is needed).
    raw = load_record(mpath, replace(KINDS["dataset"], version=SCHEMA_VERSION))
    return DatasetMeta.from_json(raw, str(mpath))


def _not_regular(path: Path) -> str | None:
    """Why `path` is not a regular file to read (None: it is one)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"a broken symlink (to {os.readlink(path)})" if path.is_symlink() else "missing"
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    if stat.S_ISREG(mode):
        return None
    kind = next((k for test, k in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
                                   (stat.S_ISBLK, "a device"), (stat.S_ISFIFO, "a pipe"))
                 if test(mode)), "a socket or other special file")
    target = f" (a symlink to {os.readlink(path)})" if path.is_symlink() else ""
    return f"not a regular file: it is {kind}{target}"


def _open_array(path: Path, dtype: np.dtype, shape: tuple[int, ...],
                table: TableSpec | None = None) -> np.ndarray:
    """Map one array of a dataset, checked against meta.json (`table`: whose ids it holds)."""
    why = _not_regular(path)
    if why is not None:
        raise DataError(f"{path}: missing array file" if why == "missing" else
                        f"{path}: {why}; expected a .npy array")
    try:  # .npy only: np.load would read a file that starts as a zip archive as an .npz
        with NPY_HEADER:
            a = np.lib.format.open_memmap(path, mode="r")
    except (ValueError, OSError, SyntaxError, EOFError) as e:
        raise DataError(f"{path}: not a readable .npy array ({e})") from e
    if a.dtype != dtype:
        if table is not None and a.dtype in (np.int32, np.int64):  # the width follows the size
            raise DataError(f"{path}: {a.dtype} ids, but meta.json gives table {table.name!r} "
                            f"{table.cardinality:,} rows, whose ids are {dtype} (int64 only above "
                            f"{_INT32_MAX:,} rows): meta.json and the arrays disagree (re-create "
                            "the dataset)")
        raise DataError(f"{path}: dtype {a.dtype}, expected {dtype}")
    if a.shape != shape:
        raise DataError(f"{path}: shape {a.shape}, expected {shape} from meta.json")
    return a


def open_dataset(path: Path | str, verify: bool = False) -> Dataset:
    """Open and validate a dataset directory: its meta.json, every array's dtype and shape,
    and their values (`Dataset.check_values`); `verify` also checks the checksums."""
    path = Path(path)
    meta = read_meta(path)
    arrays: dict[str, np.ndarray] = {}
    for t, spec in enumerate(meta.tables):
        arrays[sparse_file(t)] = _open_array(path / sparse_file(t), spec.dtype, (meta.rows,), spec)
    arrays[DENSE_FILE] = _open_array(path / DENSE_FILE, np.dtype(np.float32), (meta.rows, meta.num_dense))
    if meta.label is not None:
        arrays[LABELS_FILE] = _open_array(path / LABELS_FILE, np.dtype(np.float32), (meta.rows,))
    ds = Dataset(path, meta, arrays)
    if verify:
        ds.verify()
    ds.check_values()
    return ds


def iter_batches(
    ds: Dataset,
    batch_size: int,
    start: int = 0,
    stop: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
) -> Iterator[Batch]:
    """Batches of samples [start, stop) in dataset order, or in a seeded random order.

    With `drop_last`, a final partial batch is skipped.
    """
    if batch_size < 1:
        raise ConfigError("--batch-size must be >= 1")
    stop = ds.rows if stop is None else min(stop, ds.rows)
    n = max(0, stop - start)
    order = np.random.default_rng(seed).permutation(n) + start if shuffle else None
    for b, lo in enumerate(range(0, n, batch_size)):
        hi = min(lo + batch_size, n)
        if drop_last and hi - lo < batch_size:
            return
        if order is None:
            yield ds.slice(start + lo, start + hi, b)
        else:
            yield ds.take(order[lo:hi], b)

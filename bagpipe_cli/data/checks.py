"""The values of a dataset's arrays, checked when it is opened: every id within its table's
[0, cardinality), every label 0 or 1, every dense value finite.

One pass per array, in chunks of rows: a chunk's min and max are all that is computed
(vectorised, on the mapped pages, which are released after each chunk so that a dataset
larger than memory is checked in bounded memory), and only a chunk that holds a bad value
is searched for its first bad row. The arrays are checked on a few threads (numpy releases
the GIL). An array checked in this process is not checked again while its file is
unchanged (same inode, size and modification time), so the several readers of one run
(the run's setup, --resume's checks, a bench's runs) pay for one pass.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bagpipe_cli.errors import DataError

# numpy reads an .npy header with ast.literal_eval, which CPython 3.11.7 cannot run in two
# threads at once ("SystemError: AST constructor recursion depth mismatch", python/cpython
# issue 106905): every header this package reads, it reads holding this lock.
NPY_HEADER = threading.Lock()
CHUNK_BYTES = 1 << 21  # of an array per step: its min and max then read it from the cache
Release = Callable[[np.ndarray, int, int], None]  # frees the mapped pages of rows [start, stop)

_checked: set[tuple] = set()
_lock = threading.Lock()


def _stamp(path: Path, what: tuple) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns, what)


def _chunks(a: np.ndarray, release: Release) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) of `a` in chunks of about CHUNK_BYTES; each chunk's pages are
    released once the caller is done with it."""
    row_bytes = max(1, a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)))
    step = max(1, CHUNK_BYTES // row_bytes)
    for lo in range(0, a.shape[0], step):
        hi = min(lo + step, a.shape[0])
        yield lo, a[lo:hi]
        release(a, lo, hi)


def _ids(path: Path, ids: np.ndarray, cardinality: int, table: str, release: Release) -> None:
    for lo, c in _chunks(ids, release):
        if c.size and (c.min() < 0 or c.max() >= cardinality):
            row = int(np.flatnonzero((c < 0) | (c >= cardinality))[0])
            raise DataError(f"{path}: row {lo + row}: id {int(c[row])} is outside [0, "
                            f"{cardinality}) of table {table!r} (meta.json's cardinality); the "
                            "dataset is damaged: re-create it")


def _dense(path: Path, dense: np.ndarray, names: Sequence[str], release: Release) -> None:
    for lo, c in _chunks(dense, release):
        if c.size and not (np.isfinite(c.min()) and np.isfinite(c.max())):
            row, col = (int(x[0]) for x in np.nonzero(~np.isfinite(c)))
            name = names[col] if col < len(names) else f"column {col}"
            raise DataError(f"{path}: row {lo + row}: dense feature {name!r} is {c[row, col]}, "
                            "not a finite number; the dataset is damaged: re-create it")


def _labels(path: Path, labels: np.ndarray, release: Release) -> None:
    for lo, c in _chunks(labels, release):
        bad = (c != 0) & (c != 1)  # NaN included
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(f"{path}: row {lo + row}: label {c[row]} is not 0 or 1; the dataset "
                            "is damaged: re-create it")


def check_arrays(folder: Path, ids: Sequence[tuple[str, np.ndarray, int, str]],
                 dense: tuple[str, np.ndarray, Sequence[str]] | None,
                 labels: tuple[str, np.ndarray] | None, release: Release) -> None:
    """Check a dataset's arrays (see the module docstring); the first bad value, in file
    order, is a DataError naming its file and row.

    `ids`: (file, ids, cardinality, table name) per table; `dense`: (file, array [rows, D],
    feature names); `labels`: (file, array) or None.
    """
    jobs: list[tuple[tuple | None, Callable[[], None]]] = []
    for fname, a, card, table in ids:
        p = folder / fname
        jobs.append((_stamp(p, ("ids", card)),
                     lambda p=p, a=a, card=card, table=table: _ids(p, a, card, table, release)))
    if dense is not None and dense[1].size:
        p, a, names = folder / dense[0], dense[1], dense[2]
        jobs.append((_stamp(p, ("dense",)), lambda p=p, a=a, names=names: _dense(p, a, names, release)))
    if labels is not None:
        p, a = folder / labels[0], labels[1]
        jobs.append((_stamp(p, ("labels",)), lambda p=p, a=a: _labels(p, a, release)))
    with _lock:
        todo = [(key, job) for key, job in jobs if key is None or key not in _checked]
    if not todo:
        return
    workers = max(1, min(4, os.cpu_count() or 1, len(todo)))
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(job) for _, job in todo]
        try:
            for f in futures:
                f.result()  # the first failure in file order is raised
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    with _lock:
        _checked.update(key for key, _ in todo if key is not None)


MIN_BATCHES = 10  # fewer batches than this: a profile's or a run's figures say little


def small_data_warning(what: str, batches: int, batch_size: int,
                       lookahead: int | None = None) -> str | None:
    """A warning when `what` gives fewer batches of `batch_size` than `lookahead` (when the
    lookahead matters) or than MIN_BATCHES; None when it does not."""
    short = []
    if lookahead is not None and batches < lookahead:
        short.append(f"the lookahead ({lookahead})")
    if batches < MIN_BATCHES:
        short.append(str(MIN_BATCHES))
    if not short:
        return None
    plural = "" if batches == 1 else "es"
    return (f"{what} gives {batches:,} batch{plural} of {batch_size:,}, fewer than "
            f"{' and '.join(short)}: figures from so few batches say little (a lookahead beyond "
            "the last batch sees the whole data); lower --batch-size or use more rows")

"""Writing a dataset directory (see `format` for the layout): rows streamed to .npy arrays.

`DatasetWriter` appends chunks of rows to every array, hashing the data as it goes, and
writes `meta.json` when it is finished; the row count need not be known in advance.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bagpipe_cli.data.format import (
    DENSE_FILE,
    LABELS_FILE,
    META_FILE,
    DatasetMeta,
    TableSpec,
    sparse_file,
)

_HEADER_BYTES = 128  # fixed .npy header size, so the shape can be rewritten at close


class _ArrayWriter:
    """Streams rows of a .npy array to disk, hashing the data as it goes.

    The header is written with a placeholder shape and rewritten at close, so the number
    of rows need not be known in advance.
    """

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...] = ()):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = row_shape
        self.rows = 0
        self.sha = hashlib.sha256()
        self.f = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.f.write(b"\0" * _HEADER_BYTES)

    def write(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype)
        if a.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path.name}: row shape {a.shape[1:]} != {self.row_shape}")
        if a.size:  # a zero-width chunk ([n, 0] dense) has no bytes, only rows
            buf = a.data.cast("B")
            self.sha.update(buf)
            self.f.write(buf)
        self.rows += a.shape[0]

    def close(self) -> str:
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, (self.rows, *self.row_shape)))
        self.f.close()
        return self.sha.hexdigest()

    def abort(self) -> None:
        self.f.close()


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version-1.0 .npy header padded to exactly _HEADER_BYTES."""
    d = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    text = repr(d).encode("latin1")
    pad = _HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise ValueError("array shape too long for the fixed .npy header")
    text = text + b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


class DatasetWriter:
    """Writes a dataset into an (empty, usually temporary) directory, chunk by chunk.

    Usage: `w = DatasetWriter(dir, tables, dense_features, label)`, then
    `w.write(dense, sparse, labels)` per chunk, then `w.finish(name=..., source=...)`.
    Use it inside `bagpipe_cli.files.atomic.atomic_dir` so a failure leaves nothing behind.
    """

    def __init__(
        self,
        path: Path,
        tables: Sequence[TableSpec],
        dense_features: Sequence[str],
        label: str | None,
    ):
        self.path = Path(path)
        self.tables = list(tables)
        self.dense_features = list(dense_features)
        self.label = label
        self.path.mkdir(parents=True, exist_ok=True)
        self._sparse = [
            _ArrayWriter(self.path / sparse_file(i), t.dtype) for i, t in enumerate(self.tables)
        ]
        self._dense = _ArrayWriter(
            self.path / DENSE_FILE, np.dtype(np.float32), (len(self.dense_features),)
        )
        self._labels = (
            _ArrayWriter(self.path / LABELS_FILE, np.dtype(np.float32)) if label is not None else None
        )

    @property
    def rows(self) -> int:
        return self._dense.rows

    def write(
        self,
        dense: np.ndarray,
        sparse: Sequence[np.ndarray] | np.ndarray,
        labels: np.ndarray | None,
    ) -> None:
        """Append one chunk: dense [n, D], sparse [n, T] or a list of T arrays [n], labels [n]."""
        n = dense.shape[0]
        cols = [sparse[:, t] for t in range(sparse.shape[1])] if isinstance(sparse, np.ndarray) else sparse
        if len(cols) != len(self.tables):
            raise ValueError(f"expected {len(self.tables)} sparse columns, got {len(cols)}")
        for t, (w, c) in enumerate(zip(self._sparse, cols, strict=True)):
            if len(c) != n:
                raise ValueError(f"sparse column {t} has {len(c)} rows, dense has {n}")
            w.write(c)
        self._dense.write(dense.reshape(n, len(self.dense_features)))
        if self._labels is not None:
            if labels is None or len(labels) != n:
                raise ValueError("labels missing or of the wrong length")
            self._labels.write(labels)

    def finish(self, name: str, **fields: Any) -> DatasetMeta:
        """Close the arrays and write meta.json; returns the metadata."""
        writers = [*self._sparse, self._dense] + ([self._labels] if self._labels else [])
        checksums = {w.path.name: w.close() for w in writers}
        meta = DatasetMeta(
            name=name,
            rows=self.rows,
            tables=self.tables,
            dense_features=self.dense_features,
            label=self.label,
            checksums=checksums,
            created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            **fields,
        )
        with open(self.path / META_FILE, "w") as f:
            json.dump(meta.to_json(), f, indent=2)
            f.write("\n")
        return meta

    def abort(self) -> None:
        """Close every array file (the folder is removed by its caller). A close that fails
        (a full disk flushing the last bytes) still closes its file, and the others."""
        for w in [*self._sparse, self._dense] + ([self._labels] if self._labels else []):
            with contextlib.suppress(OSError):
                w.abort()

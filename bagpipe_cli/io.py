"""Atomic outputs: everything is written to a temporary sibling and renamed into place.

A crash, an error or Ctrl-C therefore never leaves a half-written dataset, result or file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bagpipe_cli.errors import ConfigError


def check_output_dir(out: Path, overwrite: bool, option: str = "--out") -> None:
    """Refuse an existing non-empty output directory unless `overwrite` (nothing is touched)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{option} {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{option} {out} exists and is not empty; pass --overwrite to replace it")
    parent = out.resolve().parent
    if not parent.exists():
        # Creating missing parents is what a user expects of `--out a/b/c`.
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{option} {out}: cannot create parent directory: {e.strerror}") from e
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{option} {out}: directory {parent} is not writable")


@contextlib.contextmanager
def atomic_dir(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to `out`; on success it replaces `out` by rename.

    On any exception (KeyboardInterrupt included) the temporary directory is removed and
    `out` is left exactly as it was.
    """
    out = Path(out)
    check_output_dir(out, overwrite)
    parent = out.resolve().parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
        os.rename(out, old / "x")
    try:
        os.rename(tmp, out)
    except BaseException:
        if old is not None:
            os.rename(old / "x", out)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file next to `path` for writing; rename it over `path` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    """Write `obj` as indented, strict JSON (NaN and infinities become null), atomically."""
    with atomic_file(path) as f:
        json.dump(_finite(obj), f, indent=2, sort_keys=False, default=json_default, allow_nan=False)
        f.write("\n")


def _finite(o: Any) -> Any:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if hasattr(o, "item") and getattr(o, "ndim", 1) == 0:
        return _finite(o.item())
    return o


def json_default(o: Any) -> Any:
    """`json.dump`'s `default=`: numpy scalars and paths show up in configs and summaries."""
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")

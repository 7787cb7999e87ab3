"""Checked reading of the stored files: every JSON file carries a schema_version, and a
file that cannot be read raises one DataError line that names it and says what to do."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.errors import DataError

RUN_SCHEMA_VERSION = 1  # config.json, summary.json (and the columns of metrics.csv)
BENCH_SCHEMA_VERSION = 1  # bench.json, index.json


def read_json(path: Path, version: int | None) -> dict[str, Any]:
    """The JSON object in `path`, whose schema_version must be `version` (None: a file with
    no version of its own, read under another file's: environment.json under bench.json's)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise DataError(f"{path}: not valid JSON ({e}); the file is damaged") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: not a JSON object; not written by bagpipe")
    if version is None:
        return obj
    if "schema_version" not in obj:
        raise DataError(f"{path}: no schema_version; not written by bagpipe")
    v = obj["schema_version"]
    if v != version:
        raise DataError(f"{path}: schema_version {v} is not supported by this bagpipe (expects "
                        f"{version}); use the bagpipe version that wrote it, or rerun the "
                        "benchmark with this one")
    return obj


def read_csv(path: Path, columns: tuple[str, ...], numeric: bool = True) -> pd.DataFrame:
    """The table in `path`, which must hold `columns` (numbers, unless `numeric` is False)
    and end with a whole line (a file cut short mid-row is damaged, not a shorter run)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    if raw and not raw.endswith(b"\n"):
        raise DataError(f"{path}: ends in the middle of a row; the file is truncated")
    try:
        df = pd.read_csv(io.BytesIO(raw))
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a readable CSV table ({' '.join(str(e).split())}); the "
                        "file is damaged") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"{path}: lacks the columns {', '.join(missing)}; the file is damaged "
                        "or not written by bagpipe")
    if numeric:
        bad = [c for c in columns if not pd.api.types.is_numeric_dtype(df[c])]
        if bad:
            raise DataError(f"{path}: the columns {', '.join(bad)} hold values that are not "
                            "numbers; the file is damaged")
    return df

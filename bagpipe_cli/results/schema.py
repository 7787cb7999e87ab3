"""Checked reading of the stored files: every JSON file carries a schema_version, and a
file that cannot be read raises one DataError line that names it and says what to do.
JSON files are read by `bagpipe_cli.files.records.read_record`, with their kind's limits: size,
nesting depth, and the types of the keys the tool uses (a summary.json without `system`, or
whose samples_per_s is null, is damaged: `report` skips its run with a warning naming the
file and the key)."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.errors import DataError
from bagpipe_cli.files.records import KINDS, read_record

RUN_SCHEMA_VERSION = 1  # config.json, summary.json (and the columns of metrics.csv)
BENCH_SCHEMA_VERSION = 1  # bench.json, index.json


# The kind of record (`bagpipe_cli.files.records.KINDS`: its limits and keys) a file's name makes
# it; any other name (a trace written by `train --trace PATH`) is read as a trace.
KIND_OF_NAME = {"config.json": "run config", "summary.json": "run summary", "bench.json": "bench",
                "index.json": "bench index", "environment.json": "environment",
                "profile.json": "profile"}


def read_json(path: Path, version: int | None, kind: str | None = None) -> dict[str, Any]:
    """The JSON object in `path`, read with its kind's limits (`records.read_record`: size,
    depth, the types of the keys the tool uses; `kind` by default from the file's name),
    whose schema_version must be `version` (None: a file with no version of its own, read
    under another file's: environment.json under bench.json's)."""
    path = Path(path)
    k = KINDS[kind or KIND_OF_NAME.get(path.name, "trace")]
    if k.version != version:
        k = replace(k, version=version)
    return read_record(path, k)


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

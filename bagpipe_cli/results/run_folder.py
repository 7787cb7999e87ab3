"""One run folder: config.json, metrics.csv, summary.json, and as the run had them
metrics_trainers.csv, metrics_eval.csv and trace.json.

    config.json          schema_version, the run's settings (`train`, `model`, `row_dim`,
                         `dataset`, `layout`, `runner`, and `bench` in a bench) and
                         `environment` (where it ran: written here only)
    metrics.csv          one row per iteration: the columns of `engine.records.metrics.COLUMNS`
    metrics_trainers.csv with several trainer processes: each one's own rows, `trainer` first
    metrics_eval.csv     with --eval-every: one row per evaluation during training, the
                         columns of `engine.trainer.evaluation.EVAL_COLUMNS`
    summary.json         schema_version and the keys of `engine.records.metrics.SUMMARY_KEYS`
    trace.json           with --trace in a bench: the Chrome trace-event document (`train
                         --trace PATH` writes it to PATH: `write_trace`)

`write_run` writes a folder atomically; `open_run` reads one back, every file checked
(schema versions, the CSV files' columns, one row per iteration the summary counts, one
evaluation row per evaluation); `read_trace` checks a trace when it is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.engine.records.metrics import COLUMN_NAMES, CPU_KEYS
from bagpipe_cli.engine.records.trace import TRACE_VERSION
from bagpipe_cli.engine.trainer.evaluation import EVAL_COLUMNS
from bagpipe_cli.errors import DataError
from bagpipe_cli.files.atomic import atomic_dir, atomic_file, json_default, write_json
from bagpipe_cli.launch.environment import environment
from bagpipe_cli.results.schema import RUN_SCHEMA_VERSION, read_csv, read_json

CONFIG, METRICS, TRAINER_METRICS, SUMMARY = (
    "config.json", "metrics.csv", "metrics_trainers.csv", "summary.json")
EVAL_METRICS, TRACE = "metrics_eval.csv", "trace.json"
# Columns that came after schema 1's first runs: a run without them is still whole (a reader
# of the CPU columns falls back to the time ones: simulate/calibrate.py).
LATER_COLUMNS = ("stale_reads", "popular_samples", "fetch_overlap", "samples_skipped",
                 "stale_threshold", *CPU_KEYS, "compute_threads")
REQUIRED_COLUMNS = tuple(c for c in COLUMN_NAMES if c not in LATER_COLUMNS)


def write_run(out: Path, config: dict[str, Any], metrics: pd.DataFrame, summary: dict[str, Any],
              overwrite: bool = False, extra_files: dict[str, Any] | None = None,
              trainer_metrics: pd.DataFrame | None = None,
              bench: dict[str, Any] | None = None, evals: pd.DataFrame | None = None,
              trace: dict[str, Any] | None = None) -> Path:
    """Write one run folder atomically: config.json (with `bench`, the run's place in a
    bench, when given, and the environment), metrics.csv, summary.json, metrics_trainers.csv
    (each trainer process's own records) when a run had several, metrics_eval.csv (`evals`,
    the evaluations during training) and trace.json (`trace`) when given.

    `extra_files` maps file names to callables `fn(path)` that write more files into the folder.
    """
    doc = {"schema_version": RUN_SCHEMA_VERSION, **config}
    if bench is not None:
        doc["bench"] = bench
    doc["environment"] = environment()
    with atomic_dir(out, overwrite) as tmp:
        write_json(tmp / CONFIG, doc)
        metrics.to_csv(tmp / METRICS, index=False)
        if trainer_metrics is not None:
            trainer_metrics.to_csv(tmp / TRAINER_METRICS, index=False)
        if evals is not None:
            evals[list(EVAL_COLUMNS)].to_csv(tmp / EVAL_METRICS, index=False)
        if trace is not None:
            with open(tmp / TRACE, "w") as f:
                _dump_trace(f, trace)
        write_json(tmp / SUMMARY, {"schema_version": RUN_SCHEMA_VERSION, **summary})
        for name, fn in (extra_files or {}).items():
            fn(tmp / name)
    return Path(out)


def _dump_trace(f: Any, doc: dict[str, Any]) -> None:
    """A trace document as JSON, one event a line (large, so not indented)."""
    f.write('{"traceEvents": [\n')
    f.write(",\n".join(json.dumps(e, default=json_default) for e in doc["traceEvents"]))
    rest = {k: v for k, v in doc.items() if k != "traceEvents"}
    f.write("\n]" + "".join(f", {json.dumps(k)}: {json.dumps(v, default=json_default)}"
                              for k, v in rest.items()) + "}\n")


def write_trace(path: Path, doc: dict[str, Any]) -> Path:
    """Write a trace document to `path` atomically (`train --trace PATH`)."""
    with atomic_file(Path(path)) as f:
        _dump_trace(f, doc)
    return Path(path)


def read_trace(path: Path) -> dict[str, Any]:
    """A trace document written by bagpipe, checked: a JSON object with a list of trace
    events and bagpipe's trace version; DataError naming the file otherwise."""
    path = Path(path)
    doc = read_json(path, None)
    if not isinstance(doc.get("traceEvents"), list):
        raise DataError(f"{path}: not a trace-event document (no traceEvents list)")
    version = (doc.get("otherData") or {}).get("bagpipe_trace")
    if version != TRACE_VERSION:
        raise DataError(f"{path}: bagpipe trace version {version} is not supported (expects "
                        f"{TRACE_VERSION}); rerun the run with --trace")
    return doc


def trace_of(folder: Path, config: dict[str, Any]) -> Path | None:
    """Where a run's trace is: trace.json in its folder (a bench's), else the absolute
    --trace path its config names, if that file exists (None: no trace)."""
    inside = Path(folder) / TRACE
    if inside.is_file():
        return inside
    named = (config.get("train") or {}).get("trace")
    if isinstance(named, str) and Path(named).is_absolute() and Path(named).is_file():
        return Path(named)
    return None


def is_run(folder: Path) -> bool:
    """Whether `folder` holds a finished run (run folders appear only when complete)."""
    return (Path(folder) / SUMMARY).is_file()


@dataclass
class StoredRun:
    """A run folder as read back: its config (environment included), summary and metrics."""

    folder: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    metrics: pd.DataFrame
    evals: pd.DataFrame | None = None  # metrics_eval.csv, when the run evaluated during training

    @property
    def environment(self) -> dict[str, Any]:
        """Where it ran (config.json's; runs written before it moved there had it in both)."""
        return self.config.get("environment") or self.summary.get("environment") or {}


def read_config(folder: Path) -> dict[str, Any]:
    return read_json(Path(folder) / CONFIG, RUN_SCHEMA_VERSION)


# Summary figures a report computes with: each a number (or null), none below zero.
NUMBERS = ("iterations", "measured_iterations", "samples_per_s", "median_iter_ms", "p10_iter_ms",
           "p90_iter_ms", "wall_s", "rows_fetched", "rows_written_back", "cache_hits",
           "unique_rows", "final_loss", "evaluations", "time_to_target_s", "iterations_to_target")


def read_summary(folder: Path) -> dict[str, Any]:
    """summary.json, its figures checked: a damaged or wrong-typed one is named (DataError)."""
    path = Path(folder) / SUMMARY
    summary = _renamed(read_json(path, RUN_SCHEMA_VERSION))
    for key in NUMBERS:
        v = summary.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise DataError(f"{path}: {key} is {v!r}, not a number; the file is damaged, rerun "
                            "the run")
        if v < 0:
            raise DataError(f"{path}: {key} is {v}, below zero; the file is damaged, rerun the run")
    return summary


# Names a summary of an earlier version gave rank 0 ("oracle"), read as today's ("planner").
_OLD_KEYS = {"oracle_ms_per_batch": "planner_ms_per_batch"}
_OLD_ROLES = {"oracle": "planner"}


def _renamed(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` with an earlier version's names of rank 0 replaced by today's."""
    for old, new in _OLD_KEYS.items():
        if old in summary and new not in summary:
            summary[new] = summary.pop(old)
    roles = summary.get("roles")
    if isinstance(roles, dict):
        renamed = {k: new for k, new in _OLD_ROLES.items() if k in roles and new not in roles}
        summary["roles"] = {renamed.get(k, k): v for k, v in roles.items()}
    return summary


def _iterations(summary: dict[str, Any]) -> int | None:
    n = summary.get("iterations")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def read_metrics(folder: Path, summary: dict[str, Any]) -> pd.DataFrame:
    """metrics.csv, with every column and one row per iteration `summary` counts."""
    path = Path(folder) / METRICS
    m = read_csv(path, REQUIRED_COLUMNS)
    n = _iterations(summary)
    if n is not None and len(m) != n:
        raise DataError(f"{path}: {len(m)} rows, but summary.json counts {n} iterations; the "
                        "file is truncated or damaged, rerun the run")
    return m


def read_trainer_metrics(folder: Path, summary: dict[str, Any]) -> pd.DataFrame | None:
    """metrics_trainers.csv (None when the run had one trainer process), checked as
    metrics.csv is: every trainer has a row per iteration."""
    path = Path(folder) / TRAINER_METRICS
    if not path.is_file():
        return None
    t = read_csv(path, ("trainer", *REQUIRED_COLUMNS))
    n = _iterations(summary)
    trainers = t["trainer"].nunique()
    if n is not None and len(t) != n * trainers:
        raise DataError(f"{path}: {len(t)} rows, but {trainers} trainers over the "
                        f"{n} iterations summary.json counts make {n * trainers}; the file is "
                        "truncated or damaged, rerun the run")
    return t


def read_eval_metrics(folder: Path, summary: dict[str, Any]) -> pd.DataFrame | None:
    """metrics_eval.csv (None when the run did not evaluate during training), checked: its
    columns, and one row per evaluation the summary counts."""
    path = Path(folder) / EVAL_METRICS
    if not path.is_file():
        return None
    e = read_csv(path, EVAL_COLUMNS)
    n = summary.get("evaluations")
    if isinstance(n, int) and not isinstance(n, bool) and len(e) != n:
        raise DataError(f"{path}: {len(e)} rows, but summary.json counts {n} evaluations; the "
                        "file is truncated or damaged, rerun the run")
    return e


def open_run(folder: Path) -> StoredRun:
    """A run folder, read and checked; DataError (naming the file) when it cannot be read."""
    folder = Path(folder)
    config = read_config(folder)
    summary = read_summary(folder)
    return StoredRun(folder, config, summary, read_metrics(folder, summary),
                     read_eval_metrics(folder, summary))

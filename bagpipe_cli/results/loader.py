"""Reading many runs at once: run folders, bench folders or any parent of them.

A run found inside a folder that cannot be read (bad JSON, another schema_version, a
truncated metrics.csv...) is skipped and returned as a `SkippedRun` with the reason, so one
damaged run does not sink a report of the others; a run folder named directly is read or
raises, and so does a set of paths where no run is left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.results.bench_folder import read_index
from bagpipe_cli.results.run_folder import SUMMARY, StoredRun, is_run, open_run, trace_of

SKIP_DIRS = {"report", "profiles"}  # folders inside a bench that hold no runs
T = TypeVar("T")


@dataclass(frozen=True)
class SkippedRun:
    """A run that could not be read, and why (the file and what is wrong with it)."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return {"path": str(self.path), "reason": self.reason}


def _found(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    """(run folder, whether it was named itself) under `paths`, each run once."""
    found: list[tuple[Path, bool]] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"{p}: no such results folder")
        if not p.is_dir():
            raise ConfigError(f"{p}: not a folder (give a run folder, a bench folder or a parent)")
        if is_run(p):
            found.append((p, True))
            continue
        found += [(f, False) for f in _index_order(p)]  # a bench: the order its runs were made in
        for s in sorted(p.rglob(SUMMARY)):
            rel = s.parent.relative_to(p).parts
            # Temporary folders (.name.tmp-*) of an interrupted write are not runs.
            if not any(part.startswith(".") or part in SKIP_DIRS for part in rel):
                found.append((s.parent, False))
    named: dict[Path, bool] = {}
    first: dict[Path, Path] = {}
    for f, direct in found:
        key = f.resolve()
        first.setdefault(key, f)
        named[key] = named.get(key, False) or direct
    return [(first[k], named[k]) for k in first]


def _index_order(folder: Path) -> list[Path]:
    index = read_index(folder)
    rows = index.get("runs") if index is not None else None
    if not isinstance(rows, list):
        return []
    return [folder / r["path"] for r in rows
            if isinstance(r, dict) and "path" in r and is_run(folder / r["path"])]


def _runs_under(paths: tuple[Path, ...]) -> list[tuple[Path, bool]]:
    if not paths:
        raise ConfigError("give at least one results folder")
    found = _found(paths)
    if not found:
        raise DataError(f"no runs (folders with summary.json) under {', '.join(map(str, paths))}")
    return found


def find_runs(*paths: Path) -> list[Path]:
    """Run folders under `paths`: run folders themselves, bench folders, or any parent."""
    return [f for f, _ in _runs_under(paths)]


def _reason(e: DataError, folder: Path) -> str:
    """The error's message with the run's folder left out (the warning names it)."""
    msg, prefix = str(e), f"{folder}/"
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def read_runs(paths: Iterable[Path], read: Callable[[Path], T] = open_run
              ) -> tuple[list[T], list[SkippedRun]]:
    """`read(folder)` of every run under `paths` (see `find_runs`), and the runs skipped:
    those inside a given folder for which `read` raised DataError. A run folder given
    itself that cannot be read raises, and so do paths where no run is left."""
    paths = tuple(paths)
    out: list[T] = []
    skipped: list[SkippedRun] = []
    for folder, named in _runs_under(paths):
        try:
            out.append(read(folder))
        except DataError as e:
            if named:
                raise
            skipped.append(SkippedRun(folder, _reason(e, folder)))
    if not out:
        raise DataError(f"no readable runs under {', '.join(map(str, paths))}: {len(skipped)} "
                        f"skipped, the first {skipped[0]}")
    return out, skipped


def run_row(run: StoredRun) -> dict[str, Any]:
    """One flat row: config settings, dataset, bench identity, summary figures, environment."""
    config, summary, folder = run.config, run.summary, run.folder
    train = config.get("train", {})
    bench = config.get("bench") or {}
    ds = config.get("dataset", {})
    cards = ds.get("cardinalities") or []
    row: dict[str, Any] = {
        "run_id": bench.get("run_id", Path(folder).name),
        "bench": bench.get("name"),
        "repeat": int(bench.get("repeat", 1)),
        "dataset": bench.get("dataset") or ds.get("name") or Path(str(ds.get("path", ""))).name,
        "dataset_path": ds.get("path"),
        "dataset_rows": ds.get("rows"),
        "dataset_tables": len(cards),
        "embedding_rows": int(sum(cards)),
        "row_dim": config.get("row_dim"),  # floats of a stored row (emb_dim, +1 for wdl/deepfm)
        **train,
    }
    for k, v in summary.items():
        if k in ("schema_version", "environment"):
            continue
        if k == "median_time_ms" and isinstance(v, dict):
            row.update({f"median_ms_{t}": x for t, x in v.items()})
        elif k == "cache_rows":
            row["cache_rows_used"] = v  # the capacity the run had (config: as requested)
        elif k in row and row[k] != v:
            row[f"{k}_summary"] = v
        elif not isinstance(v, (dict, list)):
            row[k] = v
    row.update(contention_row(summary.get("contention")))
    row.update(memory_row(summary.get("memory")))
    devices = (config.get("layout") or {}).get("devices") or [{}]
    row["trainer_device"] = devices[0].get("device")  # where trainer 0 computed (and its GPU)
    row["trainer_gpu"] = devices[0].get("gpu")
    env = run.environment
    for k in ("torch", "cpu", "cpu_count", "torch_threads", "cuda", "git_revision", "git_dirty",
              "hostname", "bagpipe_version"):
        row[f"env_{k}"] = env.get(k)
    row["schema_version"] = summary["schema_version"]
    row["run_path"] = str(folder)
    trace = trace_of(folder, config)
    row["trace_path"] = str(trace) if trace is not None else None
    return row


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


CONTENTION_COLUMNS = ("contention_cores", "contention_load_start", "contention_load_end",
                      "contention_load_per_core", "contention_queue_wait_share",
                      "contention_loaded", "contention_note")


def contention_row(c: Any) -> dict[str, Any]:
    """summary.json's `contention` (what else ran on the machine during the run) as columns;
    every one None when the run did not record it (runs written before it) or recorded a
    value of the wrong type: unknown, not unloaded."""
    c = c if isinstance(c, dict) else {}
    load = c.get("loadavg")
    load = load if isinstance(load, list | tuple) and len(load) == 2 else (None, None)
    loaded, note = c.get("loaded"), c.get("note")
    return dict(zip(CONTENTION_COLUMNS, (
        _number(c.get("cores")), _number(load[0]), _number(load[1]),
        _number(c.get("load_per_core")), _number(c.get("run_queue_wait_share")),
        loaded if isinstance(loaded, bool) else None,
        note if isinstance(note, str) and note.strip() else None), strict=True))


def memory_row(m: Any) -> dict[str, Any]:
    """summary.json's `memory` figures as columns (None where not recorded): the run's
    estimate and measured peak, and the memory a trainer had where the run recorded it."""
    m = m if isinstance(m, dict) else {}
    return {f"memory_{k}": _number(m.get(k))
            for k in ("estimate_bytes", "peak_bytes", "machine_bytes")}


def metrics_rows(run: StoredRun) -> pd.DataFrame:
    """A run's metrics.csv with run_id, system, repeat, run_path first and `measured` last
    (False for warm-up iterations, which speed figures exclude)."""
    train = run.config.get("train", {})
    bench = run.config.get("bench") or {}
    m = run.metrics.copy()
    m.insert(0, "run_path", str(run.folder))
    m.insert(0, "repeat", int(bench.get("repeat", 1)))
    m.insert(0, "system", train.get("system", run.summary.get("system")))
    m.insert(0, "run_id", bench.get("run_id", Path(run.folder).name))
    m["measured"] = m.index >= int(train.get("warmup", 0))
    return m


def eval_rows(run: StoredRun) -> pd.DataFrame | None:
    """A run's metrics_eval.csv with run_path first (None when it has none)."""
    if run.evals is None:
        return None
    e = run.evals.copy()
    e.insert(0, "run_path", str(run.folder))
    return e


def traffic_rows(run: StoredRun) -> list[dict[str, Any]]:
    """A distributed run's bytes per iteration, one row per (role, direction, kind), from
    summary.json's `roles.<role>.traffic` (none for an older run). No rows for an in-process
    run: it counts its traffic too, but its one trainer process makes every trainer's
    requests, which is not one trainer rank's traffic (the report's table is per rank)."""
    if run.summary.get("runner") == "inproc":
        return []
    roles = run.summary.get("roles")
    out: list[dict[str, Any]] = []
    for role, figures in (roles.items() if isinstance(roles, dict) else ()):
        traffic = figures.get("traffic") if isinstance(figures, dict) else None
        if not isinstance(traffic, dict):
            continue
        for direction in ("sent", "received"):
            per = traffic.get(f"{direction}_per_iteration")
            for kind, v in (per.items() if isinstance(per, dict) else ()):
                if isinstance(v, int | float) and not isinstance(v, bool):
                    out.append({"run_path": str(run.folder), "role": role, "direction": direction,
                                "kind": kind, "bytes_per_iteration": float(v)})
    return out


@dataclass
class LoadResult:
    """Every readable run under some paths: one row per run, one per (run, iteration), one
    per (run, evaluation during training: `evals`, keyed by run_path), one per (run, role,
    direction, kind of bytes: `traffic`, distributed runs), and the runs skipped as
    unreadable."""

    runs: pd.DataFrame
    metrics: pd.DataFrame
    skipped: list[SkippedRun] = field(default_factory=list)
    evals: pd.DataFrame = field(default_factory=pd.DataFrame)
    traffic: pd.DataFrame = field(default_factory=pd.DataFrame)  # `traffic_rows` of every run


def load_runs(*paths: Path) -> LoadResult:
    """Read every run under `paths` once (see `read_runs` for what is skipped): `runs` in
    bench order, repeats as rows (see `run_row`), and their per-iteration `metrics`."""
    runs, skipped = read_runs(paths)
    table = pd.DataFrame([run_row(r) for r in runs])
    table = table.sort_values("repeat", kind="stable").reset_index(drop=True)
    metrics = pd.concat([metrics_rows(r) for r in runs], ignore_index=True)
    evals = [e for e in map(eval_rows, runs) if e is not None]
    for df in (table, metrics):
        df.attrs["skipped"] = list(skipped)
    return LoadResult(table, metrics, skipped,
                      pd.concat(evals, ignore_index=True) if evals else pd.DataFrame(),
                      pd.DataFrame([t for r in runs for t in traffic_rows(r)]))


def load_results(*paths: Path) -> pd.DataFrame:
    """One row per readable run under `paths` (`load_runs(...).runs`); the runs skipped as
    unreadable are listed in the frame's `attrs["skipped"]`."""
    return load_runs(*paths).runs


def load_metrics(*paths: Path) -> pd.DataFrame:
    """Per-iteration metrics of every readable run under `paths`, one row per (run,
    iteration) (`load_runs(...).metrics`, see `metrics_rows`); the runs skipped as
    unreadable are listed in the frame's `attrs["skipped"]`."""
    return load_runs(*paths).metrics

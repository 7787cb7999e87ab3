"""Run folders: config, environment, per-iteration metrics and a summary with a schema version.

Writing: `write_run` (one folder, atomically). Reading: `load_results(paths...)` (one row
per run, a DataFrame) and `load_metrics(paths...)` (one row per iteration); both accept
run folders, bench folders or any parent, and reject a schema_version they do not know.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.environment import environment
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.io import atomic_dir, write_json

RUN_SCHEMA_VERSION = 1


def write_run(out: Path, config: dict[str, Any], metrics: pd.DataFrame, summary: dict[str, Any],
              overwrite: bool = False, extra_files: dict[str, Any] | None = None,
              trainer_metrics: pd.DataFrame | None = None) -> Path:
    """Write one run folder atomically: config.json (with environment), metrics.csv,
    summary.json, and metrics_trainers.csv (each trainer process's own records) when a run
    had several.

    `extra_files` maps file names to callables `fn(path)` that write more files into the folder.
    """
    env = environment()
    with atomic_dir(out, overwrite) as tmp:
        write_json(tmp / "config.json", {"schema_version": RUN_SCHEMA_VERSION, **config,
                                         "environment": env})
        metrics.to_csv(tmp / "metrics.csv", index=False)
        if trainer_metrics is not None:
            trainer_metrics.to_csv(tmp / "metrics_trainers.csv", index=False)
        write_json(tmp / "summary.json", {"schema_version": RUN_SCHEMA_VERSION, **summary,
                                          "environment": env})
        for name, fn in (extra_files or {}).items():
            fn(tmp / name)
    return Path(out)


# ---------------------------------------------------------------------------------------
# Loading stored runs

SKIP_DIRS = {"report", "profiles"}  # folders inside a bench that hold no runs


def find_runs(*paths: Path) -> list[Path]:
    """Run folders under `paths`: run folders themselves, bench folders, or any parent."""
    if not paths:
        raise ConfigError("give at least one results folder")
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"{p}: no such results folder")
        if not p.is_dir():
            raise ConfigError(f"{p}: not a folder (give a run folder, a bench folder or a parent)")
        if (p / "summary.json").is_file():
            found.append(p)
            continue
        found += _index_order(p)  # a bench folder: the order its runs were made in
        for s in sorted(p.rglob("summary.json")):
            rel = s.parent.relative_to(p).parts
            # Temporary folders (.name.tmp-*) of an interrupted write are not runs.
            if any(part.startswith(".") or part in SKIP_DIRS for part in rel):
                continue
            found.append(s.parent)
    seen, out = set(), []
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    if not out:
        raise DataError(f"no runs (folders with summary.json) under {', '.join(map(str, paths))}")
    return out


def _index_order(bench: Path) -> list[Path]:
    try:
        index = json.loads((bench / "index.json").read_text())
        rows = index["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [bench / r["path"] for r in rows
            if isinstance(r, dict) and "path" in r and (bench / r["path"] / "summary.json").is_file()]


def _read_versioned(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise DataError(f"{path}: not valid JSON ({e}); the run is damaged, rerun it") from None
    if not isinstance(obj, dict) or "schema_version" not in obj:
        raise DataError(f"{path}: no schema_version; not a bagpipe run")
    v = obj["schema_version"]
    if v != RUN_SCHEMA_VERSION:
        raise DataError(f"{path}: schema_version {v} is not supported by this bagpipe (expects "
                        f"{RUN_SCHEMA_VERSION}); use the bagpipe version that wrote it, or rerun "
                        "the benchmark with this one")
    return obj


def read_run(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, summary.json) of one run folder, schema versions checked."""
    folder = Path(folder)
    return _read_versioned(folder / "config.json"), _read_versioned(folder / "summary.json")


def run_row(folder: Path, config: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """One flat row: config settings, dataset, bench identity, summary figures, environment."""
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
    env = config.get("environment") or summary.get("environment") or {}
    for k in ("torch", "cpu", "cpu_count", "torch_threads", "cuda", "git_revision", "git_dirty",
              "hostname", "bagpipe_version"):
        row[f"env_{k}"] = env.get(k)
    row["schema_version"] = summary["schema_version"]
    row["run_path"] = str(folder)
    return row


def load_results(*paths: Path) -> pd.DataFrame:
    """One row per run under `paths` (see `run_row`), in bench order, repeats as rows.

    Raises DataError for a run whose schema_version this bagpipe does not read.
    """
    rows = [run_row(f, *read_run(f)) for f in find_runs(*paths)]
    df = pd.DataFrame(rows)
    return df.sort_values("repeat", kind="stable").reset_index(drop=True)


def load_metrics(*paths: Path) -> pd.DataFrame:
    """Per-iteration metrics of every run under `paths`, one row per (run, iteration).

    Adds run_id, run_path, system, repeat and `measured` (False for warm-up iterations,
    which speed figures exclude).
    """
    parts = []
    for f in find_runs(*paths):
        config, summary = read_run(f)
        train = config.get("train", {})
        bench = config.get("bench") or {}
        try:
            m = pd.read_csv(Path(f) / "metrics.csv")
        except (OSError, ValueError) as e:
            raise DataError(f"{Path(f) / 'metrics.csv'}: cannot read: {e}") from None
        m.insert(0, "run_path", str(f))
        m.insert(0, "repeat", int(bench.get("repeat", 1)))
        m.insert(0, "system", train.get("system", summary.get("system")))
        m.insert(0, "run_id", bench.get("run_id", Path(f).name))
        m["measured"] = m.index >= int(train.get("warmup", 0))
        parts.append(m)
    return pd.concat(parts, ignore_index=True)

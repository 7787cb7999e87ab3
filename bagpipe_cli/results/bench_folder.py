"""A bench folder's own files (every one written atomically):

    bench.json         kind, schema_version, when written, the bench config as loaded and
                       the planned run ids
    environment.json   where it ran (torch, CPU/GPU, threads, git revision, dirty flag)
    index.json         kind, schema_version, run_schema_version, name, source, updated,
                       planned, completed and the runs finished so far (one row each)
    index.csv          the same rows as a table (INDEX_COLUMNS)
    runs/<run-id>/     one run folder each (`bagpipe_cli.results.run_folder`)
    profiles/<dataset>/  `bagpipe profile` of each dataset
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.files.atomic import atomic_file, write_json
from bagpipe_cli.launch.environment import environment
from bagpipe_cli.results.schema import (
    BENCH_SCHEMA_VERSION,
    RUN_SCHEMA_VERSION,
    read_csv,
    read_json,
)

BENCH, ENVIRONMENT, INDEX, INDEX_TABLE = "bench.json", "environment.json", "index.json", "index.csv"
BENCH_KIND = "bagpipe-bench"
INDEX_COLUMNS = ["run_id", "repeat", "system", "model", "dataset", "setting", "variant", "status",
                 "path", "samples_per_s", "mean_iter_ms", "median_iter_ms", "p10_iter_ms", "p90_iter_ms",
                 "final_loss", "eval_auc", "network_emulated", "wall_s", "finished"]


# The columns an index.csv must hold: benches written before `mean_iter_ms` lack it.
INDEX_REQUIRED = tuple(c for c in INDEX_COLUMNS if c != "mean_iter_ms")


def now() -> str:
    """The time stamps of bench files: UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def is_bench(out: Path) -> bool:
    return (Path(out) / BENCH).is_file()


def write_bench(out: Path, config: dict[str, Any], planned_runs: list[str]) -> None:
    """bench.json: the bench config as loaded and the run ids it plans."""
    write_json(Path(out) / BENCH, {"kind": BENCH_KIND, "schema_version": BENCH_SCHEMA_VERSION,
                                   "written": now(), "config": config,
                                   "planned_runs": planned_runs})


def write_environment(out: Path, keep: bool = False) -> None:
    """environment.json: this machine (`keep`: leave one already there, as a resumed bench does)."""
    path = Path(out) / ENVIRONMENT
    if not (keep and path.exists()):
        write_json(path, environment())


def write_index(out: Path, name: str, source: str | None, rows: list[dict[str, Any]],
                planned: int) -> None:
    """index.json and index.csv: they always list exactly the finished runs (`rows`, each
    with the INDEX_COLUMNS), of `planned`."""
    write_json(Path(out) / INDEX, {
        "kind": BENCH_KIND, "schema_version": BENCH_SCHEMA_VERSION,
        "run_schema_version": RUN_SCHEMA_VERSION, "name": name, "source": source,
        "updated": now(), "planned": planned, "completed": len(rows), "runs": rows,
    })
    with atomic_file(Path(out) / INDEX_TABLE) as f:
        pd.DataFrame(rows, columns=INDEX_COLUMNS).to_csv(f, index=False)


def read_bench_file(out: Path) -> dict[str, Any]:
    """bench.json of a bench folder, schema version checked."""
    return read_json(Path(out) / BENCH, BENCH_SCHEMA_VERSION)


def read_index(out: Path) -> dict[str, Any] | None:
    """index.json of a bench folder, schema version checked (None when there is none)."""
    path = Path(out) / INDEX
    return read_json(path, BENCH_SCHEMA_VERSION) if path.is_file() else None


@dataclass
class StoredBench:
    """A bench folder's own files as read back (the runs are read by `loader`)."""

    folder: Path
    bench: dict[str, Any]  # bench.json
    environment: dict[str, Any]  # environment.json
    index: dict[str, Any] | None  # index.json (None before the first run finished)
    table: pd.DataFrame  # index.csv (empty before the first run finished)


def open_bench(out: Path) -> StoredBench:
    """A bench folder's bench.json, environment.json, index.json and index.csv; environment.json
    and index.csv carry no version of their own: bench.json's and index.json's cover them."""
    out = Path(out)
    bench = read_bench_file(out)
    env_path = out / ENVIRONMENT
    env = read_json(env_path, None) if env_path.is_file() else {}
    index = read_index(out)
    table = read_csv(out / INDEX_TABLE, INDEX_REQUIRED, numeric=False) if index is not None \
        else pd.DataFrame(columns=INDEX_COLUMNS)
    return StoredBench(out, bench, env, index, table)

"""Stored results: the one owner of run folders and bench folders, writing and reading.

Every file is written atomically and read back checked: JSON files carry a schema_version
(1) that readers check, and a file that cannot be read raises one DataError line naming it.

- `run_folder`: one run folder (config.json, metrics.csv, metrics_trainers.csv, metrics_eval.csv,
  summary.json, trace.json): `write_run`, `open_run` -> `StoredRun`, `read_config`,
  `read_summary`, `read_metrics`, `read_trainer_metrics`, `read_eval_metrics`, `is_run`;
  `write_trace`, `read_trace`, `trace_of` (a trace anywhere: `train --trace PATH`).
- `bench_folder`: a bench folder's bench.json, environment.json, index.json and index.csv:
  `write_bench`, `write_environment`, `write_index`, `read_bench_file`, `read_index`,
  `open_bench` -> `StoredBench`, `is_bench`.
- `loader`: many runs at once from run folders, bench folders or parents: `find_runs`,
  `read_runs(paths, read)` -> (what `read` returned, [`SkippedRun`]), `load_runs` ->
  `LoadResult` (runs, metrics, evaluations, skipped), `load_results` (one row per run) and
  `load_metrics` (one row per iteration). A run inside a given folder that cannot be
  read is skipped with its reason; the library never prints, the CLI warns.
- `figures`: a configuration's speed figures over its repeats (`config_figures`): the one
  definition of its median samples/s and median iteration, which bench and report share.
"""

from bagpipe_cli.results.bench_folder import (
    BENCH_KIND,
    INDEX_COLUMNS,
    StoredBench,
    is_bench,
    open_bench,
    read_bench_file,
    read_index,
    write_bench,
    write_environment,
    write_index,
)
from bagpipe_cli.results.figures import FIGURES, config_figures
from bagpipe_cli.results.loader import (
    LoadResult,
    SkippedRun,
    find_runs,
    load_metrics,
    load_results,
    load_runs,
    read_runs,
    run_row,
)
from bagpipe_cli.results.run_folder import (
    StoredRun,
    is_run,
    open_run,
    read_config,
    read_eval_metrics,
    read_metrics,
    read_summary,
    read_trace,
    read_trainer_metrics,
    trace_of,
    write_run,
    write_trace,
)
from bagpipe_cli.results.schema import BENCH_SCHEMA_VERSION, RUN_SCHEMA_VERSION

__all__ = [
    "BENCH_KIND", "BENCH_SCHEMA_VERSION", "FIGURES", "INDEX_COLUMNS", "RUN_SCHEMA_VERSION",
    "LoadResult", "SkippedRun", "StoredBench", "StoredRun", "config_figures", "find_runs",
    "is_bench", "is_run", "load_metrics",
    "load_results", "load_runs", "open_bench", "open_run", "read_bench_file", "read_config",
    "read_eval_metrics", "read_index", "read_metrics", "read_runs", "read_summary", "read_trace",
    "read_trainer_metrics", "run_row", "trace_of", "write_bench", "write_environment",
    "write_index", "write_run", "write_trace",
]  # fmt: skip

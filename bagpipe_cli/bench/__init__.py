"""`bagpipe bench`: a matrix of training runs (systems x models x datasets x settings).

Entry points: `load_bench_config(path) -> BenchConfig` (YAML/TOML, validated; types in
`bagpipe_cli.bench.matrix`), `plan_runs(cfg) -> [PlannedRun]` (`bagpipe_cli.bench.plan`,
deduplicated by effective config), and `run_bench(cfg, out, resume, progress) ->
BenchResult` (writes the bench folder; see `bagpipe_cli.bench.runner` for its layout).
Results are read back with `bagpipe_cli.results.load_results`.
"""

from bagpipe_cli.bench.config import find_bench_file, load_bench_config, parse_bench_config
from bagpipe_cli.bench.matrix import BenchConfig, DatasetSpec, MatrixAxis, ProfileSpec
from bagpipe_cli.bench.plan import (
    SYSTEM_OWN_SETTINGS,
    PlannedRun,
    ignored_settings,
    plan_lines,
    plan_runs,
)
from bagpipe_cli.bench.runner import (
    BenchEvent,
    BenchResult,
    default_out,
    read_bench_config,
    run_bench,
)

__all__ = [
    "SYSTEM_OWN_SETTINGS", "BenchConfig", "BenchEvent", "BenchResult", "DatasetSpec",
    "MatrixAxis", "PlannedRun", "ProfileSpec", "default_out", "find_bench_file",
    "ignored_settings", "load_bench_config", "parse_bench_config", "plan_lines", "plan_runs",
    "read_bench_config", "run_bench",
]  # fmt: skip

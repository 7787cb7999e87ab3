"""`bagpipe profile`: access skew and trace-driven cache-policy simulation of a dataset.

Entry point: `run_profile(ProfileConfig(...), progress=None) -> ProfileResult`; the
result is written by `bagpipe_cli.profile.report.write_profile`. The simulators in
`bagpipe_cli.policies.simulators` are usable on their own (`simulate_bagpipe(trace, L)`,
`simulate_lru(trace, R)`, ...), with a trace built by `batch_trace(ds, batch_size)`.

Passes over the data: (1) skew: one `bincount` per table column; (2) trace: the per-batch
unique rows, streamed through the no-cache and Bagpipe simulators (state: one int per
row) and the counts of what lookahead buys (`profile/reuse.py`: one more int per row and
the last K <= 64 batches' rows). The trace is kept in memory (about 8 bytes per unique access) only when a
fixed-capacity policy (`capacity_policy_names()`) is requested, since Belady needs the future
and the default capacities need Bagpipe's peak; past `SPILL_ENTRIES` unique accesses it is
spilled to `$TMPDIR` and streamed back batch by batch (memory then stays bounded by the
rows and the caches: see `bagpipe_cli.policies.trace`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.data.checks import small_data_warning
from bagpipe_cli.data.format import open_dataset
from bagpipe_cli.engine.config import shared
from bagpipe_cli.engine.memory import DATASET_FIX, estimate_profile, refuse_over
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.atomic import path_record
from bagpipe_cli.limits import INT32_MAX, check_int
from bagpipe_cli.policies.simulators import (
    PolicyResult,
    check_capacity,
    check_lookahead,
    simulate_bagpipe,
    simulate_belady,
    simulate_fae,
    simulate_lfu,
    simulate_lru,
    simulate_none,
)
from bagpipe_cli.policies.table import capacity_policy_names, policy, policy_names
from bagpipe_cli.policies.trace import (
    SPILL_ENTRIES,
    DiskArray,
    SpillDir,
    Trace,
    batch_trace,
    check_batch_size,
    num_batches,
    table_offsets,
)
from bagpipe_cli.profile.passes import (
    BagpipeComparison,
    ProgressFn,
    TraceInfo,
    capacities,
    capacity_results,
    compare_with_optimum,
    streamed_results,
    timed,
    trace_pass,
)
from bagpipe_cli.profile.reuse import LookaheadReuse, ReuseFactor
from bagpipe_cli.profile.skew import SkewResult, skew_stats

SCHEMA_VERSION = 1
BYTES_PER_VALUE = 4  # fp32 embeddings

__all__ = [
    "SCHEMA_VERSION", "BagpipeComparison", "PolicyResult", "ProfileConfig",
    "ProfileResult", "Trace", "TraceInfo", "batch_trace", "run_profile", "simulate_bagpipe",
    "simulate_belady", "simulate_fae", "simulate_lfu", "simulate_lru", "simulate_none",
    "table_offsets", "policy_names",
]  # fmt: skip


@dataclass(frozen=True)
class ProfileConfig:
    """What `bagpipe profile` measures."""

    data: Path  # dataset directory
    batch_size: int = 4096  # global batch size B (samples per batch)
    lookaheads: tuple[int, ...] = (200,)  # Bagpipe lookaheads L to simulate
    cache_rows: tuple[int, ...] | None = None  # capacities R; None: Bagpipe's peaks, 2 max|U_b|
    policies: tuple[str, ...] = field(default_factory=policy_names)  # policies to simulate
    # embedding dimension, for bytes (fp32): train's --emb-dim, its default declared once
    dim: int = shared("emb_dim")

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", Path(self.data))
        object.__setattr__(self, "lookaheads", tuple(self.lookaheads))
        object.__setattr__(self, "policies", tuple(self.policies))
        if self.cache_rows is not None:
            object.__setattr__(self, "cache_rows", tuple(self.cache_rows))
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1 (got {self.batch_size})")
        if not self.lookaheads:
            raise ConfigError("--lookahead: give at least one value")
        for lk in self.lookaheads:
            check_lookahead(lk)
            check_int("--lookahead", lk, 1, INT32_MAX)  # batch numbers are int32
        if self.cache_rows is not None:
            if not self.cache_rows:
                raise ConfigError("--cache-rows: give at least one value")
            for r in self.cache_rows:
                check_int("--cache-rows", r, 1, INT32_MAX)
        check_int("--dim", self.dim, 1, INT32_MAX)
        if not self.policies:
            raise ConfigError("--policies: give at least one policy")
        for p in self.policies:
            policy(p)  # a known one

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["data"] = str(self.data)
        d["lookaheads"] = list(self.lookaheads)
        d["cache_rows"] = list(self.cache_rows) if self.cache_rows is not None else None
        d["policies"] = list(self.policies)
        return d


@dataclass
class ProfileResult:
    """Everything `bagpipe profile` found; `to_json()` is profile.json."""

    config: ProfileConfig
    dataset: dict[str, Any]
    trace: TraceInfo
    cache_rows: list[int]  # the capacities simulated (given or derived)
    cache_rows_source: str  # "option" or "default: ..." (how they were derived)
    skew: SkewResult
    policies: list[PolicyResult]
    bagpipe_vs_belady: list[BagpipeComparison]
    lookahead_reuse: LookaheadReuse  # what lookahead buys (`profile/reuse.py`)
    reuse_factor: ReuseFactor  # accesses per distinct row of every batch
    timing: dict[str, dict[str, float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # for the user (the CLI prints them)

    def to_json(self) -> dict[str, Any]:
        dim = self.config.dim
        cfg = self.config.to_json()
        cfg["cache_rows"] = self.cache_rows
        cfg["cache_rows_source"] = self.cache_rows_source
        cfg["bytes_per_value"] = BYTES_PER_VALUE
        return {
            "schema_version": SCHEMA_VERSION,
            "dataset": self.dataset,
            "config": cfg,
            "trace": asdict(self.trace),
            "skew": self.skew.to_json(),
            "policies": [p.to_json(dim) for p in self.policies],
            "bagpipe_vs_belady": [c.to_json() for c in self.bagpipe_vs_belady],
            "lookahead_reuse": self.lookahead_reuse.to_json(),
            "reuse_factor": self.reuse_factor.to_json(),
            "timing": self.timing,
            "warnings": self.warnings,
        }

    def policies_frame(self) -> pd.DataFrame:
        """One row per (policy, setting): the profile.csv table."""
        df = pd.DataFrame([p.to_json(self.config.dim) for p in self.policies],
                          columns=list(PolicyResult.JSON_FIELDS))
        return df.astype({"lookahead": "Int64", "cache_rows": "Int64"})


def _noop(stage: str, advance: int, total: int) -> None:
    pass


def run_profile(config: ProfileConfig, progress: ProgressFn | None = None) -> ProfileResult:
    """Profile the dataset of `config`: skew statistics and every requested policy."""
    progress = progress or _noop
    ds = open_dataset(config.data)
    meta = ds.meta
    check_batch_size(meta, config.batch_size)
    pols = [policy(p) for p in config.policies]
    admit_profile(config, meta, any(p.setting == "cache_rows" for p in pols))
    timing: dict[str, dict[str, float]] = {}
    accesses = meta.rows * meta.num_tables

    # Pass 1: skew.
    t0 = time.perf_counter()
    skew = skew_stats(ds, lambda n: progress("skew", n, accesses))
    timed(timing, "skew", t0, accesses)
    # Only fae needs the per-row counts again: they wait on disk, not in memory (8 B a row).
    row_counts = None
    if any(p.needs_row_counts for p in pols):
        row_counts = DiskArray(SpillDir(), "row_counts", np.int64, skew.row_counts.size)
        row_counts[:] = skew.row_counts
    skew = replace(skew, row_counts=None)

    # Pass 2: the trace, streamed through none and bagpipe.
    want_capacity = any(p.setting == "cache_rows" for p in pols)
    fixed = sorted({p.lookahead for p in pols if p.lookahead is not None})
    tp = trace_pass(ds, config, skew, want_capacity, fixed, progress, timing)
    cache_rows, source = capacities(config, tp)
    if want_capacity:
        big = int(np.argmax(tp.sizes))
        for r in cache_rows:
            check_capacity(r, tp.info.max_batch_unique_rows, big)

    results = streamed_results(pols, tp)
    belady_at: dict[int, PolicyResult] = {}
    results += capacity_results(pols, tp, cache_rows, row_counts, belady_at, progress, timing)
    comparisons: list[BagpipeComparison] = []
    if any(p.role == "ours" for p in pols) and any(p.role == "optimum" for p in pols):
        comparisons = compare_with_optimum(tp, belady_at, progress, timing)

    dataset = {
        **path_record(config.data), "name": meta.name, "rows": meta.rows,
        "tables": [{"name": t.name, "cardinality": t.cardinality} for t in meta.tables],
        "embedding_rows": tp.num_rows,
    }
    reads_lookahead = any(p.setting == "lookahead" for p in pols)
    warning = small_data_warning(f"dataset {config.data}", tp.info.batches, config.batch_size,
                                 max(config.lookaheads) if reads_lookahead else None)
    return ProfileResult(
        config=config, dataset=dataset, trace=tp.info, cache_rows=cache_rows if want_capacity else [],
        cache_rows_source=source if want_capacity else "unused", skew=skew, policies=results,
        bagpipe_vs_belady=comparisons, lookahead_reuse=tp.reuse, reuse_factor=tp.reuse_factor,
        timing=timing, warnings=[warning] if warning else [],
    )


def admit_profile(config: ProfileConfig, meta: Any, keeps_trace: bool) -> None:
    """Refuse a profile whose estimate (`engine/memory.py`) exceeds this machine's memory."""
    rows, b = sum(meta.cardinalities), config.batch_size
    leads = {"rows": f"profiling the {rows:,} embedding rows of {config.data}",
             "trace": f"--batch-size {b}: the trace of {num_batches(meta.rows, b):,} batches",
             "inputs": f"--batch-size {b}: a batch of {b:,} samples of {meta.num_tables} rows",
             "processes": "profile"}
    fixes = {"rows": DATASET_FIX, "trace": f"leave {', '.join(capacity_policy_names())} out of --policies",
             "inputs": "lower --batch-size", "processes": "use a machine with more memory"}
    refuse_over([estimate_profile(meta.cardinalities, meta.rows, b, keeps_trace, SPILL_ENTRIES)],
                leads.__getitem__, fixes)

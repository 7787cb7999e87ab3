"""Which clock a run's compute is taken from, and what the runs' loads were.

A run records its compute phases' wall time (`forward`, `backward`, `optimizer`) and beside
it their CPU time on the thread that runs them (`forward_cpu`, `backward_cpu`,
`optimizer_cpu`: engine/trainer/staging.py), which another process's load hardly changes:
on a shared machine one configuration's wall time varied 3x with the load. So the model
takes compute from the CPU columns where a run has them (`CPU`), and from the wall ones for a
run from before them, one that did not measure them (TorchRec's) and one whose trainers
computed on a GPU (there the CPU columns are the host's, launching kernels: the wall ones
are CUDA events) (`WALL`).

Where a run has both, its compute's wall time (the median over its measured iterations of
forward + backward + optimizer) over its CPU time (the same median of the CPU columns) is
above 1 + `NOISE`, the wall time held more than compute: the machine was loaded, or the
run's threads were oversubscribed. `gap_warning` names such runs in one line.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.engine.records.metrics import CPU_PHASES

CPU, WALL = "cpu", "wall"
# Wall over CPU time of a run's compute above 1 + NOISE: not noise. A one-thread run agrees
# within 2-3% (timer reads, the interpreter between them); torch's threads waking for a
# parallel op add some per op where a run has several.
NOISE = 0.20


def columns(clock: str) -> tuple[str, ...]:
    """The forward, backward and optimizer columns of `clock` (CPU or WALL)."""
    return tuple(f"{k}_cpu" for k in CPU_PHASES) if clock == CPU else CPU_PHASES


def clock_of(metrics: pd.DataFrame, device: str) -> str:
    """CPU where `metrics` (the measured iterations) has every CPU column measured (a
    number, not all 0) and the run computed on a CPU ("cpu", or "" unrecorded); else WALL."""
    cols = list(columns(CPU))
    if device not in ("cpu", "") or not len(metrics) or any(c not in metrics for c in cols):
        return WALL
    cpu = metrics[cols].to_numpy(dtype=float)
    return CPU if np.isfinite(cpu).all() and cpu.sum() > 0 else WALL


def compute_ms(metrics: pd.DataFrame, clock: str) -> float:
    """The median over `metrics` of forward + backward + optimizer, in `clock`'s time (ms)."""
    if not len(metrics):
        return math.nan
    return 1e3 * float(np.median(metrics[list(columns(clock))].sum(axis=1)))


def gap(wall_ms: float, cpu_ms: float | None) -> float | None:
    """Wall over CPU time of a run's compute, less 1 (None without a CPU figure)."""
    if cpu_ms is None or not cpu_ms > 0 or not math.isfinite(wall_ms):
        return None
    return wall_ms / cpu_ms - 1


def gap_warning(runs: list[Any], what: str) -> str | None:
    """One line naming the runs (each with `run_id`, `compute_wall_ms`, `compute_cpu_ms`)
    whose wall compute is more than NOISE above their CPU compute; None for none."""
    over = [r for r in runs if (g := gap(r.compute_wall_ms, r.compute_cpu_ms)) is not None
            and g > NOISE]
    if not over:
        return None
    listed = ", ".join(f"{r.run_id} (wall {r.compute_wall_ms:.2f} ms, CPU "
                       f"{r.compute_cpu_ms:.2f} ms)" for r in over)
    return (f"{what}: {len(over)} run(s) took more than {NOISE:.0%} longer in wall time than in "
            f"CPU time on their compute (the medians of forward+backward+optimizer): {listed}; "
            "the machine was loaded, or their threads oversubscribed, while they ran: their "
            "CPU time is used")


def run_load(summary: dict[str, Any]) -> dict[str, Any] | None:
    """A run's load as it recorded it (summary.json's `contention`): whether it was loaded,
    other processes' runnable tasks per core at its start, and its threads' share of
    runnable time spent waiting for a CPU; None for a run from before the record."""
    c = summary.get("contention")
    if not isinstance(c, dict):
        return None
    return {k: c.get(k) for k in ("loaded", "load_per_core", "run_queue_wait_share")}


def clock_fields(metrics: pd.DataFrame, summary: dict[str, Any], device: str) -> dict[str, Any]:
    """A MeasuredRun's clock fields from its measured iterations, summary and device:
    compute_clock (`clock_of`), its compute's wall and CPU time (`compute_ms`; CPU None where
    the clock is WALL), its forward + backward's wall ms (how loaded it ran) and its load."""
    clock = clock_of(metrics, device)
    fb = metrics["forward"] + metrics["backward"]
    return {"compute_clock": clock, "compute_wall_ms": compute_ms(metrics, WALL),
            "compute_cpu_ms": compute_ms(metrics, CPU) if clock == CPU else None,
            "wall_fwd_bwd_ms": 1e3 * float(np.median(fb)) if len(fb) else 0.0,
            "load": run_load(summary)}


def clock_counts(runs: list[Any]) -> dict[str, int]:
    """How many of `runs` (each with `compute_clock`) took compute from each clock."""
    return {c: sum(r.compute_clock == c for r in runs) for c in (CPU, WALL)}


def clock_record(runs: list[Any], what: str) -> dict[str, Any]:
    """What `simulate.json`'s `compute_source` says of the runs (MeasuredRun) compute came
    from: `compute_clock` (how many from each clock), `runs_load` (each run's id, clock,
    wall and CPU compute, and recorded load: `run_load`; loaded None: not recorded),
    `loaded_runs` (how many ran loaded) and `warnings` (`gap_warning`'s line, if any)."""
    warning = gap_warning(runs, what)
    return {"compute_clock": clock_counts(runs),
            "runs_load": [{"run_id": r.run_id, "compute_clock": r.compute_clock,
                           "compute_wall_ms": r.compute_wall_ms,
                           "compute_cpu_ms": r.compute_cpu_ms,
                           **(r.load or {"loaded": None})} for r in runs],
            "loaded_runs": sum(bool((r.load or {}).get("loaded")) for r in runs),
            "warnings": [warning] if warning else []}

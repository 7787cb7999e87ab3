"""`bagpipe simulate --validate RESULTS`: the model's prediction of every stored run against
its measured median iteration time.

For each run: the trace is rebuilt from the run's dataset and settings (batch size,
iterations, lookahead, round, cache rows, staleness, trainers, servers), compute is
calibrated from the same run's non-communication timers (`calibrate.compute_of`), the
network from its config, and the prediction's median iteration time is compared with the
measured `median_iter_ms`.

For every distributed run that counted its traffic, the plan bytes rank 0 sent per
iteration (`roles.oracle.traffic.sent_per_iteration.plan`) are checked against the model's
(`simulate/plans.py`) too, within `BYTES_TOLERANCE`. In-process runs have no rank 0 link,
and runs from before the count have nothing to compare: they are skipped for that check
(`plan_check` says why).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bagpipe_cli.errors import DataError
from bagpipe_cli.results import SkippedRun
from bagpipe_cli.simulate.calibrate import MeasuredRun, read_measured_runs
from bagpipe_cli.simulate.inputs import Volumes
from bagpipe_cli.simulate.model import SYSTEMS, Prediction, predict
from bagpipe_cli.simulate.volumes import trace_volumes

TOLERANCE = 0.20  # |predicted / measured - 1| within which a run passes
BYTES_TOLERANCE = 0.10  # |predicted / counted - 1| of rank 0's plan bytes per iteration


@dataclass
class ValidationRow:
    run: MeasuredRun
    prediction: Prediction

    @property
    def plan_check(self) -> str:
        """Whether rank 0's bytes are checked: "checked", or why not."""
        if self.run.trace.runtime != "distributed":
            return "in-process run: no rank 0 link"
        if self.run.counted_plan_bytes is None:
            return "not counted (a result from before rank 0 counted its traffic)"
        return "checked"

    @property
    def predicted_plan_bytes(self) -> float:
        return 1e6 * self.prediction.oracle_mb_per_iter

    @property
    def plan_error(self) -> float:
        """predicted / counted - 1 (rank 0's plan bytes per iteration); NaN where unchecked."""
        c = self.run.counted_plan_bytes
        if self.plan_check != "checked" or not c:
            return math.nan
        return self.predicted_plan_bytes / c - 1

    @property
    def plan_ok(self) -> bool | None:
        """Within BYTES_TOLERANCE; None where unchecked."""
        if self.plan_check != "checked":
            return None
        return abs(self.plan_error) <= BYTES_TOLERANCE

    @property
    def error(self) -> float:
        """predicted / measured - 1 (median iteration times)."""
        m = self.run.measured_median_ms
        return self.prediction.median_ms / m - 1 if m > 0 else math.nan

    @property
    def ok(self) -> bool:
        return abs(self.error) <= TOLERANCE

    def to_dict(self) -> dict:
        r, p = self.run, self.prediction
        return {
            "run_id": r.run_id, "system": r.system, "setting": r.setting,
            "compute_ms": r.compute.total_ms, "predicted_ms": p.median_ms,
            "measured_ms": r.measured_median_ms, "error": self.error, "ok": self.ok,
            "predicted_mean_ms": p.mean_ms, "measured_mean_ms": r.measured_mean_ms,
            "exposed_fetch_ms": p.exposed_fetch_ms, "exposed_sync_ms": p.exposed_sync_ms,
            "oracle_ms_per_iter": p.oracle_ms_per_iter, "exposed_plan_ms": p.exposed_plan_ms,
            "predicted_plan_bytes": self.predicted_plan_bytes,
            "counted_plan_bytes": r.counted_plan_bytes, "plan_error": self.plan_error,
            "plan_ok": self.plan_ok, "plan_check": self.plan_check,
            "run_path": str(r.path),
        }


@dataclass
class ValidationResult:
    """One row per readable run, the runs skipped as unreadable, and how many runs of each
    system the model has no traffic of were left out."""

    rows: list[ValidationRow]
    skipped: list[SkippedRun] = field(default_factory=list)
    unmodelled: dict[str, int] = field(default_factory=dict)  # runs left out, by system


def validate(*paths: Path, progress: Callable[[int, int, str], None] | None = None
             ) -> ValidationResult:
    """Predict every readable run under `paths` from its own trace and calibration (runs
    that cannot be read are skipped: `results.read_runs`, and so are runs of a system the
    model has no traffic of: `SYSTEMS` lacks it)."""
    runs, skipped = read_measured_runs(*paths)
    unmodelled = Counter(r.system for r in runs if r.system not in SYSTEMS)
    runs = [r for r in runs if r.system in SYSTEMS]
    cache: dict[tuple, Volumes] = {}
    out = []
    for i, run in enumerate(runs):
        if progress:
            progress(i, len(runs), run.run_id)
        key = (run.trace, run.system)
        if key not in cache:
            if not Path(run.trace.data).is_dir():
                raise DataError(f"{run.path}: its dataset {run.trace.data} is gone; regenerate it "
                                "(bagpipe bench does) or validate runs whose dataset exists")
            vols, _ = trace_volumes(run.trace, [run.system])
            cache[key] = vols[run.system]
        pred = predict(cache[key], run.cluster, run.workload, run.compute)
        out.append(ValidationRow(run, pred))
    return ValidationResult(out, skipped, dict(unmodelled))


def validation_frame(rows: list[ValidationRow]) -> pd.DataFrame:
    return pd.DataFrame([r.to_dict() for r in rows])

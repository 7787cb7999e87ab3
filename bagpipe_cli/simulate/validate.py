"""`bagpipe simulate --validate RESULTS`: the model's prediction of every stored run against
its measured median iteration time.

For each run: the trace is rebuilt from the run's dataset and settings (batch size,
iterations, lookahead, round, cache rows, staleness, trainers, servers), compute is
calibrated from the same run's non-communication timers (`calibrate.compute_of`: forward,
backward and optimizer in CPU time where the run has it, `cpu_time`), the network from its
config, and the prediction's median iteration time is compared with the
measured `median_iter_ms`. A run's label (`setting`) has its network, trainers, servers and
batch, and every other setting that differs among the runs validated (`setting_labels`).

For every distributed run that counted its traffic, three byte counts per iteration are
checked against the model's too, each within `BYTES_TOLERANCE` (`BYTE_CHECKS`):
- `plan`: the plans rank 0 sent (`roles.oracle.traffic.sent_per_iteration.plan`;
  `simulate/plans.py`);
- `rows`: the rows (with their optimizer state) the servers sent (`roles.server*`);
- `collective`: each trainer's collective bytes (`roles.trainer*`; the worst trainer's
  error is the run's), where there are 2 trainers or more.
In-process runs count none of these, and runs from before the count have nothing to compare:
they are skipped for that check (`check` says why).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.bench.plan import SHORT, ignored_settings, value_label
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.registry import SYSTEMS as REGISTRY
from bagpipe_cli.errors import DataError
from bagpipe_cli.results import SkippedRun
from bagpipe_cli.simulate.calibrate import MeasuredRun, read_measured_runs
from bagpipe_cli.simulate.compare import TextTable
from bagpipe_cli.simulate.cpu_time import WALL, clock_counts, gap_warning
from bagpipe_cli.simulate.inputs import Volumes
from bagpipe_cli.simulate.model import SYSTEMS, Prediction, predict
from bagpipe_cli.simulate.volumes import trace_volumes

TOLERANCE = 0.20  # |predicted / measured - 1| within which a run passes
BYTES_TOLERANCE = 0.10  # |predicted / counted - 1| of a byte count per iteration


BYTE_CHECKS = ("plan", "rows", "collective")  # see the module docstring


@dataclass
class ByteCheck:
    """One byte count per iteration, predicted and counted (None: not checked, `why`)."""

    predicted: float = math.nan
    counted: float | None = None
    why: str = "checked"

    @property
    def error(self) -> float:
        """predicted / counted - 1; NaN where unchecked."""
        if self.counted is None or not self.counted:
            return math.nan
        return self.predicted / self.counted - 1

    @property
    def ok(self) -> bool | None:
        """Within BYTES_TOLERANCE; None where unchecked."""
        return None if self.counted is None else abs(self.error) <= BYTES_TOLERANCE


@dataclass
class ValidationRow:
    run: MeasuredRun
    prediction: Prediction
    setting: str = ""  # the run's label among the runs validated (`setting_labels`)

    def check(self, kind: str) -> ByteCheck:
        """`kind` (of BYTE_CHECKS) predicted against what the run counted."""
        r, p = self.run, self.prediction
        if r.trace.runtime != "distributed":
            return ByteCheck(why="in-process run: its links are emulated, not counted")
        if kind == "plan":
            got, pred = r.counted_plan_bytes, 1e6 * p.planner_mb_per_iter
        elif kind == "rows":
            got, pred = r.counted_server_rows, 1e6 * p.server_rows_mb_per_iter
        elif r.cluster.trainers < 2:
            return ByteCheck(why="one trainer: no collectives")
        elif r.counted_collective is None:
            got, pred = None, math.nan
        else:  # the trainer the model is furthest off for
            pairs = list(zip(p.trainer_collective_bytes, r.counted_collective, strict=True))
            pred, got = max(pairs, key=lambda x: abs(x[0] / x[1] - 1) if x[1] else math.inf)
        if got is None:
            return ByteCheck(why="not counted (a result from before the run counted its traffic)")
        return ByteCheck(float(pred), got)

    @property
    def plan_check(self) -> str:
        """Whether rank 0's bytes are checked: "checked", or why not."""
        return self.check("plan").why

    @property
    def plan_ok(self) -> bool | None:
        return self.check("plan").ok

    @property
    def bytes_ok(self) -> bool | None:
        """Every checked byte count within BYTES_TOLERANCE; None where none is checked."""
        oks = [c.ok for c in map(self.check, BYTE_CHECKS) if c.ok is not None]
        return all(oks) if oks else None

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
        d = {
            "run_id": r.run_id, "system": r.system, "setting": self.setting,
            "compute_ms": r.compute.total_ms, "predicted_ms": p.median_ms,
            "measured_ms": r.measured_median_ms, "error": self.error, "ok": self.ok,
            "predicted_mean_ms": p.mean_ms, "measured_mean_ms": r.measured_mean_ms,
            "exposed_fetch_ms": p.exposed_fetch_ms, "exposed_sync_ms": p.exposed_sync_ms,
            "planner_ms_per_iter": p.planner_ms_per_iter, "exposed_plan_ms": p.exposed_plan_ms,
            "compute_clock": r.compute_clock, "compute_wall_ms": r.compute_wall_ms,
            "compute_cpu_ms": r.compute_cpu_ms, "loaded": (r.load or {}).get("loaded"),
        }
        for kind in BYTE_CHECKS:
            c = self.check(kind)
            d |= {f"predicted_{kind}_bytes": c.predicted, f"counted_{kind}_bytes": c.counted,
                  f"{kind}_error": c.error, f"{kind}_ok": c.ok, f"{kind}_check": c.why}
        return d | {"run_path": str(r.path)}


@dataclass
class ValidationResult:
    """One row per readable run, the runs skipped as unreadable, and how many runs of each
    system the model has no traffic of were left out."""

    rows: list[ValidationRow]
    skipped: list[SkippedRun] = field(default_factory=list)
    unmodelled: dict[str, int] = field(default_factory=dict)  # runs left out, by system


# What a run's label leaves out: its system (a column of its own) and its checkpoints.
_UNLABELLED = {"system", *(f.name for f in fields(TrainConfig) if f.metadata["section"] == "checkpoints")}


def setting_labels(settings: list[dict[str, Any]]) -> list[str]:
    """A label per run, from its train settings (`MeasuredRun.settings`): always its lookahead
    (a system planned in rounds), staleness (a system that reads it), network, trainers (N),
    servers (K), batch (B) and runtime; then every other setting whose value differs among
    `settings` (a system's own setting only where the run's system reads it), so that two
    runs configured apart never share a label: "L16 no-net N1K1 B512 R=default"."""
    shown = [_shown(s) for s in settings]
    values: dict[str, set[str]] = {}
    for sh in shown:
        for k, v in sh.items():
            values.setdefault(k, set()).add(v)
    out = []
    for s, sh in zip(settings, shown, strict=True):
        base, keys = _base_label(s)
        out.append(" ".join([base, *(v for k, v in sh.items() if k not in keys and len(values[k]) > 1)]))
    return out


def _shown(s: dict[str, Any]) -> dict[str, str]:
    """Each setting of a run as its label shows it (`L16`, `opt=adagrad`, `R=default`,
    `data=NAME`), less those its system does not read."""
    ignored = ignored_settings(s.get("system", ""), s.get("cache_rows"))
    return {k: _text(k, v) for k, v in s.items() if k not in _UNLABELLED and k not in ignored}


def _text(name: str, v: Any) -> str:
    if name == "data":
        return f"data={Path(str(v)).name}"
    return f"{SHORT.get(name, name)}=default" if v is None else value_label(name, v)


def _base_label(s: dict[str, Any]) -> tuple[str, set[str]]:
    """The part of a run's label every run has, and the settings it shows."""
    spec, parts, keys = REGISTRY.get(s.get("system", "")), [], set()
    if spec is not None and spec.rounds:
        parts.append(f"L{s.get('lookahead')}")
        keys.add("lookahead")
    if spec is not None and "staleness" in spec.reads:
        parts.append(f"s{s.get('staleness', 0)}")
        keys.add("staleness")
    if s.get("net_gbps") or s.get("net_latency_us"):
        parts.append(f"{s.get('net_gbps') or 'inf'}G/{s.get('net_latency_us') or 0:g}us")
    else:
        parts.append("no-net")
    parts.append(f"N{s.get('trainers', 1)}K{s.get('servers', 1)} B{s.get('batch_size')}")
    if s.get("transport") == "torch":
        parts.append("procs" + (" shaped" if s.get("net_shape") else ""))
    # (the ranks a run starts itself, --procs, follow from N and K)
    keys |= {"net_gbps", "net_latency_us", "trainers", "servers", "batch_size", "transport",
             "net_shape", "procs"}
    return " ".join(parts), keys


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
    labels = setting_labels([r.settings for r in runs])
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
        out.append(ValidationRow(run, pred, labels[i]))
    return ValidationResult(out, skipped, dict(unmodelled))


def validation_frame(rows: list[ValidationRow]) -> pd.DataFrame:
    return pd.DataFrame([r.to_dict() for r in rows])


BYTE_CHECK_NAMES = {"plan": "rank 0's plan bytes", "rows": "the servers' row bytes",
                    "collective": "each trainer's collective bytes"}  # of BYTE_CHECKS, in words


def validation_table(rows: list[ValidationRow]) -> TextTable:
    """Each run's predicted and measured time and its byte counts' errors; a cell outside its
    tolerance says "OUT" (at its end), an unchecked byte count "-"."""
    title = (f"model vs measured median iteration time ({len(rows)} runs; within "
             f"±{TOLERANCE:.0%} passes) and counted bytes (±{BYTES_TOLERANCE:.0%})")
    caption = ("ms per iteration; compute: calibrated from the run's own timers (CPU time where "
               "it has it); bytes per "
               "iteration, predicted / counted - 1: rank 0's plans, the servers' rows, the "
               "trainers' collectives (the worst trainer's); -: not counted")
    columns = ["system", "setting", "compute", "predicted", "measured", "error", "",
               "rank 0", "rows", "collective"]
    table = TextTable(title, caption, columns, left=("system", "setting"))
    for r in rows:
        d = r.to_dict()
        marks = []
        for kind in BYTE_CHECKS:
            c = r.check(kind)
            marks.append("-" if c.ok is None else f"{100 * c.error:+.1f}%" + ("" if c.ok else " OUT"))
        table.rows.append([d["system"], d["setting"], f"{d['compute_ms']:.2f}",
                           f"{d['predicted_ms']:.2f}", f"{d['measured_ms']:.2f}",
                           f"{100 * d['error']:+.1f}%", "ok" if r.ok else "OUT", *marks])
    return table


def summary_lines(rows: list[ValidationRow]) -> list[str]:
    """The tallies under the table: runs within TOLERANCE (in all and by system) and how many
    of them ran loaded, the clock their compute came from, each byte count's runs within
    BYTES_TOLERANCE and why the others were not checked, the emulated-network runs whose
    fetch CPU had no no-network twin to come from, and a warning naming the runs whose wall
    and CPU compute disagree beyond noise (`cpu_time.gap_warning`)."""
    by_sys: dict[str, list[bool]] = {}
    for r in rows:
        by_sys.setdefault(r.run.system, []).append(r.ok)
    runs = [r.run for r in rows]
    lines = [f"{sum(r.ok for r in rows)} of {len(rows)} runs within ±{TOLERANCE:.0%}; by system: "
             + ", ".join(f"{s} {sum(v)}/{len(v)}" for s, v in by_sys.items())
             + f"; {_loaded(runs)}", _clocks(runs)]
    for kind in BYTE_CHECKS:
        name = BYTE_CHECK_NAMES[kind]
        checks = [r.check(kind) for r in rows]
        checked = [c for c in checks if c.ok is not None]
        if checked:
            lines.append(f"{name}: {sum(c.ok for c in checked)} of {len(checked)} distributed "
                         f"runs within ±{BYTES_TOLERANCE:.0%}")
        for why, n in Counter(c.why for c in checks if c.ok is None).items():
            lines.append(f"{name} not checked for {n} run(s): {why}")
    twinless = sum(r.run.network_emulated and r.run.fetch_cpu_from.startswith("none") for r in rows)
    if twinless:
        lines.append(f"note: {twinless} emulated-network run(s) have no no-network twin; their "
                     "fetch CPU is taken as 0")
    warning = gap_warning(runs, "--validate")
    return lines + ([f"Warning: {warning}"] if warning else [])


def _loaded(runs: list[MeasuredRun]) -> str:
    """How many of `runs` ran loaded (summary.json's `contention.loaded`)."""
    loaded = sum(bool((r.load or {}).get("loaded")) for r in runs)
    unknown = sum(r.load is None for r in runs)
    return (f"{loaded} of them ran loaded" + (f" ({unknown} recorded no load)" if unknown else ""))


def _clocks(runs: list[MeasuredRun]) -> str:
    """Which clock the runs' forward, backward and optimizer came from."""
    n = clock_counts(runs)
    return (f"compute from CPU time for {n['cpu']} run(s), from wall time for {n[WALL]}"
            + (" (runs without the CPU columns: older ones, TorchRec's, or on a GPU)"
               if n[WALL] else ""))


def unmodelled_note(unmodelled: dict[str, int]) -> str:
    """The runs left out because the model has no traffic of their system; "" for none."""
    if not unmodelled:
        return ""
    return ("note: left out " + ", ".join(f"{n} {s} run(s)" for s, n in unmodelled.items())
            + f": simulate has no model of their traffic (it models {', '.join(SYSTEMS)})")

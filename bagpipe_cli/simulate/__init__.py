"""`bagpipe simulate`: predicted iteration times and speed-ups on a cluster, from a trace.

Entry points: `build_config(...)` -> `SimulateConfig`; `run_simulate(config)` ->
`SimulateResult` (pure: no printing); `write_simulation(result, out)` writes
simulate.json (schema_version 1), predictions.csv, sweep.csv and the plots. The model is
`bagpipe_cli.simulate.model` (documented in docs/performance-model.md); `validate(paths)`
in `bagpipe_cli.simulate.validate` checks it against stored runs.

The tracing, calibration and plotting (torch, pandas, matplotlib) are imported inside the
functions that use them: `bagpipe simulate --help` reads only `SimulateConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bagpipe_cli.engine.registry import spec
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.files.atomic import atomic_dir, recorded_path, write_json
from bagpipe_cli.files.records import read_record
from bagpipe_cli.simulate.cluster import ClusterFile, SimulateConfig, ensure_dataset
from bagpipe_cli.simulate.inputs import ComputeTimes, Volumes, Workload
from bagpipe_cli.simulate.model import Prediction, add_speedups, predict

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1

__all__ = ["SCHEMA_VERSION", "SimulateConfig", "SimulateProgress", "SimulateResult", "build_config",
           "run_simulate"]


def build_config(source: str | None, cluster_file: ClusterFile | None = None,
                 progress: Callable[[str], None] | None = None, **options: Any) -> SimulateConfig:
    """Merge command-line options (None: not given) over a cluster file's settings over a
    profile's over `SimulateConfig`'s defaults (train's).

    `source` is a dataset directory or a `bagpipe profile` output directory (its dataset,
    batch size and first lookahead are used); it may be None when the cluster file names
    the dataset, which its `synth:` generates if it is missing (`progress` says so).
    """
    vals = dict(cluster_file.settings) if cluster_file else {}
    vals.update({k: v for k, v in options.items() if v is not None})
    if source is not None:
        vals["data"] = source
    elif "data" not in vals:
        raise ConfigError("give DATA (a dataset or profile directory), or `data:` in a --cluster file")
    elif cluster_file is not None:
        SimulateConfig(**vals)  # every setting is checked before a dataset is generated
        ensure_dataset(cluster_file, progress)
    data_path, src = _source(Path(vals["data"]), vals)
    vals["data"] = str(data_path)
    vals["source"] = f"cluster file {cluster_file.source}, {src}" if cluster_file else src
    vals["name"] = vals.get("name") or data_path.name
    return SimulateConfig(**vals)


def _source(data_path: Path, vals: dict[str, Any]) -> tuple[Path, str]:
    """(dataset directory, a description): a profile folder gives its dataset, and its batch
    size and first lookahead where `vals` has none."""
    if not (data_path / "profile.json").is_file():
        if not data_path.exists():
            raise ConfigError(f"{data_path}: no such dataset or profile directory")
        return data_path, str(data_path)
    prof = read_record(data_path / "profile.json", "profile")  # size, depth and keys checked
    try:
        ds_path = recorded_path(prof["dataset"])  # absolute since profile.json records it so
        pcfg = prof["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{data_path}/profile.json: cannot read ({e}); rerun bagpipe profile") from None
    if not (Path(ds_path) / "meta.json").is_file():
        raise DataError(f"{data_path}: the profile's dataset {ds_path} is gone; the model needs "
                        "the batch trace (write-backs, sync lists), not only per_batch.csv")
    if "batch_size" not in vals and pcfg.get("batch_size"):
        vals["batch_size"] = pcfg["batch_size"]
    if "lookahead" not in vals and pcfg.get("lookaheads"):
        vals["lookahead"] = pcfg["lookaheads"][0]
    return Path(ds_path), f"profile {data_path} of {ds_path}"


@dataclass
class SimulateResult:
    """Predictions at the configured cluster, the sweeps, and where the inputs came from."""

    config: SimulateConfig
    trace: dict[str, Any]  # facts about the traced batches (iterations, peak, capacity, ...)
    workload: Workload
    compute: dict[str, ComputeTimes]  # per system, as used at the configured cluster
    compute_source: dict[str, Any]
    predictions: list[Prediction]
    volumes: dict[str, dict[str, float]]  # per system: mean rows per iteration moved
    sweep: pd.DataFrame  # sweep, system, trainers, net_gbps, batch_size, mean_ms, speedup,
    #                      rank 0's figures (SWEEP_PLAN_COLUMNS) and the rest (SWEEP_TIME_COLUMNS)
    load: dict[str, Any] | None = None  # the machine's load it ran under (contention.load_now)

    def predictions_frame(self) -> pd.DataFrame:
        import pandas as pd

        rows = []
        for p in self.predictions:
            d = p.to_json()
            d.update({f"{k}_per_iter": v for k, v in self.volumes[p.system].items()})
            d["samples_per_s"] = 1e3 * self.config.batch_size / p.mean_ms if p.mean_ms > 0 else math.nan
            rows.append(d)
        return pd.DataFrame(rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "config": self.config.to_json(),
            "trace": self.trace,
            "workload": asdict(self.workload) | {"row_bytes": self.workload.row_bytes},
            "compute": {s: asdict(c) | {"total_ms": c.total_ms} for s, c in self.compute.items()},
            "compute_source": self.compute_source,
            "load": self.load,
            "predictions": self.predictions_frame().to_dict(orient="records"),
            "sweep": self.sweep.to_dict(orient="records"),
            "reported": self.config.reported,
        }


def _compute(cfg: SimulateConfig) -> tuple[dict[str, ComputeTimes], dict[str, Any]]:
    """Compute per system at the configured (batch, trainers)."""
    if cfg.compute_ms is not None:
        c = ComputeTimes.from_total(cfg.compute_ms)
        return {s: c for s in cfg.systems}, {"kind": "given", "compute_ms": cfg.compute_ms}
    from bagpipe_cli.simulate.calibrate import calibrate

    per, src = calibrate(*map(Path, cfg.calibrate), model=cfg.model)
    # Runs simulate their trainers in one process: the compute of B_run samples. One trainer
    # here computes batch_size / trainers samples; compute scales with the samples.
    factor = (cfg.batch_size / cfg.cluster.trainers) / src["batch_size"]
    src = {"kind": "calibrated", **src, "scale": factor,
           "note": "per-sample compute of the runs x samples per trainer; forward+backward "
                   "measured once (fwd_bwd: ms at the runs' batch, ms_used here, each "
                   "system's measured_ms), the other phases each system's own"}
    src["fwd_bwd"] = {**src["fwd_bwd"], "ms_used": src["fwd_bwd"]["ms"] * factor}
    return {s: per.get(s, per["*"]).scaled(factor) for s in cfg.systems}, src


def _machine_load() -> dict[str, Any]:
    """The machine's load as a simulation starts (`launch/contention.load_now`): what it ran
    beside, recorded in simulate.json (`load`)."""
    from bagpipe_cli.launch.contention import load_now

    return load_now()


def _mean_volumes(v: Volumes, warmup: int) -> dict[str, float]:
    """Rows per iteration after warm-up, as the times are (the first rounds fetch every cold
    row: at 64 trainers of the rank0-sweep, a mean over the whole run said 1.5M rows an
    iteration where the iterations measured fetched 0.56M)."""
    m = slice(warmup, None) if v.iterations > warmup else slice(None)
    n = max(len(v.sync_now[m]), 1)
    asked = float(v.shards[m, 0].sum()) if v.shards is not None else 0.0  # of the rows' owners
    return {"rows_fetched": (float(v.round_fetch[m].sum() + v.read_fetch[m].sum()) + asked) / n,
            "rows_written_back": (float(v.pre_evict[m].sum() + v.write_back[m].sum()) + asked) / n,
            "sync_now": float(v.sync_now[m].sum()) / n, "sync_later": float(v.sync_later[m].sum()) / n,
            "unique_rows": float(v.unique_rows[m].sum()) / n}


# Rank 0's figures of a prediction, in every row of the sweeps.
SWEEP_PLAN_COLUMNS = ("planner_mb_per_iter", "planner_ms_per_iter", "planner_send_ms_per_iter",
                      "planners", "planner_worker_ms", "planner_make_ms", "relay_ms_per_iter",
                      "exposed_plan_ms")
# Where the rest of the iteration goes, in every row of the sweeps too.
SWEEP_TIME_COLUMNS = ("compute_ms", "floor_ms", "exposed_fetch_ms", "exposed_sync_ms", "link_busy",
                      "server_rows_mb_per_iter", "collective_mb_per_iter")


def _sweep_row(sweep: str, p: Prediction, trainers: int, net_gbps: float | None,
               batch_size: int) -> dict[str, Any]:
    return {"sweep": sweep, "system": p.system, "trainers": trainers, "net_gbps": net_gbps,
            "batch_size": batch_size, "mean_ms": p.mean_ms, "speedup": p.speedup,
            **{k: getattr(p, k) for k in SWEEP_PLAN_COLUMNS + SWEEP_TIME_COLUMNS}}


@dataclass
class SimulateProgress:
    """Where a simulation is, for a progress display: the traces of one system's volumes
    (the main one, and one per system retraced at each swept trainer count) take its time."""

    stage: str  # what runs now: "tracing bagpipe", "8 trainers: tracing lru", ...
    traces_done: int  # system traces finished
    traces_total: int  # system traces this simulation makes
    batches: int = 0  # batches read so far, over every pass of every trace


class _Progress:
    """Counts the traces and batches of `run_simulate` and reports each step."""

    def __init__(self, emit: Callable[[SimulateProgress], None] | None, total: int):
        self.emit = emit or (lambda p: None)
        self.state = SimulateProgress("tracing", 0, total)
        self.started = 0

    def trace(self, label: str) -> None:  # a system's trace starts
        self.stage(label)
        self.started += 1

    def stage(self, label: str) -> None:
        self.state.stage, self.state.traces_done = label, self.started
        self.emit(self.state)

    def batch(self) -> None:
        self.state.batches += 1
        self.emit(self.state)


def _retraced(cfg: SimulateConfig, n: int) -> list[str]:
    """The systems whose volumes are traced again for the sweep's `n` trainers: every
    system's when each trainer fetches its own rows (distributed) or the batch grows (weak
    scaling), else those whose volumes depend on N in-process too: het's per-trainer caches,
    bagpipe's partition of U_b among the trainers (`per_trainer_volumes`, `partitioned`)."""
    batch = cfg.sweep_batch(n)
    if n == cfg.cluster.trainers and batch == cfg.batch_size:
        return []
    return [s for s in cfg.systems if cfg.runtime == "distributed" or batch != cfg.batch_size
            or spec(s).per_trainer_volumes or spec(s).partitioned]


def run_simulate(cfg: SimulateConfig,
                 progress: Callable[[SimulateProgress], None] | None = None) -> SimulateResult:
    """Trace the dataset, predict every system at the cluster and along the sweeps
    (`progress` at each system's trace and each batch read)."""
    import pandas as pd

    from bagpipe_cli.models import ModelConfig, row_dim, row_width
    from bagpipe_cli.simulate.calibrate import dense_bytes, state_dim
    from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

    track = _Progress(progress, len(cfg.systems) + sum(len(_retraced(cfg, n))
                                                       for n in cfg.trainer_counts))
    tc = TraceConfig(data=cfg.data, batch_size=cfg.batch_size, iterations=cfg.iterations,
                     lookahead=cfg.lookahead, round=cfg.round, planners=cfg.planners,
                     cache_rows=cfg.cache_rows,
                     staleness=cfg.staleness, hot_sample=cfg.hot_sample, trainers=cfg.trainers,
                     servers=cfg.servers, eval_rows=cfg.eval_rows, runtime=cfg.runtime,
                     row_dim=row_width(cfg.model, cfg.emb_dim))
    load, (compute, csrc) = _machine_load(), _compute(cfg)  # the load before its own work
    vols, info = trace_volumes(tc, cfg.systems, lambda s: track.trace(f"tracing {s}"), track.batch)
    mcfg = ModelConfig(cfg.model, info["dense_features"], info["tables"], cfg.emb_dim,
                       bottom_mlp=cfg.bottom_mlp, top_mlp=cfg.top_mlp)
    work = Workload(row_dim(mcfg), state_dim(cfg.optimizer), dense_bytes(mcfg), cfg.warmup)
    info["warmup"] = cfg.warmup
    preds = [predict(vols[s], cfg.cluster, work, compute[s]) for s in cfg.systems]
    add_speedups(preds)
    rows = []
    track.stage("sweeping bandwidth")
    for g in cfg.sweep_gbps:
        cl = replace(cfg.cluster, net_gbps=g)
        ps = [predict(vols[s], cl, work, compute[s]) for s in cfg.systems]
        add_speedups(ps)
        rows += [_sweep_row("net_gbps", p, cl.trainers, g, cfg.batch_size) for p in ps]
    n0 = cfg.cluster.trainers
    for n in cfg.trainer_counts:
        track.stage(f"sweeping trainers: {n}")
        vn = dict(vols)
        batch = cfg.sweep_batch(n)
        redo = _retraced(cfg, n)  # volumes traced again for this trainer count
        if redo:
            try:
                vn.update(trace_volumes(replace(tc, trainers=n, batch_size=batch), redo,
                                        lambda s, n=n: track.trace(f"{n} trainer{'s' * (n != 1)}: tracing {s}"),
                                        track.batch)[0])
            except ConfigError as e:
                if batch == cfg.batch_size:
                    raise
                raise ConfigError(f"--sweep-scaling weak at {n} trainers (a global batch of "
                                  f"{batch:,}): {e}") from None
        cl = replace(cfg.cluster, trainers=n)
        # Strong scaling: the global batch stays, each trainer computes batch / n samples;
        # weak: each trainer computes what it does at the configured cluster.
        scale = n0 / n if cfg.sweep_scaling == "strong" else 1.0
        ps = [predict(vn[s], cl, work, compute[s].scaled(scale)) for s in cfg.systems]
        add_speedups(ps)
        rows += [_sweep_row("trainers", p, n, cl.net_gbps, batch) for p in ps]
    track.stage("done")
    return SimulateResult(cfg, info, work, compute, csrc, preds,
                          {s: _mean_volumes(v, cfg.warmup) for s, v in vols.items()},
                          pd.DataFrame(rows), load)


def write_simulation(result: SimulateResult, out: Path, overwrite: bool = False) -> list[Path]:
    """simulate.json, predictions.csv, sweep.csv and the plots, written atomically into `out`."""
    from bagpipe_cli.simulate.plots import plot_speedup_vs_bandwidth, plot_speedup_vs_trainers

    with atomic_dir(Path(out), overwrite) as tmp:
        write_json(tmp / "simulate.json", result.to_json())
        result.predictions_frame().to_csv(tmp / "predictions.csv", index=False)
        result.sweep.to_csv(tmp / "sweep.csv", index=False)
        plot_speedup_vs_trainers(result, tmp / "speedup_vs_trainers.png")
        plot_speedup_vs_bandwidth(result, tmp / "speedup_vs_bandwidth.png")
        names = sorted(p.name for p in tmp.iterdir())
    return [Path(out) / n for n in names]

"""`bagpipe simulate`: predicted iteration times and speed-ups on a cluster, from a trace.

Entry points: `build_config(...)` -> `SimulateConfig`; `run_simulate(config)` ->
`SimulateResult` (pure: no printing); `write_simulation(result, out)` writes
simulate.json (schema_version 1), predictions.csv, sweep.csv and the plots. The model is
`bagpipe_cli.simulate.model` (documented in docs/performance-model.md); `validate(paths)`
in `bagpipe_cli.simulate.validate` checks it against stored runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.engine.registry import spec
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.io import atomic_dir, write_json
from bagpipe_cli.models import MODELS, ModelConfig, row_dim
from bagpipe_cli.simulate.calibrate import calibrate, dense_bytes, state_dim
from bagpipe_cli.simulate.cluster import ClusterFile
from bagpipe_cli.simulate.model import (
    SYSTEMS,
    Cluster,
    ComputeTimes,
    Prediction,
    Volumes,
    Workload,
    add_speedups,
    predict,
)
from bagpipe_cli.simulate.plots import plot_speedup_vs_bandwidth, plot_speedup_vs_trainers
from bagpipe_cli.simulate.volumes import RUNTIMES, TraceConfig, trace_volumes

SCHEMA_VERSION = 1
DEFAULT_SWEEP_TRAINERS = (1, 2, 4, 8, 16, 32)
DEFAULT_SWEEP_GBPS = (1.0, 2.5, 5.0, 10.0, 25.0, 40.0, 100.0)

__all__ = ["SCHEMA_VERSION", "SimulateConfig", "SimulateResult", "build_config", "run_simulate"]


@dataclass(frozen=True)
class SimulateConfig:
    """What `bagpipe simulate` predicts."""

    data: str  # dataset directory whose batch trace is used
    cluster: Cluster  # trainers, servers, network
    systems: tuple[str, ...] = SYSTEMS  # systems to predict
    model: str = "dlrm"  # dense model (its parameter bytes are all-reduced for N > 1)
    batch_size: int = 4096  # global batch
    iterations: int | None = None  # iterations traced (None: one pass over the dataset)
    warmup: int | None = None  # iterations left out of the figures (None: 10%)
    lookahead: int = 200  # bagpipe's L
    round: int | None = None  # bagpipe's C (default L/4)
    cache_rows: int | None = None  # lru/lfu/fae capacity (default: bagpipe's peak)
    staleness: int = 0  # het
    emb_dim: int = 16  # E
    bottom_mlp: tuple[int, ...] | None = None  # the dense model's hidden sizes (None: the package's)
    top_mlp: tuple[int, ...] | None = None
    runtime: str = "distributed"  # a process per trainer, each fetching its own rows; or inproc
    optimizer: str = "adagrad"  # sgd | adagrad (adagrad moves a 1-float state with every row)
    compute_ms: float | None = None  # compute per iteration on one trainer
    calibrate: tuple[str, ...] = ()  # or: runs to calibrate compute from
    sweep_trainers: tuple[int, ...] = DEFAULT_SWEEP_TRAINERS
    sweep_gbps: tuple[float, ...] = DEFAULT_SWEEP_GBPS
    source: str = ""  # what the input was (dataset, profile, cluster file)
    name: str = ""
    reported: dict[str, Any] = field(default_factory=dict)  # published figures to show alongside

    def __post_init__(self) -> None:
        object.__setattr__(self, "systems", tuple(self.systems))
        if not self.systems:
            raise ConfigError("--systems: give at least one system")
        for s in self.systems:
            if s not in SYSTEMS:
                raise ConfigError(f"--systems: unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
        if self.model not in MODELS:
            raise ConfigError(f"--model {self.model!r}: choose one of {', '.join(sorted(MODELS))}")
        if self.optimizer not in ("sgd", "adagrad"):
            raise ConfigError(f"--optimizer {self.optimizer!r}: choose sgd or adagrad")
        if self.compute_ms is None and not self.calibrate:
            raise ConfigError("give the compute time: --compute-ms C (per iteration on one trainer) "
                              "or --calibrate RESULTS (measured runs)")
        if self.compute_ms is not None and self.calibrate:
            raise ConfigError("give either --compute-ms or --calibrate, not both")
        if self.compute_ms is not None:
            ComputeTimes.from_total(self.compute_ms)  # validates
        if self.batch_size % self.cluster.trainers:
            raise ConfigError(f"--batch-size {self.batch_size} is not divisible by --trainers "
                              f"{self.cluster.trainers}")
        if self.emb_dim < 1:
            raise ConfigError(f"--emb-dim must be >= 1 (got {self.emb_dim})")
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"--runtime {self.runtime!r}: choose one of {', '.join(RUNTIMES)}")
        for k in ("bottom_mlp", "top_mlp"):
            if getattr(self, k) is not None:
                object.__setattr__(self, k, tuple(getattr(self, k)))

    @property
    def model_config(self) -> dict[str, Any]:
        """The dense model's sizes beyond the dataset's (ModelConfig keyword arguments)."""
        return {k: getattr(self, k) for k in ("bottom_mlp", "top_mlp") if getattr(self, k) is not None}

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["systems"] = list(self.systems)
        d["calibrate"] = list(self.calibrate)
        d["sweep_trainers"] = list(self.sweep_trainers)
        d["sweep_gbps"] = list(self.sweep_gbps)
        return d


def build_config(source: str | None, cluster_file: ClusterFile | None = None, **options: Any) -> SimulateConfig:
    """Merge command-line options (None = not given) over a cluster file over a profile's settings.

    `source` is a dataset directory or a `bagpipe profile` output directory (its dataset,
    batch size and first lookahead are used); it may be None when the cluster file names
    the dataset.
    """
    cf = cluster_file or ClusterFile()
    vals: dict[str, Any] = {}
    for k in ("trainers", "servers", "net_gbps", "net_latency_us", "compute_ms", "calibrate",
              "batch_size", "iterations", "warmup", "lookahead", "round", "cache_rows", "staleness",
              "emb_dim", "optimizer", "model", "systems", "name", "trainer_gbps", "runtime",
              "collective", "bottom_mlp", "top_mlp"):
        v = options.get(k)
        vals[k] = v if v is not None else getattr(cf, k, None)
    data = source or cf.data
    if data is None:
        raise ConfigError("give DATA (a dataset or profile directory) or --cluster FILE")
    data_path, src = _source(Path(data), vals)
    calib = vals["calibrate"]
    if isinstance(calib, (str, Path)):
        calib = (str(calib),)
    cluster = Cluster(int(vals["trainers"] or 1), int(vals["servers"] or 1), vals["net_gbps"],
                      float(vals["net_latency_us"] or 0.0), trainer_gbps=vals["trainer_gbps"],
                      collective=vals["collective"] or "auto")
    defaults = SimulateConfig.__dataclass_fields__
    pick = {k: (vals[k] if vals[k] is not None else defaults[k].default)
            for k in ("batch_size", "iterations", "warmup", "lookahead", "round", "cache_rows",
                      "staleness", "emb_dim", "optimizer", "model", "compute_ms", "runtime",
                      "bottom_mlp", "top_mlp")}
    sweep = cf.sweep or {}
    return SimulateConfig(
        data=str(data_path), cluster=cluster,
        systems=tuple(vals["systems"]) if vals["systems"] else SYSTEMS,
        calibrate=tuple(str(c) for c in calib or ()),
        sweep_trainers=tuple(int(x) for x in options.get("sweep_trainers") or sweep.get("trainers")
                             or DEFAULT_SWEEP_TRAINERS),
        sweep_gbps=tuple(float(x) for x in options.get("sweep_gbps") or sweep.get("net_gbps")
                         or DEFAULT_SWEEP_GBPS),
        source=f"cluster file {cf.source}, {src}" if cf.source else src,
        name=vals["name"] or cf.name or data_path.name, reported=dict(cf.reported or {}),
        **pick,
    )


def _source(data_path: Path, vals: dict[str, Any]) -> tuple[Path, str]:
    """(dataset directory, a description): a profile folder gives its dataset, and its batch
    size and first lookahead where `vals` has none."""
    if not (data_path / "profile.json").is_file():
        if not data_path.exists():
            raise ConfigError(f"{data_path}: no such dataset or profile directory")
        return data_path, str(data_path)
    try:
        prof = json.loads((data_path / "profile.json").read_text())
        ds_path = prof["dataset"]["path"]
        pcfg = prof["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{data_path}/profile.json: cannot read ({e}); rerun bagpipe profile") from None
    if not (Path(ds_path) / "meta.json").is_file():
        raise DataError(f"{data_path}: the profile's dataset {ds_path} is gone; the model needs "
                        "the batch trace (write-backs, sync lists), not only per_batch.csv")
    if vals["batch_size"] is None:
        vals["batch_size"] = pcfg.get("batch_size")
    if vals["lookahead"] is None and pcfg.get("lookaheads"):
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
    sweep: pd.DataFrame  # system, sweep, trainers, net_gbps, mean_ms, speedup

    def predictions_frame(self) -> pd.DataFrame:
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
            "predictions": self.predictions_frame().to_dict(orient="records"),
            "sweep": self.sweep.to_dict(orient="records"),
            "reported": self.config.reported,
        }


def _compute(cfg: SimulateConfig) -> tuple[dict[str, ComputeTimes], dict[str, Any]]:
    """Compute per system at the configured (batch, trainers)."""
    if cfg.compute_ms is not None:
        c = ComputeTimes.from_total(cfg.compute_ms)
        return {s: c for s in cfg.systems}, {"kind": "given", "compute_ms": cfg.compute_ms}
    per, src = calibrate(*map(Path, cfg.calibrate), model=cfg.model)
    # Runs simulate their trainers in one process: the compute of B_run samples. One trainer
    # here computes batch_size / trainers samples; compute scales with the samples.
    factor = (cfg.batch_size / cfg.cluster.trainers) / src["batch_size"]
    src = {"kind": "calibrated", **src, "scale": factor,
           "note": "per-sample compute of the runs x samples per trainer"}
    return {s: per.get(s, per["*"]).scaled(factor) for s in cfg.systems}, src


def _mean_volumes(v: Volumes) -> dict[str, float]:
    n = max(v.iterations, 1)
    return {"rows_fetched": float(v.round_fetch.sum() + v.read_fetch.sum()) / n,
            "rows_written_back": float(v.pre_evict.sum() + v.write_back.sum()) / n,
            "sync_now": float(v.sync_now.sum()) / n, "sync_later": float(v.sync_later.sum()) / n,
            "unique_rows": float(v.unique_rows.sum()) / n}


def run_simulate(cfg: SimulateConfig, progress: Callable[[str], None] | None = None) -> SimulateResult:
    """Trace the dataset, predict every system at the cluster and along the sweeps."""
    say = progress or (lambda s: None)
    tc = TraceConfig(data=cfg.data, batch_size=cfg.batch_size, iterations=cfg.iterations,
                     lookahead=cfg.lookahead, round=cfg.round, cache_rows=cfg.cache_rows,
                     staleness=cfg.staleness, trainers=cfg.cluster.trainers,
                     servers=cfg.cluster.servers, eval_rows=0, runtime=cfg.runtime)
    compute, csrc = _compute(cfg)
    say("tracing")
    vols, info = trace_volumes(tc, cfg.systems, lambda s: say(f"tracing {s}"))
    mcfg = ModelConfig(cfg.model, info["dense_features"], info["tables"], cfg.emb_dim,
                       **cfg.model_config)
    warmup = cfg.warmup if cfg.warmup is not None else max(1, info["iterations"] // 10)
    if warmup >= info["iterations"]:
        raise ConfigError(f"--warmup {warmup} leaves none of the {info['iterations']} iterations")
    work = Workload(row_dim(mcfg), state_dim(cfg.optimizer), dense_bytes(mcfg), warmup)
    info["warmup"] = warmup
    preds = [predict(vols[s], cfg.cluster, work, compute[s]) for s in cfg.systems]
    add_speedups(preds)

    rows = []
    say("sweeping bandwidth")
    for g in cfg.sweep_gbps:
        cl = replace(cfg.cluster, net_gbps=g)
        ps = [predict(vols[s], cl, work, compute[s]) for s in cfg.systems]
        add_speedups(ps)
        rows += [{"sweep": "net_gbps", "system": p.system, "trainers": cl.trainers, "net_gbps": g,
                  "mean_ms": p.mean_ms, "speedup": p.speedup} for p in ps]
    n0 = cfg.cluster.trainers
    for n in cfg.sweep_trainers:
        n = int(n)
        if n < 1 or cfg.batch_size % n:
            continue
        say(f"sweeping trainers: {n}")
        vn = dict(vols)
        # Volumes traced again per trainer count: every system's when each trainer fetches its
        # own rows (distributed), else het's per-trainer caches. Bagpipe's split of
        # the non-critical rows into sync_later / no_sync also depends on N, but it only
        # loads the asynchronous collective link; the sweep keeps the configured N's.
        redo = [s for s in cfg.systems if cfg.runtime == "distributed" or spec(s).per_trainer_volumes]
        if n != n0 and redo:
            vn.update(trace_volumes(replace(tc, trainers=n), redo)[0])
        cl = replace(cfg.cluster, trainers=n)
        # Strong scaling: the global batch stays, each trainer computes batch / n samples.
        ps = [predict(vn[s], cl, work, compute[s].scaled(n0 / n)) for s in cfg.systems]
        add_speedups(ps)
        rows += [{"sweep": "trainers", "system": p.system, "trainers": n, "net_gbps": cl.net_gbps,
                  "mean_ms": p.mean_ms, "speedup": p.speedup} for p in ps]
    return SimulateResult(cfg, info, work, compute, csrc, preds,
                          {s: _mean_volumes(v) for s, v in vols.items()}, pd.DataFrame(rows))


def write_simulation(result: SimulateResult, out: Path, overwrite: bool = False) -> list[Path]:
    """simulate.json, predictions.csv, sweep.csv and the plots, written atomically into `out`."""
    with atomic_dir(Path(out), overwrite) as tmp:
        write_json(tmp / "simulate.json", result.to_json())
        result.predictions_frame().to_csv(tmp / "predictions.csv", index=False)
        result.sweep.to_csv(tmp / "sweep.csv", index=False)
        plot_speedup_vs_trainers(result, tmp / "speedup_vs_trainers.png")
        plot_speedup_vs_bandwidth(result, tmp / "speedup_vs_bandwidth.png")
        names = sorted(p.name for p in tmp.iterdir())
    return [Path(out) / n for n in names]

"""`bagpipe advise`: one answer for the user's own cluster.

    scale     (--scale K) the log K times larger, with its tables' sizes and skew (`scale.py`)
    measure   short in-process runs of every system at a trainer's share of the batch, one
              torch thread each: on one trainer, and on two over the user's network emulated
              (a bench folder: `bench/`, with the data's access profile)
    model     `simulate` at the user's trainers and network, its compute calibrated from
              those runs, swept over trainer counts (a trainer's samples kept) and networks
    validate  the model against the runs it was calibrated from (`simulate --validate`)
    verdict   the fastest system, its margin, the confidence, why, and where the answer
              changes (`verdict.py`)

Everything lands in one output folder, written atomically: `bench/` (the runs), `simulation/`
(simulate.json, the CSVs, speedup_vs_trainers.png and speedup_vs_bandwidth.png),
`advice.json` and `advice.md` (the page). The machine's load while it ran is recorded
beside the verdict: the model's compute and planning come from the runs' timers and the
planner's thread CPU time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bagpipe_cli.errors import BagpipeError, ConfigError

SCHEMA_VERSION = 1
PER_TRAINER = 2048  # samples a trainer computes per iteration by default
SWEEP_GBPS = (1.0, 10.0, 25.0, 100.0)
# The model's trace: iterations and warm-up (a bagpipe window of the default lookahead fills
# in the warm-up; the figures are the means after it).
MODEL_ITERATIONS, MODEL_WARMUP = 48, 16


@dataclass(frozen=True)
class AdviseConfig:
    """What `bagpipe advise` answers (each field is its option)."""

    data: str
    trainers: int
    net_gbps: float
    cluster: str | None = None  # a cluster file: settings under the options given here
    scale: int = 1  # the log K times larger (advise/scale.py)
    scaled_data: str | None = None  # where the scaled log goes [default: results/datasets/]
    systems: tuple[str, ...] = ("simulated",)
    batch_size: int | None = None  # the global batch [default: PER_TRAINER a trainer]
    iterations: int = 24  # of each measuring run
    warmup: int = 6
    model: str = "dlrm"
    emb_dim: int = 16
    lookahead: int = 16

    def __post_init__(self) -> None:
        for name, v, low in [("--trainers", self.trainers, 1), ("--scale", self.scale, 1),
                             ("--iterations", self.iterations, 2), ("--emb-dim", self.emb_dim, 1),
                             ("--lookahead", self.lookahead, 1)]:
            if v < low:
                raise ConfigError(f"{name} must be >= {low} (got {v})")
        if not self.net_gbps > 0:
            raise ConfigError(f"--net-gbps must be > 0 (got {self.net_gbps})")
        if not 0 <= self.warmup < self.iterations:
            raise ConfigError(f"--warmup {self.warmup}: must be below --iterations {self.iterations}")
        self._check_systems()
        if self.batch is not None and self.batch % self.trainers:
            raise ConfigError(f"--batch-size {self.batch} is not divisible by --trainers {self.trainers}")

    def _check_systems(self) -> None:
        """Every system asked for is one the model predicts (before minutes of runs)."""
        from bagpipe_cli.engine.registry import SIMULATED_SYSTEMS, SYSTEMS, group

        for name in (m for s in self.systems for m in (group(s) or (s,))):
            if name not in SYSTEMS:
                raise ConfigError(f"--systems: unknown system {name!r}; choose from "
                                  f"{', '.join(SIMULATED_SYSTEMS)} (or a group: `bagpipe systems`)")
            if name not in SIMULATED_SYSTEMS:
                raise ConfigError(f"--systems: {name} has no performance model yet; choose from "
                                  f"{', '.join(SIMULATED_SYSTEMS)}")

    @property
    def batch(self) -> int:
        return self.batch_size if self.batch_size is not None else PER_TRAINER * self.trainers

    @property
    def per_trainer(self) -> int:
        return self.batch // self.trainers

    def for_rows(self, rows: int) -> AdviseConfig:
        """With the default batch, one whose sweep fits a dataset of `rows` samples: PER_TRAINER
        a trainer, or as many as the sweep's largest trainer count leaves."""
        if self.batch_size is not None:
            if self.batch > rows:
                raise ConfigError(f"--batch-size {self.batch}: {self.data} has {rows:,} samples")
            return self
        per = min(PER_TRAINER, rows // max(self.sweep_trainers()))
        if per < 1:
            raise ConfigError(f"{self.data}: {rows:,} samples are too few for "
                              f"{max(self.sweep_trainers())} trainers; lower --trainers")
        return replace(self, batch_size=per * self.trainers)

    def sweep_trainers(self) -> tuple[int, ...]:
        """Powers of 2 up to twice the user's trainers (at least 8), and theirs."""
        top = max(8, 2 * self.trainers)
        return tuple(sorted({2 ** i for i in range(top.bit_length()) if 2 ** i <= top} | {self.trainers}))


@dataclass
class Advice:
    config: AdviseConfig
    data: str  # the dataset the answer is about (the scaled one with --scale)
    verdict: Any  # verdict.Verdict
    simulation: Any  # simulate.SimulateResult
    validation: list[dict[str, Any]]
    load: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {"schema_version": SCHEMA_VERSION, "fastest": v.fastest,
                "speedup_over_sync": v.speedup_over_sync, "runner_up": v.runner_up,
                "margin_over_runner_up": v.margin, "within_model_error": v.within_error,
                "confidence": v.confidence, "verdict": v.lines, "details": v.to_json(),
                "config": asdict(self.config), "data": self.data, "load": self.load,
                "validation": self.validation,
                "predictions": self.simulation.predictions_frame().to_dict(orient="records")}


Progress = Callable[[str, int, int], None]  # (step, done, total)


def scaled_path(cfg: AdviseConfig) -> Path:
    """Where --scale's dataset goes: --scaled-data, or results/datasets/NAME-xK."""
    from bagpipe_cli.data.format import open_dataset

    if cfg.scaled_data:
        return Path(cfg.scaled_data)
    return Path("results") / "datasets" / f"{open_dataset(cfg.data).meta.name}-x{cfg.scale}"


def reusable(cfg: AdviseConfig) -> Path | None:
    """The scaled dataset already written for DATA at --scale (None: there is none)."""
    from bagpipe_cli.data.format import read_meta

    out = scaled_path(cfg)
    try:
        src = read_meta(out).source
    except (OSError, ValueError, BagpipeError):  # no dataset there: an output to write
        return None
    return out if src.get("of") == str(Path(cfg.data).resolve()) and src.get("scale") == cfg.scale else None


def dataset(cfg: AdviseConfig, progress: Progress, overwrite: bool = False) -> str:
    """The dataset to answer about: DATA, or (--scale K) its log K times larger, written once
    and reused while it is DATA's at K."""
    if cfg.scale == 1:
        return cfg.data
    from bagpipe_cli.advise.scale import write_scaled
    from bagpipe_cli.data.format import open_dataset

    if reusable(cfg) is not None:
        return str(scaled_path(cfg))
    rows = open_dataset(cfg.data).rows * cfg.scale
    done = [0]

    def step(n: int) -> None:
        done[0] += n
        progress(f"writing the log x{cfg.scale}", done[0], rows)

    return str(write_scaled(cfg.data, cfg.scale, scaled_path(cfg), progress=step, overwrite=overwrite))


def measure(cfg: AdviseConfig, data: str, out: Path, progress: Progress) -> Path:
    """Every system twice, in-process, each trainer computing a trainer's share of the batch
    on one torch thread: on one trainer without a network (the compute the model is
    calibrated from) and on two trainers over the user's network, emulated (what the model's
    traffic is checked against): a bench folder."""
    from bagpipe_cli.bench.config import parse_bench_config
    from bagpipe_cli.bench.runner import run_bench

    raw = {"name": "advise", "description": f"advise's measuring runs of {data}",
           "datasets": [{"name": Path(data).name, "path": str(Path(data).resolve())}],
           "models": [cfg.model], "systems": list(cfg.systems), "repeat": 1,
           "base": {"batch_size": cfg.per_trainer, "iterations": cfg.iterations,
                    "warmup": cfg.warmup, "threads": 1, "eval_rows": 0, "trainers": 1,
                    "lookahead": cfg.lookahead, "emb_dim": cfg.emb_dim},
           "matrix": {"runs": [{"label": "one-trainer"},
                               {"label": f"two-trainers-{cfg.net_gbps:g}Gbps", "trainers": 2,
                                "batch_size": 2 * cfg.per_trainer, "net_gbps": cfg.net_gbps}]},
           "profile": {"policies": ["none", "bagpipe"]}}
    bench = parse_bench_config(raw, "bagpipe advise")

    def event(e) -> None:
        if e.kind in ("done", "skipped", "start"):
            progress("measuring each system", e.done, e.total)

    run_bench(bench, out, progress=event)
    return out


def model(cfg: AdviseConfig, data: str, bench: Path, progress: Progress):
    """`simulate` at the user's cluster, calibrated from the bench's runs."""
    from bagpipe_cli.simulate import build_config, run_simulate
    from bagpipe_cli.simulate.cluster import load_cluster

    cf = cluster_part(load_cluster(Path(cfg.cluster))) if cfg.cluster else None
    sim = build_config(data, cf, None, trainers=cfg.trainers, net_gbps=cfg.net_gbps,
                       batch_size=cfg.batch, calibrate=(str(bench),), systems=cfg.systems,
                       model=cfg.model, emb_dim=cfg.emb_dim, lookahead=cfg.lookahead,
                       sweep_trainers=cfg.sweep_trainers(), sweep_scaling="weak",
                       sweep_gbps=tuple(sorted({*SWEEP_GBPS, float(cfg.net_gbps)})),
                       warmup=MODEL_WARMUP, iterations=MODEL_ITERATIONS, eval_rows=0)
    return run_simulate(sim, lambda p: progress(f"modelling: {p.stage}", p.traces_done,
                                                p.traces_total or 1))


def cluster_part(cf):
    """A cluster file's settings of the cluster and its network (servers, latency, the
    trainers' links, how they sum, the runtime): its data, model, batch and compute are the
    measuring runs' and the options'."""
    from dataclasses import fields

    from bagpipe_cli.simulate.cluster import SimulateConfig

    keep = {f.name for f in fields(SimulateConfig)
            if f.metadata.get("section") == "cluster and network"} - {"compute_ms", "calibrate"}
    return replace(cf, settings={k: v for k, v in cf.settings.items() if k in keep | {"runtime"}},
                   synth=None)


def run_advise(cfg: AdviseConfig, out: Path, progress: Progress | None = None,
               overwrite: bool = False) -> Advice:
    """Every step (module docstring) into the folder `out` (a fresh one: the caller's
    temporary); returns the advice. `overwrite`: a scaled dataset may be replaced."""
    from bagpipe_cli.advise.verdict import verdict
    from bagpipe_cli.data.format import open_dataset
    from bagpipe_cli.launch.contention import ContentionMeter
    from bagpipe_cli.launch.placement import available_cores
    from bagpipe_cli.simulate import write_simulation
    from bagpipe_cli.simulate.validate import TOLERANCE, validate, validation_frame

    say = progress or (lambda step, done, total: None)
    meter = ContentionMeter(len(available_cores()))
    data = dataset(cfg, say, overwrite)
    cfg = cfg.for_rows(open_dataset(data).rows)
    bench = measure(cfg, data, out / "bench", say)
    result = model(cfg, data, bench, say)
    write_simulation(result, out / "simulation")
    say("validating the model", 0, 1)
    checked = validate(bench)
    say("validating the model", 1, 1)
    v = verdict(result.predictions, result.sweep, [r.error for r in checked.rows], TOLERANCE,
                cfg.trainers, cfg.net_gbps, f"each system on one trainer, and on two over "
                f"{cfg.net_gbps:g} Gbit/s emulated, {cfg.per_trainer:,} samples a trainer")
    load = meter.figures() | {"cpu_count": os.cpu_count()}
    return Advice(cfg, data, v, result, validation_frame(checked.rows).to_dict(orient="records"), load)

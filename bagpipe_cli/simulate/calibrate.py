"""Compute times from measured runs (run folders or bench folders).

A run's compute is what its timers measured outside communication: per iteration, the
median over the measured iterations (after warm-up) of

- data (at round starts only: bagpipe loads a round's batches at once),
- forward + backward,
- optimizer (dense and row optimizer, cache updates; write-backs are only queued),
- other = time - (data + prefetch_wait + forward + backward + sync + optimizer): untimed
  bookkeeping.

`prefetch_wait` and `sync` are left out: they are the communication the model predicts.
Forward, backward and optimizer: the CPU columns where a run has them, else wall (`cpu_time`).

`calibrate` (for `simulate --calibrate`) measures the model's forward + backward once: every
system the engine runs in one pass computes the same dense model on the same batch, so their
runs measure one quantity, and each system's own figure differs from it by noise alone
(`shared_compute`). The phases that depend on the system (data per round, optimizer and cache
updates, untimed work, fetch CPU) stay each system's own.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.records.metrics import TIME_KEYS
from bagpipe_cli.engine.registry import SYSTEMS
from bagpipe_cli.errors import DataError
from bagpipe_cli.files.atomic import recorded_path
from bagpipe_cli.models import ModelConfig, footprint
from bagpipe_cli.results import (
    SkippedRun,
    StoredRun,
    open_run,
    read_runs,
    read_trainer_metrics,
)
from bagpipe_cli.results.figures import COMPUTE_SPREAD
from bagpipe_cli.simulate import cpu_time
from bagpipe_cli.simulate.inputs import Cluster, ComputeTimes, Workload
from bagpipe_cli.simulate.volumes import TraceConfig


def dense_bytes(model: ModelConfig) -> int:
    """fp32 bytes of the dense model's parameters (what N > 1 trainers all-reduce), counted
    from its sizes: nothing is allocated, however large the layers."""
    return 4 * footprint(model)[0]


def state_dim(optimizer: str) -> int:
    return 1 if optimizer == "adagrad" else 0


@dataclass
class MeasuredRun:
    """One stored run: its settings (as the model's inputs), compute and measured times."""

    path: Path
    run_id: str
    system: str
    settings: dict[str, Any]  # its TrainConfig settings (`validate.setting_labels` names it)
    trace: TraceConfig
    cluster: Cluster
    workload: Workload
    compute: ComputeTimes
    measured_median_ms: float
    measured_mean_ms: float
    network_emulated: bool
    model: str = "dlrm"
    fetch_cpu_from: str = ""  # where fetch_cpu_ms came from (emulated runs: a no-net twin)
    # Bytes per iteration the run counted (summary roles.*.traffic); None for a run that did
    # not count them (in-process, or from before the count): rank 0's plans, the servers'
    # rows, each trainer's collectives
    counted_plan_bytes: float | None = None
    counted_server_rows: float | None = None
    counted_collective: list[float] | None = None
    device: str = ""  # where its trainers computed (a GPU's name, or "cpu"; "" unrecorded)
    phased: bool = False  # computed some batch in two passes (hotline's popular samples first)
    compute_clock: str = cpu_time.WALL  # forward, backward, optimizer's clock
    compute_wall_ms: float = math.nan  # forward+backward+optimizer (median ms), wall; CPU
    compute_cpu_ms: float | None = None  # (None: the run has no CPU figure)
    wall_fwd_bwd_ms: float = 0.0  # forward + backward, wall: how loaded it ran, for a twin
    load: dict[str, Any] | None = None  # its summary's contention (`cpu_time.run_load`)

    def twin_key(self) -> tuple:
        """Runs equal in everything but the network are twins."""
        return (self.system, self.model, replace(self.trace, data=str(Path(self.trace.data).resolve())),
                self.cluster.trainers, self.cluster.servers, self.workload)


def _round_len(train: dict[str, Any]) -> int:
    s = SYSTEMS.get(train.get("system"))
    return s.round_length(int(train.get("lookahead", 16)), train.get("round")) if s else 1


def compute_of(metrics: pd.DataFrame, warmup: int, round_len: int = 1,
               emulated: bool = True, clock: str = cpu_time.WALL) -> ComputeTimes:
    """Median compute phases of the measured iterations (see the module docstring); forward,
    backward and optimizer in `clock`'s time (`cpu_time.CPU`: the CPU columns).

    Without an emulated network (`emulated=False`), `prefetch_wait` is CPU work alone
    (gathering rows, inserting them into the cache) and becomes `fetch_cpu_ms`.
    """
    m = metrics.iloc[warmup:] if len(metrics) > warmup else metrics
    missing = [k for k in (*TIME_KEYS, "time") if k not in m.columns]
    if missing:
        raise DataError(f"metrics.csv lacks the time columns {', '.join(missing)}")
    starts = m[m.index % round_len == 0] if round_len > 1 else m
    other = m["time"] - m[list(TIME_KEYS)].sum(axis=1)

    def med(x: pd.Series) -> float:
        return max(0.0, 1e3 * float(np.median(x))) if len(x) else 0.0

    fwd, bwd, opt = cpu_time.columns(clock)
    return ComputeTimes(data_ms=med(starts["data"]), fwd_bwd_ms=med(m[fwd] + m[bwd]),
                        backward_ms=med(m[bwd]),
                        optimizer_ms=med(m[opt]), other_ms=med(other),
                        fetch_cpu_ms=0.0 if emulated else med(starts["prefetch_wait"]))


def read_measured(folder: Path) -> MeasuredRun:
    """A run folder as the model's inputs (settings, calibrated compute) and its measurement;
    DataError (naming the file) when it cannot be read."""
    stored = open_run(folder)
    config, summary, metrics = stored.config, stored.summary, stored.metrics
    train = config.get("train") or {}
    try:
        mcfg = ModelConfig(**config["model"])
        system = train["system"]
        data = recorded_path(config.get("dataset", {}), train["data"])  # absolute in new runs
    except (KeyError, TypeError) as e:
        raise DataError(f"{folder}/config.json: missing {e}; not a `bagpipe train` run") from None
    warmup = int(train.get("warmup", 0))
    m = metrics.iloc[warmup:] if len(metrics) > warmup else metrics
    distributed = train.get("transport") == "torch"
    # A --procs run's collectives cross loopback, not the sleep-emulated network: they take
    # what they took; with --net-shape they cross the shaped links, which the model has.
    on_network = not distributed or bool(train.get("net_shape"))
    width = int(config.get("row_dim", mcfg.emb_dim))
    trace = TraceConfig(
        data=str(data), batch_size=int(train["batch_size"]), iterations=int(train["iterations"]),
        lookahead=int(train.get("lookahead", 16)), round=train.get("round"),
        planners=_planners(summary, train),
        cache_rows=train.get("cache_rows"), staleness=int(train.get("staleness", 0)),
        trainers=int(train.get("trainers", 1)), servers=int(train.get("servers", 1)),
        eval_rows=train.get("eval_rows"), runtime="distributed" if distributed else "inproc",
        hot_sample=float(train.get("hot_sample", 1.0)), row_dim=width,
    )
    cluster = Cluster(int(train.get("trainers", 1)), int(train.get("servers", 1)),
                      train.get("net_gbps"), float(train.get("net_latency_us") or 0.0),
                      collectives_on_network=on_network, plans_on_network=on_network,
                      # runs before the exact sum: the distributed runtime all-gathered
                      collective=train.get("collective", "allgather" if distributed else "exact"))
    work = Workload(row_dim=width,
                    state_dim=state_dim(train.get("optimizer", "sgd")),
                    dense_bytes=dense_bytes(mcfg), warmup=warmup)
    bench = config.get("bench") or {}
    emulated = bool(summary.get("network_emulated", cluster.network.emulated))
    device = _device(config)
    clocks = cpu_time.clock_fields(m, summary, device)
    clock = clocks["compute_clock"]
    if distributed:
        compute = _distributed_compute(stored, warmup, _round_len(train), emulated, on_network,
                                       clock)
    else:
        compute = compute_of(metrics, warmup, _round_len(train), emulated, clock)
    return MeasuredRun(
        path=Path(folder), run_id=str(bench.get("run_id", Path(folder).name)), system=system,
        settings=_settings(train, data), trace=trace, cluster=cluster, workload=work, compute=compute,
        measured_median_ms=float(summary.get("median_iter_ms", math.nan)),
        measured_mean_ms=1e3 * float(m["time"].mean()) if len(m) else math.nan,
        network_emulated=emulated,
        model=mcfg.name,
        counted_plan_bytes=counted_plan_bytes(summary),
        counted_server_rows=counted_server_rows(summary, cluster.servers),
        counted_collective=counted_collective(summary, cluster.trainers),
        device=device, phased=_phased(m, trace.batch_size), **clocks,
    )


def _device(config: dict[str, Any]) -> str:
    d = ((config.get("layout") or {}).get("devices") or [{}])[0] or {}
    return str(d.get("gpu") or str(d.get("device") or "").split(":")[0])


def _phased(m: pd.DataFrame, batch_size: int) -> bool:
    """Whether some measured batch was split: 0 < popular samples < the batch."""
    p = m["popular_samples"] if "popular_samples" in m else pd.Series(dtype=float)
    return bool(((p > 0) & (p < batch_size)).any())


def counted_bytes(summary: dict[str, Any], role: str, kind: str) -> float | None:
    """The bytes of `kind` role `role` sent per iteration as the run counted them
    (`roles.<role>.traffic.sent_per_iteration.<kind>`); None where the run has no such count."""
    try:
        value = summary["roles"][role]["traffic"]["sent_per_iteration"][kind]
    except (KeyError, TypeError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _planners(summary: dict[str, Any], train: dict[str, Any]) -> int | None:
    """The planning workers a run's oracle had (its summary's, else its --planners)."""
    return summary.get("roles", {}).get("planner", {}).get("planners", train.get("planners"))


def counted_plan_bytes(summary: dict[str, Any]) -> float | None:
    """Rank 0's plan bytes per iteration (`counted_bytes` of the oracle's plans)."""
    return counted_bytes(summary, "planner", "plan")


def counted_server_rows(summary: dict[str, Any], servers: int) -> float | None:
    """The rows' bytes (with their optimizer state) all `servers` sent per iteration."""
    each = [counted_bytes(summary, f"server{k}", "rows") for k in range(servers)]
    return None if any(x is None for x in each) else float(sum(each))


def counted_collective(summary: dict[str, Any], trainers: int) -> list[float] | None:
    """Each trainer's collective bytes sent per iteration (its sums and, where the cache is
    partitioned, its exchanges of rows and partial gradients)."""
    each = [counted_bytes(summary, f"trainer{i}", "collective") for i in range(trainers)]
    return None if trainers < 2 or any(x is None for x in each) else [float(x) for x in each]


def _distributed_compute(stored: StoredRun, warmup: int, round_len: int, emulated: bool,
                         on_network: bool, clock: str) -> ComputeTimes:
    """A torch.distributed run's compute: the timers of its last trainer (the last a server
    serves in a lockstep pass, so its waits for rows are the ones the model predicts and its
    wait in the collectives holds no one else's fetch), its collectives as measured when they
    did not cross the modelled network, and the servers' CPU per iteration."""
    frame, summary = stored.metrics, stored.summary
    t = read_trainer_metrics(stored.folder, summary)
    if t is not None:
        frame = t[t["trainer"] == t["trainer"].max()].drop(columns="trainer").reset_index(drop=True)
    c = compute_of(frame, warmup, round_len, emulated, clock)
    m = frame.iloc[warmup:] if len(frame) > warmup else frame
    if not on_network:
        c = replace(c, sync_ms=1e3 * float(np.median(m["sync"])) if len(m) else 0.0)
    roles = summary.get("roles") or {}
    iters = max(1, len(frame))
    servers = [r for k, r in roles.items() if k.startswith("server")]
    cpu = [(r["busy_s"] - r.get("network_s", 0.0)) / iters for r in servers]
    c = replace(c, server_ms=1e3 * float(np.mean(cpu)) if cpu else 0.0)
    # Every process of a --procs run shares this machine's cores.
    placements = (stored.config.get("layout") or {}).get("placement")
    cores = {x for p in (placements or []) for x in p.get("compute", [])}
    demand = sum(r.get("cpu_s", 0.0) for r in roles.values())
    return replace(c, cpu_bound_ms=1e3 * demand / iters / len(cores) if cores else 0.0)


def _settings(train: dict[str, Any], data: Path) -> dict[str, Any]:
    """Every `TrainConfig` setting of a run: as recorded, else its default (a run from before
    the setting); `data` as the run's dataset folder."""
    return {f.name: train.get(f.name, None if f.default is MISSING else f.default)
            for f in fields(TrainConfig)} | {"data": str(data)}


def read_measured_runs(*paths: Path) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """Every readable run under `paths` (run folders, bench folders or parents), in-process
    or over torch.distributed (its trainers fetch and push what each needs:
    `TraceConfig.runtime`), and the runs skipped as unreadable (`results.read_runs`).

    An emulated-network run's `fetch_cpu_ms` (the CPU share of its waits for rows, which
    its timers cannot separate from the emulated transfer) comes from its no-network twins
    (same settings but the network): their median, scaled by the ratio of the two runs'
    forward+backward wall times (the machine's load when each ran).
    """
    runs, skipped = read_runs(paths, read_measured)
    _fetch_cpu_from_twins(runs)
    return runs, skipped


def measured_runs(*paths: Path) -> list[MeasuredRun]:
    """The runs of `read_measured_runs`, for callers that do not report the skipped ones."""
    return read_measured_runs(*paths)[0]


def _fetch_cpu_from_twins(runs: list[MeasuredRun]) -> None:
    twins: dict[tuple, list[MeasuredRun]] = {}
    for r in runs:
        if not r.network_emulated:
            twins.setdefault(r.twin_key(), []).append(r)
    for r in runs:
        if not r.network_emulated:
            r.fetch_cpu_from = "own prefetch_wait (no network)"
            continue
        ts = twins.get(r.twin_key())
        if not ts:
            r.fetch_cpu_from = "none (no no-network twin)"
            continue
        cpu = float(np.median([t.compute.fetch_cpu_ms for t in ts]))
        fb = float(np.median([t.wall_fwd_bwd_ms for t in ts]))
        load = r.wall_fwd_bwd_ms / fb if fb > 0 else 1.0
        r.compute = replace(r.compute, fetch_cpu_ms=cpu * load)
        r.fetch_cpu_from = f"{len(ts)} no-network twin(s)"


def calibrate(*paths: Path, model: str | None = None) -> tuple[dict[str, ComputeTimes], dict[str, Any]]:
    """Compute times per system from stored runs, for `--calibrate RESULTS`.

    Runs without an emulated network are preferred (their timers are least disturbed);
    `model` keeps only runs of that model. Of those, the runs of the most common model,
    device, batch size and trainer count (in turn) are used: what changes the compute. Each
    phase of a system is the median over its runs, but forward + backward, which is
    `shared_compute`'s one figure for every system that runs the model in one pass; a system
    without runs gets the median over the systems ("*"). Returns the compute per system and
    what it came from (batch size, trainers, model, device, runs used, the shared figure and
    each system's own, `warnings` (`shared_compute`'s) and `skipped`: the runs left out as
    unreadable, each {path, reason}), and their compute's clocks and loads (`cpu_time`).
    """
    runs, skipped = read_measured_runs(*paths)
    if model:
        runs = [r for r in runs if r.model == model]
        if not runs:
            raise DataError(f"--calibrate: no runs of model {model!r} under "
                            f"{', '.join(map(str, paths))}")
    quiet = [r for r in runs if not r.network_emulated]
    use = quiet or runs
    ref = {}
    for key, of in (("model", lambda r: r.model), ("device", lambda r: r.device),
                    ("batch_size", lambda r: r.trace.batch_size),
                    ("trainers", lambda r: r.cluster.trainers)):
        values = [of(r) for r in use]  # the most common value (the first of equals) decides
        ref[key] = max(dict.fromkeys(values), key=values.count)
        use = [r for r in use if of(r) == ref[key]]
    by_system = {s: [r for r in use if r.system == s] for s in sorted({r.system for r in use})}
    own = {s: _median_compute([r.compute for r in rs]) for s, rs in by_system.items()}
    shared = shared_compute(by_system, ref["model"])
    fb, bwd, warnings = shared["ms"], shared["backward_ms"], shared.pop("warnings")
    clocks = cpu_time.clock_record(use, "--calibrate")
    warnings += clocks.pop("warnings")
    out = {s: replace(c, fwd_bwd_ms=fb, backward_ms=bwd) if s in shared["systems"] else c
           for s, c in own.items()}
    out["*"] = replace(_median_compute(list(own.values())), fwd_bwd_ms=fb, backward_ms=bwd,
                       sync_ms=0.0, server_ms=0.0, cpu_bound_ms=0.0)
    source = {**ref, "device": ref["device"] or None, "runs": len(use), "network_emulated_runs": not quiet,
              "models": [ref["model"]], "fwd_bwd": shared, **clocks, "warnings": warnings,
              "paths": [str(p) for p in paths], "skipped": [s.to_dict() for s in skipped]}
    return out, source


DISAGREEMENT = COMPUTE_SPREAD  # systems' forward + backward further apart: not noise


def shared_compute(by_system: dict[str, list[MeasuredRun]], model: str) -> dict[str, Any]:
    """The model's forward + backward, one figure for every system that computes it in one
    pass: the median over their runs (each run's own figure is its median over its measured
    iterations); the backward its median share of it. A system whose runs split a batch in
    two passes (hotline), or that simulate has no model of (it skips samples, or runs
    another library), keeps its own figure. Returns {ms, backward_ms, systems (those that
    share it), measured_ms (each system's median), own (system: why it keeps its own),
    spread (slowest / fastest sharing system), disagreement, warnings}: one warning when
    the spread is above DISAGREEMENT, more than noise between runs of one model."""
    own: dict[str, str] = {}
    for s, rs in by_system.items():
        if not getattr(SYSTEMS.get(s), "volumes", None):
            own[s] = "simulate has no model of it"
        elif any(r.phased for r in rs):
            own[s] = "computes a batch in two passes"
    sharing = [s for s in by_system if s not in own]
    # Without such a system, "*" (a system without runs) takes the median over them all.
    pool = [r.compute for s in sharing or by_system for r in by_system[s]]
    fb = float(np.median([c.fwd_bwd_ms for c in pool]))
    shares = [c.bwd_ms / c.fwd_bwd_ms for c in pool if c.fwd_bwd_ms > 0]
    measured = {s: float(np.median([r.compute.fwd_bwd_ms for r in rs])) for s, rs in by_system.items()}
    figures = {s: measured[s] for s in sharing}
    lo, hi = min(figures.values(), default=0.0), max(figures.values(), default=0.0)
    spread = hi / lo if lo > 0 else (1.0 if hi == 0 else math.inf)
    warnings = []
    if spread > DISAGREEMENT:
        listed = ", ".join(f"{s} {x:.2f} ms" for s, x in sorted(figures.items(), key=lambda i: -i[1]))
        warnings.append(
            f"--calibrate: the runs of model {model} disagree on its forward+backward beyond "
            f"noise ({listed}: the slowest {spread:.2f}x the fastest, over {DISAGREEMENT:g}x); "
            "a loaded machine or oversubscribed threads slowed some of them: rerun them with "
            f"the machine idle, or with --threads 1. Every system uses the median, {fb:.2f} ms")
    return {"ms": fb, "backward_ms": fb * float(np.median(shares)) if shares else None,
            "systems": sharing, "measured_ms": measured, "own": own,
            "spread": spread, "disagreement": DISAGREEMENT, "warnings": warnings}


def _median_compute(cs: list[ComputeTimes]) -> ComputeTimes:
    """Each phase's median over `cs` (the backward: its median share of forward + backward)."""
    med = {f.name: float(np.median([getattr(c, f.name) for c in cs])) for f in fields(ComputeTimes)
           if f.name != "backward_ms"}
    shares = [c.bwd_ms / c.fwd_bwd_ms for c in cs if c.fwd_bwd_ms > 0]
    return ComputeTimes(**med, backward_ms=med["fwd_bwd_ms"] * float(np.median(shares)) if shares else None)

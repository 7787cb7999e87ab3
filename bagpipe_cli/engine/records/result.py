"""A finished run as a `TrainResult`: merged metrics, the summary, config.json, the tables,
and (asked for) the evaluations during training and the trace.

The in-process runtime and rank 0 of a distributed run both end here, with one
`RunRecord` (`run_record.py`), so every runner's summary has the same keys
(`records.SUMMARY_KEYS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from bagpipe_cli.data.checks import small_data_warning
from bagpipe_cli.data.format import read_rows
from bagpipe_cli.engine.comm.shards import assemble_tables
from bagpipe_cli.engine.planning.builders import Planning
from bagpipe_cli.engine.records.checkpoint import Checkpoint, Checkpointer
from bagpipe_cli.engine.records.metrics import (
    auc_warning,
    complete_summary,
    merge_records,
    summarize,
)
from bagpipe_cli.engine.records.run_record import RunRecord
from bagpipe_cli.engine.setup import RunSetup, run_config
from bagpipe_cli.engine.trainer.evaluation import accuracy_summary, eval_frame, evaluate
from bagpipe_cli.launch.contention import describe
from bagpipe_cli.launch.environment import peak_rss_mb
from bagpipe_cli.limits import machine_memory


@dataclass
class TrainResult:
    """What a run produced: per-iteration metrics, a summary, and the final parameters."""

    config: dict[str, Any]
    metrics: pd.DataFrame
    summary: dict[str, Any]
    model: torch.nn.Module
    tables: list[torch.Tensor]
    # every trainer process's own records (a `trainer` column first), when there are several
    trainer_metrics: pd.DataFrame | None = None
    evals: pd.DataFrame | None = None  # --eval-every: metrics_eval.csv's rows
    trace: dict[str, Any] | None = None  # --trace: the Chrome trace-event document
    warnings: list[str] = field(default_factory=list)  # for the user (the CLI prints them)


def checkpoint_summary(ckpt: Checkpointer | None, ck: Checkpoint | None,
                       median_iter_ms: float) -> dict[str, Any]:
    """Summary fields of checkpointing (timings) and of resuming (from where)."""
    out: dict[str, Any] = {"checkpoints": 0, "checkpoint_every": 0}
    if ckpt is not None:
        out.update(ckpt.summary(median_iter_ms))
    if ck is not None:
        out["resumed_from"] = {"checkpoint": str(ck.path), "iteration": ck.iteration,
                               "skipped": ck.skipped}
    return out


def planner_summary(planning: Planning) -> dict[str, Any]:
    """The planner's speed, the run's own peak of resident cache rows (its planner's: the
    oracle's, or the policy's), Bagpipe's peak at --lookahead (the baselines' default
    capacity) and the cache's capacity (bagpipe's grows to its need, at most an eighth above
    its peak); None without a cache."""
    p = planning.planner
    cached = planning.slots is not None
    return {"planner_ms_per_batch": p.ms_per_batch if p is not None else math.nan,
            "peak_resident_rows": int(p.peak_resident) if cached else None,
            "bagpipe_peak_rows": planning.bagpipe_peak, "cache_rows": planning.cache_rows}


def held_out_classes(s: RunSetup) -> dict[str, Any]:
    """How many held-out samples of each class the AUC rests on."""
    if s.eval_rows == 0:
        return {"eval_positives": 0, "eval_negatives": 0}
    y = read_rows(s.ds.labels, s.train_rows, s.train_rows + s.eval_rows)
    pos = int(np.count_nonzero(y))
    return {"eval_positives": pos, "eval_negatives": s.eval_rows - pos}


def contention_warning(c: dict[str, Any] | None) -> str | None:
    """A run made on a busy machine says so (launch/contention.py)."""
    return c["note"] if c and c.get("loaded") else None


def run_warnings(s: RunSetup, summary: dict[str, Any]) -> list[str]:
    """What the user should know about a run's figures: too few batches, a thin AUC."""
    cfg = s.cfg
    reads_lookahead = "lookahead" not in s.spec.ignored_settings(cfg.cache_rows)
    out = [small_data_warning(f"dataset {cfg.data}", s.train_rows // cfg.batch_size,
                              cfg.batch_size, cfg.lookahead if reads_lookahead else None),
           auc_warning(summary.get("eval_positives"), summary.get("eval_negatives")),
           contention_warning(summary.get("contention"))]
    return [w for w in out if w]


def finish_run(r: RunRecord) -> TrainResult:
    """The result of a run (`RunRecord`: what either runtime hands over): merged metrics,
    the summary, config.json and the tables."""
    s, cfg = r.setup, r.setup.cfg
    frames = r.frames
    metrics = merge_records(frames)
    summary = summarize(metrics, cfg.system, cfg.model, cfg.batch_size, cfg.warmup, r.wall)
    summary.update(evaluate(r.model, [sv.weight for sv in r.servers], s.ds, s.offsets,
                            s.train_rows, s.eval_rows))
    summary.update(held_out_classes(s))
    evals_df = eval_frame(r.evals) if cfg.eval_every else None
    summary.update(accuracy_summary(evals_df, cfg.target_auc, r.eval_s))
    summary.update(planner_summary(r.planning))
    emulated = cfg.net_gbps is not None or cfg.net_latency_us > 0
    summary.update({"network_emulated": emulated,
                    "network_shaping": ("kernel" if cfg.net_shape else "sleep") if emulated else None,
                    "train_rows": s.train_rows,
                    "eval_rows": s.eval_rows, "trainer_devices": r.layout.trainer_devices,
                    "backend": r.layout.backend, "world_size": r.layout.world,
                    "process_peak_rss_mb": peak_rss_mb(), **r.facts()})
    if "cores" in (summary.get("contention") or {}):  # its note's remedy: never the --threads 1 the run had
        summary["contention"] = describe(summary["contention"], torch_threads(r.layout.placement))
    held = [x["peak_resident_rows"] for x in r.roles.values()
            if x.get("peak_resident_rows") is not None]
    if held:  # a partitioned cache's: its largest trainer's (each trainer's in roles)
        summary["peak_resident_rows"] = max(held)
    summary["memory"] = memory_summary(s, r.roles)
    summary.update(checkpoint_summary(r.checkpointer, r.resumed, summary["median_iter_ms"]))
    runner = {"name": r.runner, "launch": _launch(cfg)}
    return TrainResult(run_config(s, r.layout.to_json(), runner), metrics, complete_summary(summary),
                       r.model, assemble_tables(r.servers, s.cardinalities), trainer_records(frames),
                       evals_df, r.trace, run_warnings(s, summary))


def torch_threads(placement: list[dict[str, Any]]) -> int | None:
    """The most torch threads a process of the run computed with (None where unrecorded)."""
    threads = [p["torch_threads"] for p in placement if isinstance(p.get("torch_threads"), int)]
    return max(threads) if threads else None


def memory_summary(s: RunSetup, roles: dict[str, Any]) -> dict[str, Any]:
    """The estimate the run was admitted on beside the measured peak: the sum of every rank's
    peak RSS (a process per role), or this process's; and the memory of the machine that
    wrote the summary (its own, or its cgroup's limit)."""
    peaks = [r["peak_rss_mb"] for r in roles.values() if r.get("peak_rss_mb") is not None]
    peak = sum(peaks) if peaks else peak_rss_mb()
    return {**s.memory.to_json(), "peak_bytes": int(peak * 2**20),
            "machine_bytes": machine_memory()}


def trainer_records(frames: list[pd.DataFrame]) -> pd.DataFrame | None:
    """Every trainer process's records in one frame (None for a single process)."""
    if len(frames) < 2:
        return None
    return pd.concat([f.assign(trainer=i) for i, f in enumerate(frames)], ignore_index=True)[
        ["trainer", *frames[0].columns]]


def _launch(cfg) -> str:
    if cfg.transport == "inproc":
        return "in-process"
    return "local processes (--procs)" if cfg.procs is not None else "external launcher (torchrun)"

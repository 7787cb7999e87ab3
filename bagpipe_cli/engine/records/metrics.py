"""What a run records: one definition of every `metrics.csv` column and `summary.json` key.

Every runner (in-process, torch.distributed, TorchRec) writes exactly these columns and keys,
and trainer processes' records are merged by one rule per column (`merge_records`). The
README's two tables list them in this order (tests/test_readme.py holds them equal);
`bagpipe_cli.results` writes and reads the files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from bagpipe_cli.engine.planning.plans import IterPlan
from bagpipe_cli.errors import ConfigError


@dataclass(frozen=True)
class Column:
    """One column of metrics.csv (one row per iteration)."""

    name: str
    merge: str  # how trainer processes' values combine: "max" (time), "sum" (traffic), "first"
    doc: str


TIME_KEYS = ("data", "prefetch_wait", "forward", "backward", "sync", "optimizer")
# CPU seconds beside the compute phases' wall seconds (engine/trainer/staging.py, PhaseClock):
# each phase's on the thread that runs it, and torch's intra-op workers' over the three.
CPU_PHASES = ("forward", "backward", "optimizer")
CPU_KEYS = (*(f"{k}_cpu" for k in CPU_PHASES), "worker_cpu")
COLUMNS = (
    Column("iteration", "first", "global iteration b (batch b of the training rows)"),
    Column("loss", "first", "mean BCE over the global batch (every trainer has the same value)"),
    Column("time", "max", "seconds of the iteration; a round's first iteration also carries "
                          "the round's start (receiving its plan, settling, inserting its rows)"),
    Column("data", "max", "seconds waiting for the round's batches and plan from the planner "
                          "(a round's first iteration)"),
    Column("prefetch_wait", "max", "seconds waiting for rows from the servers: the round's "
                                   "prefetched or fetched rows, and sync/het's per-iteration fetch"),
    Column("forward", "max", "seconds of the forward passes of the process's trainer slices"),
    Column("backward", "max", "seconds of their backward passes (row gradients included)"),
    Column("sync", "max", "seconds synchronising gradients between trainers: the critical "
                          "all-reduce (dense, sync_now rows, loss), starting the sync_later one, "
                          "and settling earlier sync_later sums (wait, apply, write back)"),
    Column("optimizer", "max", "seconds of the dense optimizer, row updates, and queueing "
                               "write-backs and gradient pushes"),
    Column("forward_cpu", "max", "CPU seconds of the forward passes on the thread that runs "
                                 "them (on a GPU: the host's, launching kernels)"),
    Column("backward_cpu", "max", "CPU seconds of the backward passes on that thread"),
    Column("optimizer_cpu", "max", "CPU seconds of the optimizer phase on that thread"),
    Column("worker_cpu", "max", "CPU seconds torch's intra-op worker threads ran during the "
                                "forward, backward and optimizer phases (0 with one torch thread)"),
    Column("compute_threads", "max", "the threads the CPU columns count: 1 + torch's intra-op "
                                     "workers found"),
    Column("unique_rows", "first", "|U_b|: distinct embedding rows of the global batch"),
    Column("rows_fetched", "sum", "rows transferred from the servers for this iteration (the "
                                  "sharded tables: from the rows' owners), summed over the "
                                  "trainers (a row every trainer fetches counts once each; "
                                  "in-process, what each trainer's rank would fetch)"),
    Column("rows_written_back", "sum", "rows (or row gradients) sent back to the servers (the "
                                       "sharded tables: to the rows' owners), summed over trainer "
                                       "processes"),
    Column("cache_hits", "first", "rows of U_b already on the trainer"),
    Column("sync_now", "first", "rows of U_b whose gradients are all-reduced on the critical path"),
    Column("sync_later", "first", "rows of U_b all-reduced asynchronously (LRPP)"),
    Column("no_sync", "first", "rows of U_b never all-reduced: private to one trainer (LRPP) or "
                               "pushed to the servers (sync, het)"),
    Column("stale_reads", "sum", "het: accesses that read a copy older than the servers'"),
    Column("popular_samples", "sum", "hotline: samples whose rows were all on the trainer, "
                                     "computed while the other samples' rows were fetched"),
    Column("fetch_overlap", "max", "hotline: seconds the iteration computed while its rows "
                                   "were being fetched (prefetch_wait is what was left to wait)"),
    Column("samples_skipped", "sum", "slipstream: samples of the global batch skipped because "
                                     "most of their rows were stale"),
    Column("stale_threshold", "first", "slipstream: the threshold T in force (a row whose change "
                                       "since the last snapshot is below it is stale; empty for "
                                       "other systems)"),
)
COLUMN_NAMES = tuple(c.name for c in COLUMNS)


@dataclass
class Step:
    """Per-iteration state in flight: the plan, the process's samples, and what it counted."""

    plan: IterPlan
    dense: torch.Tensor  # [local samples, D]
    labels: torch.Tensor  # [local samples]
    # seconds: the time columns' and the CPU ones' (CPU_KEYS, and "compute_threads")
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        (*TIME_KEYS, *CPU_KEYS, "compute_threads"), 0.0))
    rows_fetched: int = 0
    rows_written_back: int = 0
    cache_hits: int = 0
    stale_reads: int = 0
    popular_samples: int = 0
    fetch_overlap: float = 0.0
    samples_skipped: int = 0
    stale_threshold: float = math.nan
    sync_counts: tuple[int, int, int] = (0, 0, 0)  # (sync_now, sync_later, no_sync) rows


def iteration_record(step: Step, loss: float, seconds: float) -> dict[str, Any]:
    """One row of metrics.csv (every column of COLUMNS, in order)."""
    now, later, none = step.sync_counts
    rec = {"iteration": step.plan.b, "loss": loss, "time": seconds, **step.times,
           "compute_threads": int(step.times["compute_threads"]),
           "unique_rows": step.plan.unique_rows, "rows_fetched": step.rows_fetched,
           "rows_written_back": step.rows_written_back, "cache_hits": step.cache_hits,
           "sync_now": now, "sync_later": later, "no_sync": none, "stale_reads": step.stale_reads,
           "popular_samples": step.popular_samples, "fetch_overlap": step.fetch_overlap,
           "samples_skipped": step.samples_skipped, "stale_threshold": step.stale_threshold}
    return {c: rec[c] for c in COLUMN_NAMES}


def merge_records(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One metrics frame from every trainer process's (the same iterations in each): the
    run is as slow as its slowest trainer, traffic is summed, the rest is trainer 0's."""
    out = frames[0][list(COLUMN_NAMES)].copy()
    if len(frames) > 1:
        for c in COLUMNS:
            if c.merge != "first":
                stack = np.stack([f[c.name].to_numpy() for f in frames])
                out[c.name] = stack.max(axis=0) if c.merge == "max" else stack.sum(axis=0)
    return out


# summary.json: every runner writes every key (None where it does not apply).
SUMMARY_KEYS = {
    "system": "the system trained",
    "model": "the dense model",
    "iterations": "iterations recorded",
    "measured_iterations": "iterations after --warmup (the speed figures' sample)",
    "samples_per_s": "global-batch samples per second over the measured iterations: "
                     "--batch-size / mean_iter_ms",
    "mean_iter_ms": "mean iteration time (the measured iterations' seconds / their count)",
    "median_iter_ms": "median iteration time", "p10_iter_ms": "10th percentile",
    "p90_iter_ms": "90th percentile",
    "median_time_ms": "median of every time column (ms)",
    "median_cpu_ms": "median of every CPU column (ms): forward_cpu, backward_cpu, "
                     "optimizer_cpu, worker_cpu",
    "median_compute_ms": "the compute phases per iteration (ms, medians over the measured "
                         "iterations): wall (forward + backward + optimizer), cpu (the same "
                         "phases' CPU time on the thread that runs them: what the model takes), "
                         "cpu_all_threads (with torch's workers' added), compute_threads",
    "rows_fetched": "total of the column", "rows_written_back": "total of the column",
    "cache_hits": "total of the column", "unique_rows": "total of the column",
    "rows_fetched_once": "unique_rows - cache_hits, totalled: the rows of U_b no trainer held, "
                         "each once however many trainers fetched it (the logical cache's "
                         "fetches; rows_fetched counts each trainer's)",
    "final_loss": "loss of the last iteration", "final_loss_mean10": "mean loss of the last 10",
    "wall_s": "seconds from the start of training to the last write-back (--eval-every's "
              "evaluations left out)",
    "eval_auc": "AUC on the held-out tail", "eval_logloss": "log loss on the held-out tail",
    "eval_positives": "held-out samples labelled 1", "eval_negatives": "held-out samples labelled 0",
    "evaluations": "--eval-every: evaluations during training (rows of metrics_eval.csv)",
    "eval_s": "seconds those evaluations took (apart from training)",
    "best_eval_auc": "the highest AUC among them (None without any)",
    "target_auc": "--target-auc",
    "time_to_target_s": "seconds of training to the first evaluation reaching --target-auc "
                        "(None: not reached)",
    "iterations_to_target": "iterations trained at that evaluation",
    "popular_share": "hotline: the share of samples computed while the others' rows were "
                     "fetched (None: no iteration split its batch)",
    "fetch_overlap_s": "hotline: seconds of compute that ran while rows were fetched (total)",
    "samples_skipped": "slipstream: samples skipped (total)",
    "skipped_share": "slipstream: the share of the samples skipped",
    "stale_thresholds": "slipstream: each threshold T it used, with the iteration it was set "
                        "(None for other systems)",
    "planner_ms_per_batch": "the planner's milliseconds per batch (NaN without one)",
    "peak_resident_rows": "the run's own peak of resident cache rows (None without a planned cache)",
    "bagpipe_peak_rows": "bagpipe's peak resident rows at --lookahead: the default --cache-rows "
                         "(None without a planned cache)",
    "cache_rows": "the cache's capacity in rows (None without a cache)",
    "network_emulated": "whether --net-gbps/--net-latency-us delayed transfers",
    "network_shaping": "how: sleep (per transfer) or kernel (--net-shape: rate-limited links)",
    "train_rows": "training rows", "eval_rows": "held-out rows",
    "rows_written_back_at_end": "rows still cached when training ended, written back then",
    "runner": "inproc, distributed or torchrec",
    "transport": "inproc or torch (torch.distributed)",
    "world_size": "processes of the run (1 in-process)",
    "backend": "the trainers' collective backend (None in-process)",
    "trainer_devices": "the device of every trainer",
    "roles": "per role (planner, each trainer process, each server): busy_s, waiting_s, "
             "bytes_sent, bytes_received, cpu_s and (one process per role) peak_rss_mb; "
             "trainers also collective_bytes_sent/_received and collective_exposed_s/"
             "_overlapped_s; the planner of a distributed run bytes_per_iteration; the "
             "oracle's planners (its workers), worker_cpu_ms_per_batch (each one's thread CPU "
             "time) and serial_cpu_ms_per_batch (its own thread's, the slices laid together); every "
             "role's traffic: bytes sent and received by kind (plan, samples, rows, "
             "gradients, collective, control), in total and per iteration (in-process: the "
             "planner's, the trainers' process's (what its trainers' ranks together would "
             "send and receive; collective_bytes_by_trainer: each one's collective bytes) "
             "and each server's, control 0)",
    "contention": "how much of the machine the run had (launch/contention.py): cores, "
                  "load_per_core (other runnable tasks per core at the start), loadavg (1-min, "
                  "start and end), run_queue_wait_share (of its compute threads' runnable "
                  "time, the share spent waiting for a CPU), steal_share, loaded, note",
    "process_peak_rss_mb": "peak resident memory (MiB) of the process that wrote the summary: "
                           "every role in-process, rank 0 (the planner) in a distributed run",
    "memory": "estimate_bytes: the memory the run was admitted on (engine/memory.py), every "
              "rank's summed; peak_bytes: the measured peak RSS, every rank's summed; processes; "
              "parts: the estimate by part (tables, planner, caches, dense model, inputs, "
              "activations, evaluation, processes); machine_bytes: the memory of the machine "
              "that wrote the summary (its cgroup's limit where lower)",
    "checkpoints": "checkpoints written", "checkpoint_every": "--checkpoint-every",
    "checkpoint_ms": "milliseconds of each checkpoint", "checkpoint_ms_median": "their median",
    "checkpoint_overhead_pct": "median checkpoint / (every x median iteration), in %",
    "checkpoint_dir": "where they are (None: a temporary folder, removed)",
    "last_checkpoint": "the newest one",
    "resumed_from": "{checkpoint, iteration, skipped} when --resume was given",
}


def summarize(metrics: pd.DataFrame, system: str, model: str, batch_size: int, warmup: int,
              wall: float) -> dict[str, Any]:
    """Speed and totals; the first `warmup` iterations are excluded from speed figures."""
    m = metrics.iloc[warmup:] if len(metrics) > warmup else metrics
    it = m["time"].to_numpy()

    def pct(q: float) -> float:
        return 1e3 * float(np.percentile(it, q)) if len(it) else math.nan

    return {
        "system": system, "model": model, "iterations": int(len(metrics)),
        "measured_iterations": int(len(m)),
        "samples_per_s": float(batch_size * len(it) / it.sum()) if len(it) and it.sum() > 0 else math.nan,
        "mean_iter_ms": 1e3 * float(it.mean()) if len(it) else math.nan,
        "median_iter_ms": 1e3 * float(np.median(it)) if len(it) else math.nan, "p10_iter_ms": pct(10), "p90_iter_ms": pct(90),
        "median_time_ms": {k: 1e3 * float(m[k].median()) for k in TIME_KEYS},
        **cpu_figures(m),
        **{k: int(metrics[k].sum()) for k in ("rows_fetched", "rows_written_back", "cache_hits",
                                               "unique_rows")},
        "rows_fetched_once": int((metrics["unique_rows"] - metrics["cache_hits"]).sum()),
        **split_figures(metrics, batch_size),
        "final_loss": float(metrics["loss"].iloc[-1]),
        "final_loss_mean10": float(metrics["loss"].iloc[-10:].mean()),
        "wall_s": wall,
    }


def cpu_figures(m: pd.DataFrame) -> dict[str, Any]:
    """The CPU columns' medians and the compute phases' wall and CPU time per iteration
    (`m`: the measured iterations; NaN where a runner did not measure CPU time)."""
    def med(x: pd.Series) -> float:
        return 1e3 * float(x.median()) if len(x) else math.nan

    own = [f"{k}_cpu" for k in CPU_PHASES]
    threads = m["compute_threads"].max() if len(m) else math.nan
    return {"median_cpu_ms": {k: med(m[k]) for k in CPU_KEYS},
            "median_compute_ms": {
                "wall": med(m[list(CPU_PHASES)].sum(axis=1)),
                "cpu": med(m[own].sum(axis=1, min_count=len(own))),
                "cpu_all_threads": med(m[list(CPU_KEYS)].sum(axis=1, min_count=len(CPU_KEYS))),
                "compute_threads": None if pd.isna(threads) else int(threads)}}


def split_figures(metrics: pd.DataFrame, batch_size: int) -> dict[str, Any]:
    """Hotline's and slipstream's figures: how batches were split or thinned (columns a run
    written before them lacks count as zero)."""
    def col(name: str, fill: float = 0.0) -> pd.Series:
        return metrics[name] if name in metrics else pd.Series(fill, index=metrics.index)

    samples = batch_size * len(metrics)
    popular, overlap, skipped = col("popular_samples"), col("fetch_overlap"), col("samples_skipped")
    split = bool((popular > 0).any() or (overlap > 0).any())
    t = col("stale_threshold", math.nan)
    changes = t.notna() & (t != t.shift())
    return {
        "popular_share": float(popular.sum() / samples) if split and samples else None,
        "fetch_overlap_s": float(overlap.sum()),
        "samples_skipped": int(skipped.sum()),
        "skipped_share": float(skipped.sum() / samples) if samples else 0.0,
        "stale_thresholds": ([{"iteration": int(metrics["iteration"][i]), "threshold": float(t[i])}
                              for i in metrics.index[changes]] if changes.any() else None),
    }


MIN_AUC_CLASS = 30  # fewer held-out samples of a class than this: the AUC says little


def auc_warning(positives: Any, negatives: Any) -> str | None:
    """A warning when a held-out AUC rests on fewer than MIN_AUC_CLASS samples of a class
    (None when it does not, or the counts are unknown or zero: no AUC then)."""
    if positives is None or negatives is None or not positives + negatives:
        return None
    low = min(positives, negatives)
    if low >= MIN_AUC_CLASS:
        return None
    return (f"the held-out AUC rests on {positives:,} positive and {negatives:,} negative "
            f"samples (fewer than {MIN_AUC_CLASS} of one class), so it says little; raise "
            "--eval-rows")


def check_loss(loss: float, iteration: int, cfg: Any) -> None:
    """Stop a run whose loss is no longer a number: nothing it trains after that means anything.
    `cfg` (a TrainConfig) gives the steps the message names."""
    if not math.isfinite(loss):
        what = "NaN" if math.isnan(loss) else f"{loss}"
        adam = ", try --dense-optimizer adam" if cfg.dense_optimizer == "sgd" else ""
        raise ConfigError(f"the loss became {what} at iteration {iteration}; lower --lr "
                          f"({cfg.lr:g}) or --dense-lr ({cfg.dense_learning_rate:g}; dcn's cross "
                          f"layers often need 0.01){adam}, or check the dataset's dense values")


def complete_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` with every SUMMARY_KEYS key (None where absent), in schema order."""
    unknown = set(summary) - set(SUMMARY_KEYS)
    if unknown:
        raise ValueError(f"summary keys outside the schema: {sorted(unknown)}")
    return {k: summary.get(k) for k in SUMMARY_KEYS}


def role_figures(frame: pd.DataFrame, **extra: Any) -> dict[str, Any]:
    """A trainer process's busy and waiting seconds from its own records (none: 0)."""
    f = frame.reindex(columns=["forward", "backward", "optimizer", "prefetch_wait", "sync"],
                      fill_value=0.0)
    return {"busy_s": float(f[["forward", "backward", "optimizer"]].sum().sum()),
            "waiting_s": float(f["prefetch_wait"].sum() + f["sync"].sum()), **extra}

"""Held-out evaluation: log loss and AUC of the trained model on the dataset's tail rows, at the
end of training and, with --eval-every N, every N iterations (metrics_eval.csv); the time a
run takes to reach a target AUC."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from bagpipe_cli.data.format import Dataset
from bagpipe_cli.engine.comm.shards import split_by_shard
from bagpipe_cli.engine.planning.keys import batch_keys

if TYPE_CHECKING:
    from bagpipe_cli.engine.setup import RunSetup

def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (rank statistic, ties get their average rank); NaN if one class."""
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # average ranks over runs of equal scores
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    avg = (starts + ends + 1) / 2.0  # 1-based average rank of each run
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


# metrics_eval.csv: one row per evaluation during training.
EVAL_COLUMNS = ("iteration", "wall_s", "auc", "logloss")
EVAL_DOCS = {
    "iteration": "iterations trained when it was evaluated (the boundary before iteration b: b)",
    "wall_s": "seconds of training so far (from the start of training; evaluations left out)",
    "auc": "AUC on the held-out tail, with the tables' true values then",
    "logloss": "log loss on the held-out tail",
}


@torch.no_grad()
def evaluate(model: torch.nn.Module, shards: list[torch.Tensor], ds: Dataset, offsets: np.ndarray,
             start: int, n: int, batch: int = 8192) -> dict[str, float]:
    """Log loss and AUC on rows [start, start+n), with the tables as the servers store them
    (`shards[k]`: the weight of shard k, rows with key % K == k)."""
    if n == 0:
        return {"eval_auc": float("nan"), "eval_logloss": float("nan")}
    k = len(shards)
    scores, labels = [], []
    for lo in range(start, start + n, batch):
        bt = ds.slice(lo, min(lo + batch, start + n))
        keys = batch_keys(bt.sparse, offsets)
        emb = torch.empty(len(keys), shards[0].shape[1])
        for s, (pos, local) in enumerate(split_by_shard(keys, k)):
            emb[torch.from_numpy(pos)] = shards[s][torch.from_numpy(local)]
        logits = model(torch.from_numpy(np.ascontiguousarray(bt.dense)),
                       emb.view(len(bt.labels), -1, emb.shape[1]))
        scores.append(logits.numpy())
        labels.append(np.asarray(bt.labels))
    s = np.concatenate(scores).astype(np.float64)
    y = np.concatenate(labels).astype(np.float64)
    logloss = float(np.mean(np.logaddexp(0, s) - y * s))
    return {"eval_auc": auc(y, s), "eval_logloss": logloss}


def eval_point(s: RunSetup, b: int, wall_s: float, model: torch.nn.Module,
               weight: torch.Tensor) -> dict[str, Any]:
    """One row of metrics_eval.csv: `model` (a copy is moved to the CPU; the original is not
    touched) with the full tables `weight` (global key order) after `b` iterations."""
    cpu = copy.deepcopy(model).cpu()
    r = evaluate(cpu, [weight], s.ds, s.offsets, s.train_rows, s.eval_rows)
    return {"iteration": b, "wall_s": wall_s, "auc": r["eval_auc"], "logloss": r["eval_logloss"]}


def eval_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """metrics_eval.csv's table from its rows (EVAL_COLUMNS, in order)."""
    return pd.DataFrame(rows, columns=list(EVAL_COLUMNS))


def time_to_target(evals: pd.DataFrame, target: float | None) -> tuple[float, int] | None:
    """(wall seconds, iterations) of the first evaluation whose AUC reaches `target`, as
    MLPerf scores time to accuracy: at an evaluation, not interpolated between two. None when
    there is no target or the run never reaches it."""
    if target is None or evals is None or not len(evals):
        return None
    hit = evals[evals["auc"].to_numpy(dtype=float) >= target]
    if not len(hit):
        return None
    first = hit.sort_values("iteration").iloc[0]
    return float(first["wall_s"]), int(first["iteration"])


def accuracy_summary(evals: pd.DataFrame | None, target: float | None,
                     eval_s: float) -> dict[str, Any]:
    """summary.json's keys of the evaluations during training (see records.SUMMARY_KEYS)."""
    n = 0 if evals is None else len(evals)
    reached = time_to_target(evals, target) if n else None
    aucs = evals["auc"].to_numpy(dtype=float) if n else np.array([math.nan])
    best = float(np.nanmax(aucs)) if not np.isnan(aucs).all() else math.nan
    return {"evaluations": n, "eval_s": eval_s, "best_eval_auc": best if n else None,
            "target_auc": target,
            "time_to_target_s": reached[0] if reached else None,
            "iterations_to_target": reached[1] if reached else None}

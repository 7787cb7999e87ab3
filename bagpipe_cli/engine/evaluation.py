"""Held-out evaluation: log loss and AUC of the trained model on the dataset's tail rows."""

from __future__ import annotations

import numpy as np
import torch

from bagpipe_cli.data.format import Dataset
from bagpipe_cli.engine.keys import batch_keys
from bagpipe_cli.engine.shards import split_by_shard
from bagpipe_cli.metrics import auc


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

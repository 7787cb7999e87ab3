"""The batch and plan feed: global batches in order, planned a round at a time.

    planned_rounds:  batch b.. of the training rows -> the planner -> (RoundPlan, its batches)

The in-process runtime runs `planned_rounds` on its loader thread (`engine/local/loader.py`);
rank 0 of a distributed run runs it directly and sends each trainer its slice
(`engine/distributed/loader.py`).

The training loop reads `Round`s: a round's plan and, per iteration, the dense features and
labels of the samples this process trains on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bagpipe_cli.data.format import Batch, Dataset
from bagpipe_cli.engine.keys import batch_keys
from bagpipe_cli.engine.oracle import Oracle, RoundPlan

if TYPE_CHECKING:
    from bagpipe_cli.engine.config import TrainConfig
    from bagpipe_cli.engine.planner import PolicyPlanner


@dataclass
class Round:
    """A round's plan and, per iteration, the dense features and labels of this process's samples."""

    plan: RoundPlan
    dense: list[np.ndarray]
    labels: list[np.ndarray]


def iter_train_batches(ds: Dataset, cfg: TrainConfig, train_rows: int, start: int = 0) -> Iterator[Batch]:
    """Global batches start.. in dataset order, wrapping around at the end of the training rows.

    Batch b is the same whatever `start` is, which is what makes a resumed run exact.
    """
    per_epoch = train_rows // cfg.batch_size
    for b in range(start, cfg.iterations):
        lo = (b % per_epoch) * cfg.batch_size
        yield ds.slice(lo, lo + cfg.batch_size, b)


def key_batches(ds: Dataset, cfg: TrainConfig, train_rows: int, offsets: np.ndarray,
                start: int = 0) -> Iterator[np.ndarray]:
    """The global row keys [B*T] of every batch of `iter_train_batches`."""
    return (batch_keys(b.sparse, offsets) for b in iter_train_batches(ds, cfg, train_rows, start))


def planned_rounds(ds: Dataset, cfg: TrainConfig, train_rows: int, planner: Oracle | PolicyPlanner,
                   offsets: np.ndarray, start: int = 0) -> Iterator[tuple[RoundPlan, list[Batch]]]:
    """(plan, batches) of every round of iterations start.. (a resumed run plans only those:
    its planner counts from 0, so plans are shifted to start..)."""
    held: list[Batch] = []

    def keys() -> Iterator[np.ndarray]:
        for batch in iter_train_batches(ds, cfg, train_rows, start):
            held.append(batch)
            yield batch_keys(batch.sparse, offsets)

    for rp in planner.plan(keys()):
        if start:
            for it in rp.iters:
                it.b += start
        batches = held[: len(rp.iters)]
        del held[: len(rp.iters)]
        yield rp, batches

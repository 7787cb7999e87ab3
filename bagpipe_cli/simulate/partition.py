"""Bagpipe's partitioned cache in the volumes (engine/planning/partition.py): what each trainer moves.

Where the oracle partitions U_b (bagpipe, N > 1), every iteration's `Partition` says which
trainers read each row (its writers), where the row is before b (its home, or the servers)
and where after. `flows` counts, per trainer, the rows that moves: fetched from the servers
(a row fetched for b goes to every writer of b), delivered from homes to writers before b
reads, and the partial gradients sent to homes (sync_now on the critical path, sync_later in
the background). `record_round` copies them into the volumes' `Exchanges` and gives the rows
the servers send for the round, as a torch.distributed run's trainers ask for them.
"""

from __future__ import annotations

import numpy as np

from bagpipe_cli.engine.planning.partition import flows
from bagpipe_cli.engine.planning.plans import RoundPlan
from bagpipe_cli.simulate.inputs import Exchanges


def by_shard(keys: np.ndarray, k: int) -> np.ndarray:
    """Rows per server shard (`key % k`: every server has its own link)."""
    return np.bincount(np.asarray(keys, np.int64) % k, minlength=k)


def record_round(ex: Exchanges, rp: RoundPlan, servers: int) -> np.ndarray:
    """Fill `ex` for the round's iterations from their Partitions; returns, per shard (`key %
    servers`), the rows the servers send for the round over torch.distributed: each trainer
    fetches its own rows fetched for an iteration it reads them at (the sum over the
    trainers of `flows(...).fetched`)."""
    fetched = np.zeros(servers, np.int64)
    for p in rp.iters:
        ex.record(p.b, flows(p.part, p.row_class, ex.trainers))
        new = p.part.src < 0  # fetched for b: one copy to each of its writers
        keys = np.repeat(p.uniq[new], p.part.count[new].astype(np.int64))
        fetched += by_shard(keys, servers)
    return fetched

"""The volumes of the sharded tables (`sharded`, `sharded-hot`: engine/systems/sharded.py).

Per iteration each trainer asks the other trainers' shards for the cold rows its samples
read (row k is trainer k mod N's) and serves what they ask of its own: `Volumes.shards`
[I, 2, N], the rows asked and served. The all-to-alls then move, per trainer, the counts
(8 bytes to each other trainer), the ids asked (8 bytes a row), the rows served back (the
row's floats, no optimizer state) and the partial gradients of the rows asked; each lasts
as long as its busiest trainer's share (`model.py`). sharded-hot's hot rows cross in
neither: their gradients over U_b are summed among all trainers (`sync_now`). They are the
engine's (`engine/systems/sharded_hot.py`'s `rows_that_pay`, the same function over the same
profiled batches): the rows whose sum moves fewer bytes per trainer than their all-to-alls.
The servers send the tables once before training, untimed (`setup_rows`): each trainer
its shard (and sharded-hot's every trainer the hot rows).
"""

from __future__ import annotations

import numpy as np

from bagpipe_cli.engine.registry import SystemSpec
from bagpipe_cli.engine.systems.sharded_hot import rows_that_pay
from bagpipe_cli.simulate.inputs import Volumes
from bagpipe_cli.simulate.volumes import _no_plan, _planless_round, _Trace


def _volumes(t: _Trace, s: SystemSpec, hot: np.ndarray | None) -> Volumes:
    n = t.cfg.trainers
    v = t.empty(s.name)
    v.shards = np.zeros((t.iterations, 2, n), np.int64)
    for rp, (keys,) in t.planned(_no_plan(t), v, hold_keys=True):
        b, uniq = rp.iters[0].b, rp.iters[0].uniq
        v.unique_rows[b] = len(uniq)
        for i, mine in enumerate(t.slices(keys)):
            own = (mine if hot is None else mine[~hot[mine]]) % n
            v.shards[b, 0, i] = int((own != i).sum())
            v.shards[b, 1] += np.bincount(own[own != i], minlength=n)
        if hot is not None:
            v.sync_now[b] = int(hot[uniq].sum())
        _planless_round(t, s, v, b, uniq)
    if t.distributed:
        v.setup_rows = t.total + (0 if hot is None else int(hot.sum()) * (n - 1))
    return v


def sharded_volumes(t: _Trace, s: SystemSpec) -> Volumes:
    """sharded: every row of a trainer's samples that another trainer owns crosses."""
    return _volumes(t, s, None)


def sharded_hot_volumes(t: _Trace, s: SystemSpec) -> Volumes:
    """sharded-hot: only the cold ones; the rows that pay are summed among the trainers."""
    c = t.cfg
    return _volumes(t, s, rows_that_pay(t.keys, t.iterations, c.hot_sample, c.trainers,
                                        c.row_dim, t.total))

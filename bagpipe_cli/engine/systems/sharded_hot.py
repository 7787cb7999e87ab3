"""sharded-hot: sharded, plus the hot rows replicated on every trainer (the pattern-aware
sparse communication of the PPoPP'24 poster): the hot rows' gradients are summed among all
trainers in trainer order, and only the cold rows cross in the all-to-alls.

The hot set is FAE's: the --cache-rows most-accessed rows of the run's first --hot-sample
share of batches (by default as many as Bagpipe's peak at --lookahead, as fae's cache),
profiled by every process from the same batches, so every trainer finds the same set.
The mechanism is `sharded.py`'s (its `hot`).
"""

from __future__ import annotations

import numpy as np

from bagpipe_cli.engine.planning.builders import peak_capacity, trace_of
from bagpipe_cli.engine.planning.feed import key_batches
from bagpipe_cli.engine.systems.base import SystemParts
from bagpipe_cli.engine.systems.sharded import ShardedSystem
from bagpipe_cli.policies.decisions import HotSetDecisions


def hot_set(p: SystemParts) -> np.ndarray:
    """The hot rows' keys, sorted: fae's hot set of the run (see the module docstring)."""
    s = p.setup
    _, capacity = peak_capacity(s)
    trace = trace_of(key_batches(s.ds, s.cfg, s.train_rows, s.offsets), s.total_rows)
    return HotSetDecisions(trace, capacity, s.cfg.hot_sample).hot_keys.astype(np.int64)


def sharded_hot_system(p: SystemParts) -> ShardedSystem:
    return ShardedSystem(p.transport, p.trainers, p.setup.total_rows, p.servers, p.device,
                         hot=hot_set(p))

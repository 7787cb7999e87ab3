"""One clock for a distributed run's trace: every rank's offset to rank 0's clock, measured
at start-up over the job's gloo group.

Each rank pings rank 0 a few times: it sends nothing but a number, rank 0 answers with its
clock (`time.perf_counter`) when the ping arrives, and the rank reads its own clock before
the ping (t1) and after the answer (t2). Rank 0's clock read t0 happened between t1 and t2,
so with a symmetric path rank 0's clock - this rank's = t0 - (t1 + t2) / 2, within half the
round trip. The ping with the shortest round trip is kept (the least queueing, the tightest
bound). Ranks on one machine share the monotonic clock: their offsets are ~0, which is how
the measurement is checked.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.engine.distributed.wire import comm

PINGS = 16


def clock_offset(layout: Layout, rank: int, pings: int = PINGS) -> tuple[float, float]:
    """(offset, round trip) in seconds: this rank's `perf_counter()` + offset is rank 0's.
    Every rank calls it at the same point; rank 0 answers the others in turn (its own
    offset is 0)."""
    buf = torch.zeros(1, dtype=torch.float64)
    if rank == 0:
        for r in range(1, layout.world):
            for _ in range(pings):
                comm(layout, r, dist.recv, buf, r)
                buf[0] = time.perf_counter()
                comm(layout, r, dist.send, buf, r)
        return 0.0, 0.0
    best_rtt, offset = math.inf, 0.0
    for _ in range(pings):
        t1 = time.perf_counter()
        comm(layout, 0, dist.send, buf, 0)
        comm(layout, 0, dist.recv, buf, 0)
        t2 = time.perf_counter()
        if t2 - t1 < best_rtt:
            best_rtt, offset = t2 - t1, float(buf[0]) - (t1 + t2) / 2
    return offset, best_rtt

"""A round's plan leaves rank 0 once, down a binary tree of the trainers; or, a partitioned
cache's, rank 0 sends each trainer its own (`rounds.py`'s `trainer_round`), point to point.

Relayed, rank 0 sends each round to trainer 0; trainer j passes it on, as it arrived, to
trainers 2j+1 and 2j+2 before it makes its own Round of it. So rank 0's link carries one
copy of a round whatever the number of trainers, a trainer's at most two, and a round
reaches the last of N trainers after about log2(N) + 1 hops. A partitioned cache's trainers
each need another share of the plan (the rows they read or are home of), so there is nothing
to pass on: rank 0 sends trainer 0's, then trainer 1's, and so on, and a trainer's link
carries its own plan alone (about a tenth of the whole at 8 trainers), rank 0's every
trainer's. A trainer takes round r+1 at the start of round r (the training loop peeks a
round ahead to prefetch its rows), so rank 0 plans and sends it while the trainers train
round r-1. The plans have a process group of their own (rank 0 and the trainers) and are
received on the training thread: every trainer reaches a round's start after the previous
round's collectives, so a parent's send always meets its child's receive. (Not on a thread
of its own: a thread left inside a blocking receive of gloo's when its process is stopped
aborts the process, and gloo's receives cannot be given up.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from bagpipe_cli.engine.comm.traffic import Traffic
from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.engine.distributed.wire import decode, recv_encoded, send_encoded
from bagpipe_cli.engine.planning.feed import Round
from bagpipe_cli.engine.planning.plans import RoundPlan

FANOUT = 2


def parent(j: int) -> int | None:
    """The trainer trainer j receives plans from (None: rank 0)."""
    return None if j == 0 else (j - 1) // FANOUT


def children(j: int, n: int) -> list[int]:
    """The trainers trainer j of n passes plans on to."""
    return [c for c in range(FANOUT * j + 1, FANOUT * j + FANOUT + 1) if c < n]


class PlanFeed:
    """Trainer i's end of the plans (see the module docstring): iterating yields its Rounds,
    made of each plan by `make`, until rank 0 sends None. Not `relayed`: each plan comes
    from rank 0 and goes no further."""

    def __init__(self, layout: Layout, group: Any, i: int, make: Callable[[RoundPlan], Round],
                 traffic: Traffic, relayed: bool = True):
        up = parent(i) if relayed else None
        self.src = 0 if up is None else layout.trainer_rank(up)
        self.dst = [layout.trainer_rank(c) for c in children(i, layout.trainers)] if relayed else []
        self.layout, self.group, self.make, self.traffic = layout, group, make, traffic

    def __iter__(self) -> Iterator[Round]:
        while True:
            enc = recv_encoded(self.src, self.layout, group=self.group)
            self.traffic.receive("plan", enc.nbytes)
            for dst in self.dst:  # passed on before this trainer reads a sample of it
                self.traffic.send("plan", send_encoded(enc, dst, self.layout, self.group))
            rp = decode(enc)
            if rp is None:
                return
            yield self.make(rp)

"""A round's plan leaves rank 0 once, down a binary tree of the trainers.

Rank 0 sends each round to trainer 0; trainer j passes it on, as it arrived, to trainers
2j+1 and 2j+2 before it makes its own Round of it. So rank 0's link carries one copy of a
round whatever the number of trainers, a trainer's at most two, and a round reaches the
last of N trainers after about log2(N) + 1 hops; rounds travel a few ahead of use, which
hides the hops. The relay has a process group of its own (rank 0 and the trainers), and on
a trainer it runs on a thread of its own: receiving and passing on waits neither for the
training loop nor the loop for it, until `depth` rounds are ready.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.engine.distributed.wire import decode, recv_encoded, send_encoded
from bagpipe_cli.engine.feed import Round
from bagpipe_cli.engine.oracle import RoundPlan
from bagpipe_cli.engine.traffic import Traffic

FANOUT = 2


def parent(j: int) -> int | None:
    """The trainer trainer j receives plans from (None: rank 0)."""
    return None if j == 0 else (j - 1) // FANOUT


def children(j: int, n: int) -> list[int]:
    """The trainers trainer j of n passes plans on to."""
    return [c for c in range(FANOUT * j + 1, FANOUT * j + FANOUT + 1) if c < n]


class PlanFeed:
    """Trainer i's end of the relay (see the module docstring): iterating yields its Rounds,
    made of each plan by `make`, until rank 0 sends None; an error on the thread is raised
    there. `first_wait_s` bounds the wait for the first plan (rank 0 may plan first)."""

    def __init__(self, layout: Layout, group: Any, i: int, make: Callable[[RoundPlan], Round],
                 traffic: Traffic, first_wait_s: float | None = None, depth: int = 2):
        up = parent(i)
        self.src = 0 if up is None else layout.trainer_rank(up)
        self.dst = [layout.trainer_rank(c) for c in children(i, layout.trainers)]
        self.layout, self.group, self.make, self.traffic = layout, group, make, traffic
        self.first_wait_s = first_wait_s
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="plans", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wait = self.first_wait_s
        try:
            while True:
                enc = recv_encoded(self.src, self.layout, wait, self.group)
                wait = None
                self.traffic.receive("plan", enc.nbytes)
                for dst in self.dst:
                    self.traffic.send("plan", send_encoded(enc, dst, self.layout, self.group))
                rp = decode(enc)
                if rp is None:
                    self._q.put(None)
                    return
                self._q.put(self.make(rp))
        except BaseException as e:  # noqa: BLE001 - re-raised on the training thread
            self._q.put(e)

    def __iter__(self) -> Iterator[Round]:
        while True:
            item = self._q.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                return
            yield item

"""The in-process runtime's planner thread (rank 0): it runs `feed.planned_rounds` ahead of
the training loop into a bounded queue, so planning overlaps training. Traced, each round's
reading and planning is a slice, and so is a wait on a full queue (the planner is ahead).

Given `plan_bytes` (`distributed/rounds.py`'s `PlanWire.nbytes`), it counts each round's
plans (one, or each trainer's own), and the end of the plans, as the distributed planner
sends them: its own `traffic`'s `plan` sent on its thread, the trainers' `received` (what
this process's trainers together receive, and pass on) as the training loop takes them: a
plan that goes down the relay tree of `relayed` trainers is received by each of them and
sent on by all but the root (its N - 1 edges), each trainer's own plan received once."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

from bagpipe_cli.data.format import Batch
from bagpipe_cli.engine.comm.traffic import Traffic
from bagpipe_cli.engine.planning.feed import Round
from bagpipe_cli.engine.planning.plans import RoundPlan
from bagpipe_cli.engine.records.trace import NO_TRACE, PLANNER, NoTracer

QUEUE_WAIT_S = 1e-4  # a wait on a full queue shorter than this is not traced


class LocalPlanner:
    """The planner thread: plans rounds ahead into a bounded queue; iterating
    yields its Rounds (an error on the thread is raised here)."""

    def __init__(self, rounds: Iterator[tuple[RoundPlan, list[Batch]]], depth: int = 4,
                 on_start: Callable[[], None] | None = None, tracer: NoTracer = NO_TRACE,
                 plan_bytes: Callable[[RoundPlan | None], int] | None = None,
                 received: Traffic | None = None, relayed: int = 1):
        self.traffic = Traffic()  # the planner's
        self._received = received or Traffic()  # the trainers'
        self._plan_bytes = plan_bytes or (lambda rp: 0)
        self._relayed = relayed
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._on_start = on_start
        self.tracer = tracer
        self._thread = threading.Thread(target=self._run, args=(rounds,), name="planner", daemon=True)
        self._thread.start()

    def _run(self, rounds) -> None:
        if self._on_start is not None:
            self._on_start()  # e.g. pin this thread to the helper cores
        tr = self.tracer
        tr.name_thread(PLANNER, "planner")
        try:
            it = iter(rounds)
            t0 = time.perf_counter()
            for rp, batches in it:
                t1 = time.perf_counter()
                where = (rp.iters[0].b if rp.iters else -1, rp.r)
                tr.complete("read and plan round", "plan", t0, t1, len(rp.fetch_keys),
                            position=where)
                n = self._plan_bytes(rp)
                self.traffic.send("plan", n)
                t2 = time.perf_counter()
                if not self._put((Round(rp, [b.dense for b in batches], [b.labels for b in batches]), n)):
                    return
                t0 = time.perf_counter()
                if t0 - t2 > QUEUE_WAIT_S:
                    tr.complete("queue full (ahead)", "queue", t2, t0, position=where)
            n = self._plan_bytes(None)
            self.traffic.send("plan", n)
            self._put((None, n))
        except BaseException as e:  # re-raised on the main thread
            self._put(e)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Round]:
        while True:
            item = self._q.get()
            if isinstance(item, BaseException):
                raise item
            rnd, n = item
            self._received.receive("plan", n * self._relayed)
            self._received.send("plan", n * (self._relayed - 1))
            if rnd is None:
                return
            yield rnd

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

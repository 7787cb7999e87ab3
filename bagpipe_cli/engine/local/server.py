"""Serving threads of the in-process runtime: one per embedding server (and one for the
collective's emulated link), each serving its requests in FIFO order and then holding its
link for the emulated transfer time (a sleep, which releases the CPU). A request submitted
with a `Label` is traced on the thread's track: serving it, the link's hold included."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

from bagpipe_cli.engine.records.trace import NO_TRACE, NoTracer


class Label(NamedTuple):
    """How a request appears on the trace: its slice, and the arrow of the request it ends."""

    name: str
    cat: str
    rows: int
    nbytes: int
    peer: int  # the trainer (process) that sent it
    position: tuple[int, int]  # (iteration, round) it was sent at
    flow: tuple[str, int, int, int] | None = None


class LocalServer:
    """A thread serving requests in FIFO order, then holding the link for the transfer time."""

    def __init__(self, name: str, on_start: Callable[[], None] | None = None,
                 tracer: NoTracer = NO_TRACE, track: tuple[str, str] | None = None):
        self.q: queue.Queue = queue.Queue()
        self.busy_s = 0.0
        self._on_start = on_start
        self.tracer, self._track = tracer, track
        self.t = threading.Thread(target=self._run, name=name, daemon=True)
        self.t.start()

    def submit(self, fn: Callable[[], tuple[Any, float]], label: Label | None = None) -> Future:
        f: Future = Future()
        self.q.put((fn, f, label))
        return f

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()  # e.g. pin this thread to the helper cores
        if self._track is not None:
            self.tracer.name_thread(*self._track)
        while True:
            item = self.q.get()
            if item is None:
                return
            fn, f, label = item
            t0 = time.perf_counter()
            try:
                result, delay = fn()
                if delay > 0:
                    time.sleep(delay)
                f.set_result(result)
            except BaseException as e:  # surfaced on the trainer by f.result()
                f.set_exception(e)
            t1 = time.perf_counter()
            self.busy_s += t1 - t0
            if label is not None:
                self._trace(label, t0, t1)

    def _trace(self, label: Label, t0: float, t1: float) -> None:
        self.tracer.complete(label.name, label.cat, t0, t1, label.rows, label.nbytes, label.peer,
                             position=label.position)
        if label.flow is not None:
            self.tracer.flow_in(*label.flow, at=(t0 + t1) / 2)

    def close(self) -> None:
        self.q.put(None)
        self.t.join()

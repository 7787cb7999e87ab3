"""Serving threads of the in-process runtime: one per embedding server (and one for the
collective's emulated link), each serving its requests in FIFO order and then holding its
link for the emulated transfer time (a sleep, which releases the CPU)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class ServingThread:
    """A thread serving requests in FIFO order, then holding the link for the transfer time."""

    def __init__(self, name: str, on_start: Callable[[], None] | None = None):
        self.q: queue.Queue = queue.Queue()
        self.busy_s = 0.0
        self._on_start = on_start
        self.t = threading.Thread(target=self._run, name=name, daemon=True)
        self.t.start()

    def submit(self, fn: Callable[[], tuple[Any, float]]) -> Future:
        f: Future = Future()
        self.q.put((fn, f))
        return f

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()  # e.g. pin this thread to the helper cores
        while True:
            item = self.q.get()
            if item is None:
                return
            fn, f = item
            t0 = time.perf_counter()
            try:
                result, delay = fn()
                if delay > 0:
                    time.sleep(delay)
                f.set_result(result)
            except BaseException as e:  # surfaced on the trainer by f.result()
                f.set_exception(e)
            self.busy_s += time.perf_counter() - t0

    def close(self) -> None:
        self.q.put(None)
        self.t.join()

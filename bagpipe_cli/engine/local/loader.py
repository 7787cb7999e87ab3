"""The in-process runtime's data loader + oracle thread: it runs `feed.planned_rounds` ahead of
the training loop into a bounded queue, so planning overlaps training."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from bagpipe_cli.data.format import Batch
from bagpipe_cli.engine.feed import Round
from bagpipe_cli.engine.oracle import RoundPlan


class LoaderFeed:
    """The data loader + oracle thread: plans rounds ahead into a bounded queue; iterating
    yields its Rounds (an error on the thread is raised here)."""

    def __init__(self, rounds: Iterator[tuple[RoundPlan, list[Batch]]], depth: int = 4,
                 on_start: Callable[[], None] | None = None):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._on_start = on_start
        self._thread = threading.Thread(target=self._run, args=(rounds,), name="oracle", daemon=True)
        self._thread.start()

    def _run(self, rounds) -> None:
        if self._on_start is not None:
            self._on_start()  # e.g. pin this thread to the helper cores
        try:
            for rp, batches in rounds:
                if not self._put(Round(rp, [b.dense for b in batches], [b.labels for b in batches])):
                    return
            self._put(None)
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
            if item is None:
                return
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

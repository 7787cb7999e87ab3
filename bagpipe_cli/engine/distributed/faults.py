"""Fault injection for the failure tests: kill this rank at a chosen moment.

`BAGPIPE_FAULT="rank=R,after_s=S"` SIGKILLs rank R after S seconds;
`"rank=R,after_checkpoints=K[,delay_s=D]"` SIGKILLs it D seconds after its part of the
K-th checkpoint is done (a server: its shard sent; a trainer: its state sent; rank 0: the
checkpoint written). Each rank parses the variable once (`Faults.for_rank`) and passes the
object to its role.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass

ENV = "BAGPIPE_FAULT"


@dataclass
class Faults:
    """The faults armed on this rank (none by default)."""

    after_s: float | None = None  # kill this many seconds after the rank starts
    after_checkpoints: int = 0  # kill after this many checkpoints (0: not armed)
    delay_s: float = 0.0

    @classmethod
    def for_rank(cls, rank: int, spec: str | None = None) -> Faults:
        spec = os.environ.get(ENV) if spec is None else spec
        if not spec:
            return cls()
        kv = dict(part.split("=", 1) for part in spec.split(","))
        if int(kv.get("rank", -1)) != rank:
            return cls()
        if "after_checkpoints" in kv:
            return cls(after_checkpoints=int(kv["after_checkpoints"]), delay_s=float(kv.get("delay_s", 0.0)))
        return cls(after_s=float(kv.get("after_s", 1.0)))

    def arm(self) -> None:
        """Start the timed kill, if one is armed (call when the rank starts)."""
        if self.after_s is not None:
            _kill_later(self.after_s)

    def checkpoint_done(self) -> None:
        """This rank finished its part of a checkpoint."""
        if self.after_checkpoints:
            self.after_checkpoints -= 1
            if self.after_checkpoints == 0:
                _kill_later(self.delay_s)


def _kill_later(seconds: float) -> None:
    t = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGKILL))
    t.daemon = True
    t.start()

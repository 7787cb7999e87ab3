"""The wire protocol between ranks: request codes, pickled objects, and failures that name
the peer (docs/architecture.md describes the schedule).

A trainer's request to a server is a header [op, rows, sequence number] followed, when it
has rows, by their int64 local indices and the payload (rows + optimizer state for a
write-back, gradients for a push). Everything else (plans, batches, checkpoints, results)
travels as a pickled object: its length, then its bytes.
"""

from __future__ import annotations

import datetime
import pickle
from typing import Any

import torch
import torch.distributed as dist

from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.errors import BagpipeError

OP_FETCH, OP_WRITEBACK, OP_GRAD, OP_DONE, OP_CHECKPOINT = 1, 2, 3, 4, 5
OP_NAMES = {OP_FETCH: "FETCH", OP_WRITEBACK: "WRITEBACK", OP_GRAD: "GRAD", OP_DONE: "DONE",
            OP_CHECKPOINT: "CHECKPOINT"}

# Rank 0 plans the whole run (bagpipe's peak, the baselines' trace) before its first message,
# which on a large dataset takes longer than --timeout: that one wait is this long. A rank 0
# that dies meanwhile is noticed at once (its connections close).
PLANNING_WAIT_S = 24 * 3600.0


class RankFailure(BagpipeError):
    """Another rank died or could not be reached."""


class ScheduleError(BagpipeError):
    """Two trainers sent a server different requests at the same step (a bug, not bad input)."""


def comm(layout: Layout, peer: int, fn, *args):
    """Run a communication call; a failure names the role of the peer."""
    try:
        return fn(*args)
    except RuntimeError as e:
        msg = str(e)
        why = ("connection closed (it exited or crashed)"
               if "closed by peer" in msg or "reset by peer" in msg
               else "timed out" if "imeout" in msg or "timed out" in msg
               else msg.splitlines()[0][:160])
        raise RankFailure(f"lost contact with {layout.name(peer)}: {why}") from e


def send_obj(obj: Any, dst: int, layout: Layout) -> int:
    """Send a picklable object to rank `dst`; returns the bytes sent."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    comm(layout, dst, dist.send, torch.tensor([len(data)], dtype=torch.int64), dst)
    comm(layout, dst, dist.send, buf, dst)
    return len(data) + 8


def recv_obj(src: int, layout: Layout, wait_s: float | None = None) -> Any:
    """Receive an object `send_obj` sent; `wait_s` overrides the job's --timeout."""
    n = torch.empty(1, dtype=torch.int64)
    if wait_s is None:
        comm(layout, src, dist.recv, n, src)
    else:
        work = comm(layout, src, dist.irecv, n, src)
        comm(layout, src, work.wait, datetime.timedelta(seconds=wait_s))
    buf = torch.empty(int(n.item()), dtype=torch.uint8)
    comm(layout, src, dist.recv, buf, src)
    return pickle.loads(buf.numpy().tobytes())


def to_cpu(obj: Any) -> Any:
    """Tensors in (nested) dicts, lists and tuples moved to the CPU, for sending to rank 0."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj

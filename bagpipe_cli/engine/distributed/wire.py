"""The wire protocol between ranks: request codes, pickled objects, and failures that name
the peer (docs/architecture.md describes the schedule).

A trainer's request to a server is a header [op, rows, sequence number, iteration, round]
(the last two name the trainer's position on the trace; -1 untraced) followed, when it
has rows, by their int64 local indices and the payload (rows + optimizer state for a
write-back, gradients for a push): `engine/comm/traffic.py` counts it. Everything else
(plans, batches, checkpoints, results) travels as an object: its length, then its pickled
bytes, then every large CPU tensor or numpy array inside it sent as it is (`send_obj`), so
a shard of a full-size table crosses without a pickled copy on either side.
"""

from __future__ import annotations

import datetime
import io
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.errors import BagpipeError, RankFailure

OP_FETCH, OP_WRITEBACK, OP_GRAD, OP_DONE, OP_CHECKPOINT, OP_EVAL = 1, 2, 3, 4, 5, 6
OP_NAMES = {OP_FETCH: "FETCH", OP_WRITEBACK: "WRITEBACK", OP_GRAD: "GRAD", OP_DONE: "DONE",
            OP_CHECKPOINT: "CHECKPOINT", OP_EVAL: "EVAL"}
# The kind of traffic a request is (its header, keys and payload: `engine/comm/traffic.py`);
# the others are "control".
OP_KINDS = {OP_FETCH: "rows", OP_WRITEBACK: "rows", OP_GRAD: "gradients"}

# Before its first message rank 0 may pass over the whole run (the fixed-capacity baselines'
# trace and capacity; bagpipe plans as it goes), which on a large dataset takes longer than
# --timeout: that one wait is this long. A rank 0 that dies meanwhile is noticed at once (its
# connections close).
PLANNING_WAIT_S = 24 * 3600.0


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


RAW_BYTES = 1 << 16  # tensors and arrays from this size on are sent raw, not pickled
_RAW_NUMPY = {np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
                                      np.float16, np.float32, np.float64)}


class _Pickler(pickle.Pickler):
    """Pickles an object with its large tensors/arrays replaced by their place in `raw`."""

    def __init__(self, f: io.BytesIO, raw: list[torch.Tensor]):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.raw = raw

    def persistent_id(self, obj: Any) -> tuple | None:
        if (isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided
                and obj.numel() * obj.element_size() >= RAW_BYTES):
            t = obj.detach().contiguous()
            kind = "tensor"
        elif (isinstance(obj, np.ndarray) and obj.dtype in _RAW_NUMPY and obj.nbytes >= RAW_BYTES):
            a = np.ascontiguousarray(obj)
            t = torch.from_numpy(a if a.flags.writeable else a.copy())
            kind = "numpy"
        else:
            return None
        self.raw.append(t)
        return (kind, len(self.raw) - 1, tuple(t.shape), t.dtype)


@dataclass
class Encoded:
    """An object as it crosses: its pickle (with its manifest) and its large tensors raw.
    Encoded once, it can be sent to several ranks (a relay forwards what it received)."""

    body: torch.Tensor  # uint8: the pickle of (manifest, pickled object)
    raw: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the length, the pickle and the raw tensors."""
        return 8 + self.body.numel() + sum(t.numel() * t.element_size() for t in self.raw)


def encode(obj: Any) -> Encoded:
    f, raw = io.BytesIO(), []
    _Pickler(f, raw).dump(obj)
    manifest = [(tuple(t.shape), t.dtype) for t in raw]
    data = pickle.dumps((manifest, f.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
    return Encoded(torch.frombuffer(bytearray(data), dtype=torch.uint8), raw)


def decode(enc: Encoded) -> Any:
    _, body = pickle.loads(enc.body.numpy().tobytes())
    raw = enc.raw

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: tuple) -> Any:
            kind, i = pid[0], pid[1]
            return raw[i] if kind == "tensor" else raw[i].numpy()

    return _Unpickler(io.BytesIO(body)).load()


def send_encoded(enc: Encoded, dst: int, layout: Layout, group: Any = None) -> int:
    """Send an encoded object to rank `dst` (a global rank, also with `group`). Returns the
    bytes sent."""
    comm(layout, dst, dist.send, torch.tensor([enc.body.numel()], dtype=torch.int64), dst, group)
    comm(layout, dst, dist.send, enc.body, dst, group)
    for t in enc.raw:
        if t.numel():
            comm(layout, dst, dist.send, t, dst, group)
    return enc.nbytes


def recv_encoded(src: int, layout: Layout, wait_s: float | None = None, group: Any = None) -> Encoded:
    """Receive what `send_encoded` sent; `wait_s` overrides the job's --timeout for its
    first part."""
    n = torch.empty(1, dtype=torch.int64)
    if wait_s is None:
        comm(layout, src, dist.recv, n, src, group)
    else:
        work = comm(layout, src, dist.irecv, n, src, group)
        comm(layout, src, work.wait, datetime.timedelta(seconds=wait_s))
    buf = torch.empty(int(n.item()), dtype=torch.uint8)
    comm(layout, src, dist.recv, buf, src, group)
    manifest, _ = pickle.loads(buf.numpy().tobytes())
    raw = []
    for shape, dtype in manifest:
        t = torch.empty(shape, dtype=dtype)
        if t.numel():
            comm(layout, src, dist.recv, t, src, group)
        raw.append(t)
    return Encoded(buf, raw)


def send_obj(obj: Any, dst: int, layout: Layout, group: Any = None) -> int:
    """Send an object to rank `dst`: length, pickle, then its large tensors raw. Returns
    the bytes sent."""
    return send_encoded(encode(obj), dst, layout, group)


def recv_obj(src: int, layout: Layout, wait_s: float | None = None, group: Any = None) -> Any:
    """Receive an object `send_obj` sent; `wait_s` overrides the job's --timeout."""
    return decode(recv_encoded(src, layout, wait_s, group))

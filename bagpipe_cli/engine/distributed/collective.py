"""Sums among the trainer ranks over torch.distributed (`--collective`: engine/comm/collective.py).

The exact sum (the default) moves a ring's bytes and gives bitwise the in-process sums:

    pad the vector to N chunks of c = ceil(n / N) elements
    all-to-all:  trainer j receives chunk j of every trainer's vector
    add:         trainer j adds its N pieces in trainer order (`ordered_sum`)
    all-gather:  every trainer receives every summed chunk; the padding is dropped

The losses ride in the same sum: each trainer puts its loss at its own position of an
N-float vector of zeros, so every trainer reads every loss exactly (x + 0 == x).

The dense gradients are summed while the backward runs: `wrap` puts the model in DDP with a
comm hook that hands each bucket, as DDP makes it ready, to a background thread doing the
chosen sum on a process group of its own, so the rest of the backward overlaps it; DDP waits
for every bucket before the backward returns. DDP carries the bucketing, the hooks' order
and the wait: only the sum is ours. The `sync_later` sums run on a second background thread
and group, so the dense buckets, which the next iteration waits for, never queue behind them.

Tensors travel on `comm_device` (the CPU for gloo, the trainer's GPU for NCCL) and the sums
come back on `device`.
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bagpipe_cli.engine.comm.collective import Collective, ordered_sum, traffic
from bagpipe_cli.engine.distributed.layout import TRAINERS, Layout
from bagpipe_cli.engine.distributed.wire import comm
from bagpipe_cli.engine.records.trace import NO_TRACE, NoTracer, trainer_role

# torch >= 2.12 names it all_gather_single; older ones all_gather_into_tensor.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
# No broadcast of buffers before every forward (the models have none to keep alike, and a
# collective per forward is time and a failure outside our error handling); newer torch
# names the switch forward_sync_buffers.
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                   else {"broadcast_buffers": False})


class DistributedCollective(Collective):
    """The collective of trainer `index` among the trainer ranks: `group` for the sums on the
    critical path, `lanes` the groups of the two background threads (dense buckets, then
    sync_later sums)."""

    def __init__(self, group, lanes: tuple, layout: Layout, index: int, device: torch.device,
                 comm_device: torch.device, kind: str = "exact", tracer: NoTracer = NO_TRACE):
        self.group, self.layout = group, layout
        self._lanes = {name: _Lane(name, g, tracer, trainer_role(index, 1))
                       for name, g in zip(("dense", "later"), lanes, strict=True)}
        self.index, self.device, self.comm_device, self.kind = index, device, comm_device, kind
        self.size = layout.trainers
        self.bytes_sent = self.bytes_received = 0
        self.busy_s = self.exposed_s = 0.0
        self.failure: BaseException | None = None  # a background sum's, re-raised by the trainer
        self._lock = threading.Lock()  # the counters, kept by two threads
        self._last_bucket: list[float] = [0.0, 0.0]  # (handed over, summed) of the last bucket

    # ------------------------------------------------------------------ the sums

    def _sum(self, x: torch.Tensor, group) -> torch.Tensor:
        """The sum over the trainers of `x`, by `kind`, on the comm device (in `x`'s shape)."""
        t0 = time.perf_counter()
        shape = x.shape
        x = x.reshape(-1).to(self.comm_device).contiguous()
        n, size = x.numel(), self.size
        if self.kind == "allreduce":
            comm(self.layout, TRAINERS, dist.all_reduce, x, dist.ReduceOp.SUM, group)
            out = x
        elif self.kind == "allgather":
            parts = [torch.empty_like(x) for _ in range(size)]
            comm(self.layout, TRAINERS, dist.all_gather, parts, x, group)
            out = ordered_sum(parts)
        else:
            c = -(-n // size)
            padded = x.new_zeros(size * c)
            padded[:n] = x
            pieces = torch.empty_like(padded)
            comm(self.layout, TRAINERS, dist.all_to_all_single, pieces, padded, None, None, group)
            mine = ordered_sum([pieces[i * c:(i + 1) * c] for i in range(size)]).contiguous()
            gathered = torch.empty_like(padded)
            comm(self.layout, TRAINERS, _ALL_GATHER, gathered, mine, group)
            out = gathered[:n]
        moved = traffic(self.kind, n, x.element_size(), size)
        with self._lock:
            self.bytes_sent += moved
            self.bytes_received += moved
            self.busy_s += time.perf_counter() - t0
        return out.reshape(shape)

    def allreduce_(self, tensors: list[torch.Tensor], values: list[torch.Tensor],
                   dense: list[torch.Tensor] = (), overlap_s: float = 0.0) -> list:
        """The critical sum of `tensors` and the losses (the dense gradients were summed by
        the wrapped model during the backward). One trainer: nothing to sum."""
        if self.size == 1:
            return values
        t0 = time.perf_counter()
        losses = torch.zeros(self.size, dtype=torch.float32, device=values[0].device)
        losses[self.index] = values[0]
        total = self._sum(torch.cat([*(t.reshape(-1) for t in tensors), losses]), self.group)
        summed = total[:-self.size].to(self.device)
        off = 0
        for t in tensors:
            t.copy_(summed[off:off + t.numel()].view_as(t))
            off += t.numel()
        self.exposed_s += time.perf_counter() - t0
        return total[-self.size:].tolist()

    def start_sum(self, x: torch.Tensor) -> Future:
        """The sum of `x` on the background thread: `.result()` waits for it."""
        done: Future = Future()
        if self.size == 1:
            done.set_result(x)
            return done
        lane = self._lanes["later"]
        lane.submit(lambda: self._sum(x, lane.group).to(self.device), done.set_result,
                    self._failed(done.set_exception))
        return _Waited(done, self)

    def _exchange(self, parts: list[torch.Tensor], counts: list[int], group) -> list[torch.Tensor]:
        """One all-to-all with per-trainer counts (see `Collective.exchange`)."""
        t0 = time.perf_counter()
        send = torch.cat(parts).to(self.comm_device).contiguous()
        recv = send.new_empty(sum(counts), send.shape[1])
        comm(self.layout, TRAINERS, dist.all_to_all_single, recv, send, list(counts),
             [len(p) for p in parts], group)
        with self._lock:
            self.bytes_sent += send.numel() * send.element_size()
            self.bytes_received += recv.numel() * recv.element_size()
            self.busy_s += time.perf_counter() - t0
        return list(recv.to(self.device).split(list(counts)))

    def exchange(self, parts: list[torch.Tensor], counts: list[int], later: bool = False):
        if not later:
            t0 = time.perf_counter()
            out = self._exchange(parts, counts, self.group)
            self.exposed_s += time.perf_counter() - t0
            return out
        done: Future = Future()
        lane = self._lanes["later"]
        lane.submit(lambda: self._exchange(parts, counts, lane.group), done.set_result,
                    self._failed(done.set_exception))
        return _Waited(done, self)

    # ------------------------------------------------------------------ dense buckets

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` in DDP, whose comm hook sums each bucket on the background thread."""
        if self.size == 1:
            return model
        ids = [self.device] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, process_group=self.group, **_NO_BUFFER_SYNC)
        ddp.register_comm_hook(None, self._bucket_hook)
        return ddp

    def _bucket_hook(self, state: Any, bucket):  # DDP checks a return annotation: none here
        fut: torch.futures.Future = torch.futures.Future()
        buf = bucket.buffer()
        self._last_bucket[0] = time.perf_counter()

        def summed(result: torch.Tensor) -> None:
            self._last_bucket[1] = time.perf_counter()
            fut.set_result(result)

        lane = self._lanes["dense"]
        lane.submit(lambda: self._sum(buf, lane.group).to(buf.device), summed,
                    self._failed(fut.set_exception))
        return fut

    def take_dense_wait(self) -> float:
        handed, done = self._last_bucket
        self._last_bucket = [0.0, 0.0]
        wait = max(0.0, done - handed) if handed else 0.0
        self.exposed_s += wait
        return wait

    def _failed(self, fail: Callable[[BaseException], Any]) -> Callable[[BaseException], None]:
        def record(e: BaseException) -> None:
            self.failure = self.failure or e
            fail(e)

        return record

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()


class _Lane:
    """A background thread running sums on a process group of its own, in FIFO order (each
    sum a slice of its own track in a trace)."""

    def __init__(self, name: str, group, tracer: NoTracer, role: str):
        self.name, self.group, self.tracer, self.role = name, group, tracer, role
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], torch.Tensor], ok: Callable, fail: Callable) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"sum-{self.name}", daemon=True)
            self._thread.start()
        self._jobs.put((job, ok, fail))

    def _serve(self) -> None:
        self.tracer.name_thread(self.role, f"{self.name} sums")
        label = "dense bucket sum" if self.name == "dense" else "sync_later sum"
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, ok, fail = item
            try:
                with self.tracer.span(label, "collective"):
                    result = job()
                ok(result)
            except BaseException as e:  # noqa: BLE001 - surfaced on the trainer's thread
                fail(e)

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=5)


class _Waited:
    """A background sum whose wait counts as exposed collective time."""

    def __init__(self, fut: Future, owner: DistributedCollective):
        self.fut, self.owner = fut, owner

    def result(self) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.fut.result()
        self.owner.exposed_s += time.perf_counter() - t0
        return out

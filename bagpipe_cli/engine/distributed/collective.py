"""Collectives among the trainer ranks: all-gathers, summed in trainer order on every trainer.

An all-gather and an ordered sum, rather than an all-reduce, make the sums bitwise those
of the in-process engine (the same additions in the same order) at the price of moving N
times the data of a ring all-reduce's 2. Tensors travel on `comm` (the CPU for gloo, the
trainer's GPU for NCCL) and the sums come back on `device`.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch
import torch.distributed as dist

from bagpipe_cli.engine.collective import Collective, ordered_sum
from bagpipe_cli.engine.distributed.layout import TRAINERS, Layout
from bagpipe_cli.engine.distributed.wire import comm


class TorchCollective(Collective):
    """The collective of the trainer ranks' process group `group`."""

    def __init__(self, group, layout: Layout, device: torch.device, comm_device: torch.device):
        self.group, self.layout, self.device, self.comm_device = group, layout, device, comm_device
        self.size = layout.trainers

    def _gather(self, x: torch.Tensor, async_op: bool = False):
        x = x.to(self.comm_device).contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        work = comm(self.layout, TRAINERS, dist.all_gather, parts, x, self.group, async_op)
        return x, parts, work

    def allreduce_(self, tensors: list[torch.Tensor], values: list[torch.Tensor]) -> list:
        """One all-gather of every tensor and the values (which travel in the tensors' dtype,
        so they must be exact in it: a float32 loss is). One trainer: nothing to gather."""
        if self.size == 1:
            return values
        k = len(values)
        flat = torch.cat([*(t.reshape(-1) for t in tensors),
                          torch.stack(values).reshape(-1).to(tensors[0].dtype)])
        _, parts, _ = self._gather(flat)
        summed = ordered_sum([p[:len(p) - k] for p in parts]).to(self.device)
        off = 0
        for t in tensors:
            t.copy_(summed[off:off + t.numel()].view_as(t))
            off += t.numel()
        return [v for p in parts for v in p[len(p) - k:].tolist()]

    def start_sum(self, x: torch.Tensor) -> _PendingSum | Future:
        if self.size == 1:
            done: Future = Future()
            done.set_result(x)
            return done
        return _PendingSum(self, *self._gather(x, async_op=True))


class _PendingSum:
    """An all-gather in flight; `result()` waits for it and sums in trainer order."""

    def __init__(self, group: TorchCollective, x, parts, work):
        self.group, self.x, self.parts, self.work = group, x, parts, work  # x: kept until done

    def result(self) -> torch.Tensor:
        comm(self.group.layout, TRAINERS, self.work.wait)
        return ordered_sum(self.parts).to(self.group.device)

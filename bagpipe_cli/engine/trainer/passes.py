"""The forward and backward passes of an iteration: over each trainer slice of the process
(`slice_partials`), or over the samples a system's phases choose (`sample_partial`), with
each slice's dense gradients kept apart while its phases accumulate them (`TrainerGrads`).

A slice's losses are sum(BCE)/B over its samples (B: the global batch) and its row-gradient
partial is the sum, per row, of its accesses' gradients, in sample order; dense gradients are
summed over slices in trainer order. Inputs that start off a 64-byte boundary are copied
first (`_aligned`), so a slice gives the bits its own trainer process would on as many
torch threads (a CPU kernel's rounding of a few rows' product may change with the threads:
docs/architecture.md, "Which runs give the same bits"). A phase's share may be empty.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from bagpipe_cli.engine.comm.collective import ordered_sum
from bagpipe_cli.engine.trainer.staging import IterInputs, PhaseClock

ALIGN = 64  # bytes: what torch's allocators give a new tensor (CPU 64, CUDA 512)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it where it does not start on an ALIGN-byte boundary. A kernel's
    vectorised loops may sum in another order from an unaligned start, and a trainer slice's
    inputs must give its own process's bits: there each slice is a tensor of its own."""
    return t if t.data_ptr() % ALIGN == 0 else t.clone()


def slice_partials(forward, inp: IterInputs, values: torch.Tensor, slices: list[slice],
                   batch_size: int, clock: PhaseClock, times: dict[str, float],
                   first: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Forward/backward of trainer slices (sample ranges); their losses (0-d tensors, read
    once the iteration's GPU work is done) and row-gradient partials.

    `values` [accesses, dim] are the rows each access reads and `inp.index` their positions
    among the rows `inp.keys`; a slice's partial is the sum, per row, of its accesses'
    gradients (in sample order). Dense gradients accumulate in `.grad` (in slice order);
    `forward` is the model, or the module that sums them while the backward runs. Slice k is
    trainer `first + k`'s (the trace names it).
    """
    n_tables = len(inp.index) // sum(sl.stop - sl.start for sl in slices)
    losses, partials = [], []
    for k, sl in enumerate(slices):
        pos = slice(sl.start * n_tables, sl.stop * n_tables)
        with clock.gpu("forward", times, first + k):
            emb = _aligned(values[pos]).view(sl.stop - sl.start, n_tables, -1).detach().requires_grad_()
            logits = forward(_aligned(inp.dense[sl]), emb)
            loss = F.binary_cross_entropy_with_logits(logits, _aligned(inp.labels[sl]),
                                                      reduction="sum") / batch_size
        with clock.gpu("backward", times, first + k):
            loss.backward()
            partials.append(torch.zeros(len(inp.keys), values.shape[1], device=values.device).index_add_(
                0, inp.index[pos], emb.grad.view(-1, values.shape[1])))
        losses.append(loss.detach())
    return losses, partials


def sample_partial(forward, inp: IterInputs, values: torch.Tensor, samples: np.ndarray,
                   batch_size: int, clock: PhaseClock, times: dict[str, float], trainer: int,
                   partial: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward/backward of some samples of one trainer slice (`samples`: positions in the
    process's batch, perhaps none); their loss and `partial` (or a new one) with their
    accesses' row gradients added (see `slice_partials`).

    With no samples the passes still run, over empty tensors: a loss of 0, zero dense
    gradients and nothing added to `partial`. A trainer rank under DDP needs that backward
    (every rank joins the dense sums of the last phase, whatever its share of it)."""
    n_tables, dim = len(inp.index) // len(inp.labels), values.shape[1]
    samples = np.asarray(samples, dtype=np.int64)
    acc = torch.from_numpy((samples[:, None] * n_tables + np.arange(n_tables)).reshape(-1)
                           ).to(values.device)
    rows = torch.from_numpy(samples).to(values.device)
    with clock.gpu("forward", times, trainer):
        # The row width is given, not inferred: a view of 0 elements cannot infer it.
        emb = values.index_select(0, acc).view(len(samples), n_tables, dim).detach().requires_grad_()
        logits = forward(inp.dense.index_select(0, rows), emb)
        loss = F.binary_cross_entropy_with_logits(logits, inp.labels.index_select(0, rows),
                                                  reduction="sum") / batch_size
    with clock.gpu("backward", times, trainer):
        loss.backward()
        if partial is None:
            partial = torch.zeros(len(inp.keys), dim, device=values.device)
        partial.index_add_(0, inp.index.index_select(0, acc), emb.grad.view(len(acc), dim))
    return loss.detach(), partial


class TrainerGrads:
    """The dense gradients of each trainer slice of the process, kept apart while its phases
    accumulate them and then summed in trainer order (`ordered_sum`), as a trainer rank's
    are: so a phased iteration makes the same additions in-process as over torch.distributed."""

    def __init__(self, params: list[torch.Tensor], trainers: int):
        self.params = params
        self.own: list[list[torch.Tensor | None] | None] = [None] * trainers

    @contextlib.contextmanager
    def of(self, k: int):
        """Trainer slice k's gradients in `.grad` for the time of the block."""
        if len(self.own) == 1:  # one slice: its gradients stay in `.grad`
            yield
            return
        mine = self.own[k] or [None] * len(self.params)
        for p, g in zip(self.params, mine, strict=True):
            p.grad = g
        yield
        self.own[k] = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None

    def sum(self) -> None:
        """Every slice's gradients, summed in trainer order, into `.grad`."""
        if len(self.own) == 1:
            return
        done = [g for g in self.own if g is not None]
        for j, p in enumerate(self.params):
            parts = [g[j] for g in done if g[j] is not None]
            p.grad = ordered_sum(parts) if parts else None

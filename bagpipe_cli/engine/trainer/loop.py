"""The training loop: one for every runtime.

A process runs some of the run's N data-parallel trainers (`TrainerSet`): all of them
in-process, one on a torch.distributed trainer rank. The loop is the same in both; what
differs is passed in: the feed of rounds, the embedding system (over an in-process or a
torch transport), the collective (local, or all-gathers) and what a checkpoint does.

    per round:      take the round from the feed (and the next one's plan, to prefetch it);
                    settle every pending sync_later sum; system.begin_round (victims written
                    back, the round's rows inserted, the next round's prefetch started)
    per iteration:  checkpoint if due; settle the sync_later sums of b-2; read the rows; the
                    forward/backward of each trainer slice (or of the phases the system splits
                    them into: `EmbeddingSystem.phases`); one all-reduce on the critical path
                    (dense gradients, sync_now rows, the loss) and the asynchronous one of the
                    sync_later rows; dense optimizer; row updates and evictions (replicated
                    systems) or gradient pushes (sync, het); the system's `after_iteration`;
                    the metrics record

Gradient convention: the loss is the mean over the *global* batch; each trainer's slice
contributes sum(BCE)/B, and partial gradients (dense and embedding) are *summed* across
trainers in trainer order, which equals the gradient of the global mean. A trainer's share
of a phase may be empty (all hot, all cold, all skipped); an iteration of which no trainer
computed a sample records a loss of NaN.

LRPP (bagpipe, N > 1): sync_now rows are all-reduced on the critical path; no_sync rows are
updated by their one user only; sync_later rows are all-reduced in the background and
applied (then, if evicted, written back) before iteration b+2 reads its rows and before the
next round's rows are inserted: b+1 does not read them, and a row's next fetch is issued at
a later round start. With one trainer there is nothing to synchronise: every row is
updated at once.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bagpipe_cli.engine.comm.collective import Collective, add_floats, ordered_sum
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.planning.feed import Round
from bagpipe_cli.engine.planning.plans import NO_SYNC, SYNC_LATER, SYNC_NOW, IterPlan
from bagpipe_cli.engine.records.checkpoint import checkpoint_due
from bagpipe_cli.engine.records.metrics import Step, check_loss, iteration_record
from bagpipe_cli.engine.records.trace import NO_TRACE, READ_FLOW, NoTracer
from bagpipe_cli.engine.systems import EmbeddingSystem, Rows
from bagpipe_cli.engine.systems.base import Phase
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.engine.trainer.passes import TrainerGrads, sample_partial, slice_partials
from bagpipe_cli.engine.trainer.staging import IterInputs, PhaseClock, Stager
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet

ProgressFn = Callable[[int, dict[str, Any]], None]
Hook = Callable[[int, "TrainingLoop"], None]  # at the boundary before iteration b


def eval_due(cfg: TrainConfig, b: int, start: int) -> bool:
    """--eval-every evaluates at the boundary before iteration b (b iterations trained) every
    N iterations, the end of training included (not at the run's start)."""
    every = cfg.eval_every
    return every > 0 and start < b <= cfg.iterations and b % every == 0


@dataclass
class _Later:
    """The asynchronous sum of an iteration's sync_later gradients, applied (and its evicted
    rows written back) when settled."""

    plan: IterPlan
    idx: np.ndarray  # positions in U_b
    sum: Future
    evicted: Rows  # this process's share of the evicted sync_later rows


@dataclass
class _Sync:
    """How an iteration's row gradients were synchronised (replicated systems)."""

    idx: np.ndarray | None  # positions in U_b updated now (None: every row, in order) ...
    grad: torch.Tensor  # ... and their gradients: synchronised sums, then private rows' own
    later: np.ndarray  # positions summed in the background
    later_sum: Future | None
    classes: np.ndarray | None  # the LRPP classes eviction follows (None: all were synced now)


class TrainingLoop:
    """Trains the trainers of one process over a feed of rounds (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, dense_opt: torch.optim.Optimizer,
                 system: EmbeddingSystem, rowopt: RowOptimizer, collective: Collective,
                 trainers: TrainerSet, start: int = 0, device: torch.device | str = "cpu",
                 checkpoint: Hook | None = None, progress: ProgressFn | None = None,
                 evaluate: Hook | None = None, tracer: NoTracer = NO_TRACE):
        self.cfg, self.model, self.dense_opt, self.system = cfg, model, dense_opt, system
        self.rowopt, self.collective, self.trainers, self.start = rowopt, collective, trainers, start
        self.device = torch.device(device)
        self.checkpoint, self.progress = checkpoint, progress
        # --eval-every's evaluations, timed apart: their seconds are left out of train_seconds.
        self.evaluate, self.eval_s, self.t_start = evaluate, 0.0, time.perf_counter()
        self.tracer = system.tracer = tracer  # the system's prefetches go on the trace too
        system.collective = collective  # a partitioned cache exchanges rows by need
        self.params = list(model.parameters())
        self.per = cfg.batch_size // cfg.trainers
        self.slices = [slice(k * self.per, (k + 1) * self.per) for k in range(trainers.count)]
        self.records: list[dict[str, Any]] = []
        self._pending: list[_Later] = []
        self.forward = collective.wrap(model)  # sums the dense gradients in the backward, or not
        self.stager = Stager(self.device, system.view)
        self.clock = PhaseClock(self.device, tracer)

    def run(self, rounds: Iterable[Round]) -> list[dict[str, Any]]:
        """Train every round of `rounds`; returns this process's metrics records."""
        it = iter(rounds)
        tr = self.tracer
        self.t_start = t0 = time.perf_counter()
        with tr.span("data wait", "data"):
            cur = next(it, None)
        staged = self.stager.stage(cur) if cur is not None else None
        while cur is not None:
            tr.at_round(cur.plan)
            where = tr.position  # the round's: its first iteration
            with tr.span("data wait", "data"):
                nxt = next(it, None)
            data = time.perf_counter() - t0
            t = time.perf_counter()
            self.settle()  # before this round's rows move into freed slots
            settled = time.perf_counter() - t
            with tr.span("begin round", "begin"):
                waited = self.system.begin_round(cur.plan, nxt.plan if nxt is not None else None)
            # The next round's inputs move to the device while this round trains.
            after = self.stager.stage(nxt) if nxt is not None else None
            self.stager.wait(staged)
            head = {"data": data, "sync": settled, "prefetch_wait": waited,
                    "seconds": time.perf_counter() - t0}
            for inp in staged.iters:
                self._iteration(inp, head)
                head = None
            tr.complete("round", "round", t0, time.perf_counter(), position=where)
            t0 = time.perf_counter()
            cur, staged = nxt, after
        self.settle()
        self._boundary(self.cfg.iterations)  # the end of training
        return self.records

    def train_seconds(self) -> float:
        """Seconds since training started, --eval-every's evaluations left out."""
        return time.perf_counter() - self.t_start - self.eval_s

    def _boundary(self, b: int) -> None:
        """A checkpoint and an evaluation, where due before iteration b: every pending sum
        settled first, so every resident row has its true value."""
        ckpt = self.checkpoint is not None and checkpoint_due(self.cfg, b, self.start)
        ev = self.evaluate is not None and eval_due(self.cfg, b, self.start)
        if not (ckpt or ev):
            return
        self.settle()
        if ckpt:
            with self.tracer.span("checkpoint", "checkpoint"):
                self.checkpoint(b, self)
        if ev:
            t = time.perf_counter()
            with self.tracer.span("evaluate", "eval"):
                self.evaluate(b, self)
            self.eval_s += time.perf_counter() - t

    def settle(self, upto: int | None = None) -> None:
        """Apply the pending sync_later sums of iterations <= `upto` (all: None), in order,
        then write back their evicted rows."""
        if not self._pending or (upto is not None and self._pending[0].plan.b > upto):
            return
        with self.tracer.span("settle sync_later", "settle"):
            while self._pending and (upto is None or self._pending[0].plan.b <= upto):
                item = self._pending.pop(0)
                self.system.update_rows(item.plan, item.idx, item.sum.result(), self.rowopt)
                self.system.write_back_slots(*item.evicted)  # sent even when empty (lockstep)

    def _iteration(self, inp: IterInputs, head: dict[str, float] | None) -> None:
        plan = inp.plan
        tr = self.tracer
        tr.at(plan.b)
        self._boundary(plan.b)
        t_it = time.perf_counter()
        step = Step(plan, inp.dense, inp.labels)
        if head is not None:  # the round's start belongs to its first iteration
            for k in ("data", "sync", "prefetch_wait"):
                step.times[k] += head[k]
        t = time.perf_counter()
        self.settle(plan.b - 2)  # the sync_later sums of b-2 land before b reads its rows
        step.times["sync"] += time.perf_counter() - t
        phases = self.system.phases(step, inp.index, self.slices)  # a system's own split
        if phases is None:
            values = self._read(step, inp)
            losses, partials = slice_partials(self.forward, inp, values, self.slices,
                                              self.cfg.batch_size, self.clock, step.times,
                                              self.trainers.first)
            computed = self.per * len(self.slices)
        else:
            losses, partials, computed = self._phased(step, inp, phases)
        waited = self.collective.take_dense_wait()  # the backward's end, waiting for dense sums
        step.times["backward"] -= waited
        step.times["sync"] += waited
        grad = ordered_sum(partials)
        if self.clock.cuda and self.collective.size > 1:
            # The collective waits for the backward on the host: that wait is the backward's.
            torch.cuda.current_stream().synchronize()
        t = time.perf_counter()
        with tr.span("synchronise", "sync"):
            loss_parts, sync, computed = self._synchronise(step, inp.keys, grad, losses, computed)
        step.times["sync"] += time.perf_counter() - t
        with self.clock.gpu("optimizer", step.times):
            self.dense_opt.step()
            self.dense_opt.zero_grad(set_to_none=True)
            if sync is None:
                self.system.push(step, inp.keys, grad, self.rowopt)
            else:
                self._update(step, sync, first_of_round=head is not None)
        self.system.after_iteration(step)
        self.clock.settle(step.times)  # the GPU's queued work belongs to this iteration's time
        seconds = time.perf_counter() - t_it + (head["seconds"] if head is not None else 0.0)
        # An iteration of which no trainer computed a sample (slipstream skipped them all) has
        # no loss: NaN, not the 0 of an empty sum, which would read as a perfect fit.
        rec = iteration_record(step, add_floats([float(x) for x in loss_parts]) if computed
                               else math.nan, seconds)
        if computed:
            check_loss(rec["loss"], plan.b, self.cfg)  # a NaN loss stops the run, naming the iteration
        tr.complete("iteration", "iteration", t_it, time.perf_counter())
        self.records.append(rec)
        if self.progress is not None:
            self.progress(plan.b, rec)

    def _read(self, step: Step, inp: IterInputs) -> torch.Tensor:
        with self.tracer.span("read rows", "read"):
            self.tracer.flow_in(READ_FLOW, self.trainers.first, step.plan.b)
            return self.system.read(step, inp.keys, inp.index)

    def _phased(self, step: Step, inp: IterInputs, phases: list[Phase]
                ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """Each phase's samples, trainer slice by slice, after its `before`: losses and
        row-gradient partials per trainer slice, summed over the phases, and the number of
        samples computed. A wrapped model (DDP: one trainer in this process) sums dense
        gradients once, in the last phase, which runs even without samples (over empty
        tensors: zero gradients); the earlier ones accumulate locally. A share may be empty
        in any phase (all hot, all cold, all skipped): it adds nothing. Where no slice of the
        process computed a sample the dense gradients are zeros, as DDP's sum of empty
        backwards is, so the dense optimizer steps alike in both runtimes."""
        once = hasattr(self.forward, "no_sync")
        losses = [torch.zeros((), device=self.device) for _ in self.slices]
        partials: list[torch.Tensor | None] = [None] * len(self.slices)
        grads = TrainerGrads(self.params, len(self.slices))
        values = None
        for i, phase in enumerate(phases):
            last = i == len(phases) - 1
            if phase.before is not None:
                phase.before(step)
            if not (once and last) and not any(len(x) for x in phase.samples):
                continue
            values = self._read(step, inp)
            for k, samples in enumerate(phase.samples):
                if len(samples) == 0 and not (once and last):
                    continue
                with (self.forward.no_sync() if once and not last else contextlib.nullcontext(),
                      grads.of(k)):
                    loss, partials[k] = sample_partial(self.forward, inp, values, samples,
                                                       self.cfg.batch_size, self.clock, step.times,
                                                       self.trainers.first + k, partials[k])
                losses[k] = losses[k] + loss
        grads.sum()
        for p in self.params:
            if p.grad is None:  # no sample of this process computed
                p.grad = torch.zeros_like(p)
        if values is None:  # every sample left out: the rows' gradients are zero
            values = self._read(step, inp)
        computed = sum(len(x) for phase in phases for x in phase.samples)
        return losses, [p if p is not None else values.new_zeros(len(inp.keys), values.shape[1])
                        for p in partials], computed

    def _idx(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(a, dtype=np.int64)).to(self.device)

    def _synchronise(self, step: Step, keys: np.ndarray, grad: torch.Tensor,
                     losses: list[torch.Tensor], computed: int) -> tuple[list, _Sync | None, int]:
        """The critical all-reduce and the start of the asynchronous one; (every trainer's loss
        in trainer order, how rows were synchronised, or None for a pushing system, the
        samples computed by all trainers). A system that may leave samples out
        (`skips_samples`) adds its count of computed samples to the critical sum."""
        plan = step.plan
        dense = [p.grad for p in self.params]
        coll = self.collective
        hidden = {"dense": dense, "overlap_s": step.times["backward"]}  # summed in the backward
        count = ([torch.full((1,), float(computed), device=self.device)]
                 if self.system.skips_samples else [])

        def total() -> int:
            return int(count[0].item()) if count else computed

        if not self.system.replicated:  # row gradients go to the servers
            step.sync_counts = (0, 0, plan.unique_rows)
            return coll.allreduce_(count, losses, **hidden), None, total()
        lrpp = self.system.classes(plan)
        step.sync_counts = ((plan.sync_now, plan.sync_later, plan.no_sync) if lrpp is not None
                            else (len(keys), 0, 0))
        cls = lrpp if coll.size > 1 else None  # one trainer: nothing to wait for
        if cls is None:
            loss = coll.allreduce_([grad, *count], losses, **hidden)
            return loss, _Sync(None, grad, np.empty(0, np.int64), None, None), total()
        if self.system.partitioned:  # each row's partials go to its home, with the losses
            # (engine/planning/partition.py); the dense gradients were summed in the backward
            assert not count, "a partitioned cache computes every sample"
            idx, g, later, later_sum, loss = self.system.reduce(plan, grad, cls, losses[0])
            return loss, _Sync(idx, g, later, later_sum, cls), total()
        now = np.flatnonzero(cls == SYNC_NOW)
        mine = np.flatnonzero((cls == NO_SYNC) & self.trainers.owns(plan.owner))
        later = np.flatnonzero(cls == SYNC_LATER)
        # One gather in the order [sync_now | this process's no_sync | sync_later]: the first
        # part is summed in place on the critical path, the last in the background.
        order = np.concatenate([now, mine, later])
        g = grad[self._idx(order)]
        n = len(now) + len(mine)
        if plan.part is not None:  # in-process, the partitioned cache's exchanges emulated
            f, width, others = plan.part.moves(cls, coll.size), 4 * grad.shape[1], coll.size - 1
            coll.allreduce_(count, [], **hidden)  # the dense sums' wait; the losses go with ...
            coll.move_rows(f.now_sent + others, f.now_received + others, width)  # ... the partials
            loss = losses
            later_sum = (coll.move_rows(f.later_sent, f.later_received, width, g[n:], later=True)
                         if len(later) else None)
        else:
            loss = coll.allreduce_([g[:len(now)], *count], losses, **hidden)
            later_sum = coll.start_sum(g[n:]) if len(later) else None
        return loss, _Sync(order[:n], g[:n], later, later_sum, cls), total()

    def _update(self, step: Step, sync: _Sync, first_of_round: bool) -> None:
        """Row updates (synchronised and private rows), then this process's evictions."""
        plan = step.plan
        self.system.update_rows(plan, sync.idx, sync.grad, self.rowopt)
        with self.tracer.span("evict", "evict"):
            written, deferred = self.system.evict(plan, sync.classes)
        if sync.later_sum is not None:
            self._pending.append(_Later(plan, sync.later, sync.later_sum, deferred))
        step.rows_written_back = written + (self.system.pre_evicted if first_of_round else 0)
        step.rows_fetched += self.system.warmed if first_of_round else 0

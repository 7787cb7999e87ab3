"""A round's inputs on the trainer's device, and the clock of an iteration's phases.

On a GPU the training loop must not wait on the host: a round's dense features, labels and
row indices are copied from pinned host memory on a side stream, one round ahead, so the
copies overlap the previous round's compute, and the compute stream waits for them on the
GPU (an event) rather than the host. Phases that are GPU work (forward, backward,
optimizer) are timed with CUDA events, since a host clock sees only kernel launches. On a
CPU the inputs are the feed's arrays as they are (no copy) and every phase is host-timed.

Beside their wall time the compute phases' CPU time is counted (`CpuClock`), which another
process's load hardly changes: the thread that runs a phase (its thread CPU clock), and
torch's intra-op worker threads, found once by which threads run a parallel op the
calling thread starts (`launch/contention.busy_threads`) and read by their own CPU clocks.
A phase's `<phase>_cpu` is the calling thread's; `worker_cpu` adds up the workers'. With
one torch thread there are no workers and the thread's CPU time is all the phase's; with
more, the calling thread does its own chunk of every parallel op (torch's workers sleep
while they wait: OMP_WAIT_POLICY=PASSIVE), so its CPU time is about the phase's time on an
idle machine (less where the workers' chunks took longer), and the workers' is CPU spent
beside it. On a GPU both are the host's (launching kernels, waiting), not the GPU's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bagpipe_cli.engine.planning.feed import Round
from bagpipe_cli.engine.planning.plans import IterPlan
from bagpipe_cli.engine.records.trace import NO_TRACE, NoTracer
from bagpipe_cli.launch.contention import busy_threads, thread_cpu, thread_cpu_clock


@dataclass
class IterInputs:
    """One iteration's inputs on the device: its plan, this process's samples, and the rows
    its gradients are taken over (`keys`, host) with each access's position in them."""

    plan: IterPlan
    dense: torch.Tensor
    labels: torch.Tensor
    keys: np.ndarray
    index: torch.Tensor  # int64, on the device


@dataclass
class StagedRound:
    """A round's inputs, and (on a GPU) the event its copies complete at."""

    iters: list[IterInputs]
    ready: Any = None  # torch.cuda.Event, or None on a CPU
    host: list[torch.Tensor] = field(default_factory=list)  # pinned buffers in flight


class Stager:
    """Moves rounds' inputs to `device` (see the module docstring); `view(plan)` gives the rows
    an iteration's gradients are taken over and each access's position (`EmbeddingSystem.view`)."""

    def __init__(self, device: torch.device, view: Any):
        self.device, self.view = device, view
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def stage(self, rnd: Round) -> StagedRound:
        """Start moving `rnd`'s inputs (on a GPU, asynchronously)."""
        views = [self.view(p) for p in rnd.plan.iters]
        host = []
        for d, y, (_, index) in zip(rnd.dense, rnd.labels, views, strict=True):
            host += [torch.from_numpy(np.ascontiguousarray(d)), torch.from_numpy(np.ascontiguousarray(y)),
                     torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64))]
        if self.stream is None:
            staged = host
            ready = None
            host = []
        else:
            host = [t.pin_memory() for t in host]
            main = torch.cuda.current_stream(self.device)
            with torch.cuda.stream(self.stream):
                staged = [t.to(self.device, non_blocking=True) for t in host]
                ready = torch.cuda.Event()
                ready.record(self.stream)
            for t in staged:  # used on the compute stream: not to be reused before it is done
                t.record_stream(main)
        iters = [IterInputs(p, staged[3 * i], staged[3 * i + 1], views[i][0], staged[3 * i + 2])
                 for i, p in enumerate(rnd.plan.iters)]
        return StagedRound(iters, ready, host)

    def wait(self, staged: StagedRound) -> None:
        """Make the compute stream wait (on the GPU) until `staged`'s copies are done."""
        if staged.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(staged.ready)


def _parallel_probe() -> None:
    """Parallel torch work (an elementwise op over OpenMP, a matrix product over MKL's
    threads) on constant tensors: nothing of the run's values or random state changes."""
    x, a = torch.ones(1 << 19), torch.ones(128, 128)
    for _ in range(4):
        x.mul_(1.0)
        a @ a


class CpuClock:
    """The CPU seconds of the thread that computes and of torch's intra-op workers (see the
    module docstring); the workers are found on the first reading, and again whenever
    torch's thread count changed."""

    def __init__(self) -> None:
        self.threads = 0  # torch's thread count the workers were found at (0: not yet)
        self.workers: list[int] = []  # their CPU clocks

    def ready(self) -> None:
        """Find torch's workers if not found yet at its thread count (before a phase starts:
        the probe is no phase's time)."""
        n = torch.get_num_threads()
        if n != self.threads:
            found = busy_threads(_parallel_probe, n - 1) if n > 1 else []
            self.threads, self.workers = n, [thread_cpu_clock(t) for t in found]

    def read(self) -> list[float | None]:
        """[the calling thread's CPU seconds, each worker's (None: gone)]."""
        return [time.thread_time(), *(thread_cpu(c) for c in self.workers)]

    @staticmethod
    def spent(before: list[float | None], after: list[float | None]) -> tuple[float, float]:
        """(the calling thread's CPU seconds, the workers') between two readings."""
        workers = sum(b - a for a, b in zip(before[1:], after[1:], strict=False)
                      if a is not None and b is not None and b > a)
        return after[0] - before[0], workers


class PhaseClock:
    """Times an iteration's phases into `times` (seconds): on a CPU with the host clock; on a
    GPU, `gpu(name)` phases with CUDA events, read once the iteration is done (`settle`).
    Every `gpu(name)` phase's CPU time goes into `times[name + "_cpu"]` and the workers'
    into `times["worker_cpu"]` (`CpuClock`), the threads counted into
    `times["compute_threads"]`.

    The trace gets the same intervals: host ones as they are; GPU ones on a "GPU" track of the
    role, placed on the host clock by a reference event recorded when the iteration's first
    phase starts (the GPU is idle then: the previous iteration's `settle` waited for it)."""

    def __init__(self, device: torch.device, tracer: NoTracer = NO_TRACE):
        self.cuda = device.type == "cuda"
        self.tracer = tracer
        self._events: list[tuple[str, Any, Any, int]] = []
        self._ref: tuple[Any, float] | None = None  # (CUDA event, host seconds), when tracing
        self.cpu = CpuClock()

    @contextlib.contextmanager
    def gpu(self, name: str, times: dict[str, float], trainer: int = -1) -> Iterator[None]:
        """A phase of GPU work: its GPU time on a GPU, its host time on a CPU; its CPU time
        beside it (the CPU readings inside the wall ones)."""
        self.cpu.ready()
        t = time.perf_counter()
        c0 = self.cpu.read()
        if self.cuda:
            with self._events_of(name, trainer):
                yield
        else:
            yield
        c1 = self.cpu.read()
        t1 = time.perf_counter()
        own, workers = self.cpu.spent(c0, c1)
        times[name + "_cpu"] = times.get(name + "_cpu", 0.0) + own
        times["worker_cpu"] = times.get("worker_cpu", 0.0) + workers
        times["compute_threads"] = 1 + len(self.cpu.workers)
        if not self.cuda:
            times[name] += t1 - t
            self.tracer.complete(name, name, t, t1, peer=trainer)

    @contextlib.contextmanager
    def _events_of(self, name: str, trainer: int) -> Iterator[None]:
        """A GPU phase's CUDA events, read at `settle`."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if self.tracer.enabled and self._ref is None:
            self._ref = (start, time.perf_counter())
        start.record()
        yield
        end.record()
        self._events.append((name, start, end, trainer))

    def settle(self, times: dict[str, float]) -> None:
        """Wait for the GPU's queued work and add the GPU phases' times (a no-op on a CPU)."""
        if not self.cuda:
            return
        torch.cuda.current_stream().synchronize()
        for name, start, end, trainer in self._events:
            times[name] += start.elapsed_time(end) / 1e3
            if self._ref is not None:
                ref, host = self._ref
                t0 = host + ref.elapsed_time(start) / 1e3
                self.tracer.complete(name, name, t0, t0 + start.elapsed_time(end) / 1e3,
                                     peer=trainer, track=(self.tracer.role() or "trainer", "GPU"))
        self._events, self._ref = [], None

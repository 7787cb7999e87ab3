"""Where a run's roles compute: which cores the trainer's torch threads get, and which the
planner and the servers get, so that on one machine the trainer's compute stays its own.

On a cluster the oracle and the servers run on machines of their own; on one machine they
share the cores with the trainers. With `--placement auto` (the default):

- in-process: torch gets `default_threads(n)` threads on n cores (all but
  `reserved_cores(n)`: 1 of 2..9, 2 of 10..17, ...; GPU_TRAINER_CORES on a GPU), a count
  fixed by the cores alone. The planner, server and collective threads get the
  reserved cores, or share every core when the feed was measured to need less than half a
  core (`feed_need`: its seconds to read and index a batch over the trainers' seconds to
  compute one; engine/local/runtime.py); on a GPU they get all but GPU_TRAINER_CORES;
- over torch.distributed: the ranks on one machine split its cores: the trainer ranks get
  an equal share each (as many torch threads as cores; at most GPU_TRAINER_CORES for a
  trainer on a GPU, whose CPU only launches kernels), the oracle and server ranks what is
  left, at least one core when there is one to spare (else they share every core);
- threads and processes are pinned to their cores where the OS allows (Linux
  `sched_setaffinity`), and `--threads` still sets torch's thread count.

On a busy machine (other processes' runnable tasks at BUSY_LOAD per core or more when an
in-process run starts) no core is kept apart: every thread may run on every core, so the
scheduler can move a thread away from the other work (a core reserved for the helpers, or a
trainer pinned to one core, only queues behind it).

Neither the measurement nor the load changes torch's thread count: the parameters' bits
depend on it (a sum over a batch is split among the threads), so two runs of one command,
or bagpipe's and sync's, must get the same count whatever the machine was doing (a run
that took 2 threads beside one that took 1 under load made bagpipe differ from sync).
torch's threads never spin while they wait (OMP_WAIT_POLICY=PASSIVE, bagpipe_cli/__init__.py).

`--placement off` leaves threads to the OS and torch's default (the engine before this).
What was decided, and whether pinning held, is recorded in config.json (`layout.placement`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any

from bagpipe_cli.launch.contention import LOADED, usable_core_count

# torch is imported where it is used: the run's options (engine/config.py) read PLACEMENTS
# before anything runs, and must not wait for torch.
PLACEMENTS = ("auto", "off")
GPU_TRAINER_CORES = 2  # a GPU trainer's cores: its main thread and a helper
BUSY_LOAD = LOADED["load_per_core"]  # a machine this busy: nothing is pinned apart


def affinity() -> tuple[int, ...]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def available_cores() -> tuple[int, ...]:
    """The cores this run may keep busy: its affinity, the first round(q) of them under a
    cgroup quota of q CPUs (a container limited to 2 CPUs on a 64-core host gets 2)."""
    cores = affinity()
    return cores[:usable_core_count(len(cores))]


def reserved_cores(n: int) -> int:
    """Cores kept for the planner and server threads of an in-process run of n cores."""
    return 0 if n < 2 else 1 + (n - 2) // 8


def default_threads(n: int, gpu: bool = False) -> int:
    """torch's threads in an in-process run on n cores without --threads: the cores not
    reserved for the helpers (GPU_TRAINER_CORES on a GPU). A function of the cores alone, so
    that the bits of a run do not depend on a measurement or on the load (module docstring)."""
    if gpu and n > GPU_TRAINER_CORES:
        return GPU_TRAINER_CORES
    return max(1, n - reserved_cores(n))


@dataclass(frozen=True)
class Placement:
    """One process's cores: `compute` for the trainer's torch threads (its main thread),
    `helpers` for the planner, server and collective threads (in-process)."""

    policy: str
    role: str  # "in-process", "planner", "server", "trainer"
    compute: tuple[int, ...]
    helpers: tuple[int, ...]
    torch_threads: int
    pinned: bool = False  # set once the OS accepted the affinity
    feed_need: float | None = None  # cores the feed was measured to need (None: not measured)
    load: float | None = None  # other processes' runnable tasks per core when it was planned

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["compute"], d["helpers"] = list(self.compute), list(self.helpers)
        return d


def plan_in_process(policy: str, threads: int | None, cores: tuple[int, ...],
                    gpu: bool = False, feed_need: float | None = None,
                    load: float | None = None) -> Placement:
    """The placement of an in-process run on `cores` (`gpu`: the trainers compute on a GPU,
    so the helpers get all but GPU_TRAINER_CORES of them; `feed_need`: the cores the feed
    was measured to need, which the helpers get, rounded, at most all but one; `load`: other
    processes' runnable tasks per core: on a busy machine every thread shares every core).
    torch's thread count is --threads or `default_threads`: neither `feed_need` nor `load`
    changes it."""
    if policy == "off":
        import torch

        return Placement(policy, "in-process", cores, cores, threads or torch.get_num_threads())
    torch_threads = threads or default_threads(len(cores), gpu)
    if load is not None and load >= BUSY_LOAD:  # a core kept apart is not ours to keep
        return Placement(policy, "in-process", cores, cores, torch_threads, load=load)
    r = reserved_cores(len(cores))
    if gpu and len(cores) > GPU_TRAINER_CORES:
        r = len(cores) - GPU_TRAINER_CORES
    elif not gpu and feed_need is not None:
        # The measured need, rounded, but never so many cores that torch's threads would
        # share them (without --threads: at most the reserved ones; 0 shares every core).
        r = max(0, min(len(cores) - 1, int(feed_need + 0.5), len(cores) - torch_threads))
    compute, helpers = (cores[:-r], cores[-r:]) if r else (cores, cores)
    return Placement(policy, "in-process", compute, helpers, torch_threads,
                     feed_need=feed_need, load=load)


def plan_rank(policy: str, threads: int | None, roles: list[str], me: int,
              cores: tuple[int, ...], trainer_cores: int | None = None) -> Placement:
    """The placement of local rank `me` among the ranks `roles` ("planner", "server",
    "trainer", in local-rank order) that share this machine's `cores`; `trainer_cores` caps
    a trainer's share (a GPU trainer's CPU only launches kernels: the planner gets the rest)."""
    role = roles[me]
    if policy == "off":
        return Placement(policy, role, cores, cores, threads or 1)
    trainers = [i for i, r in enumerate(roles) if r == "trainer"]
    spare = 1 if len(roles) > len(trainers) and len(cores) > len(trainers) else 0
    per = max(1, (len(cores) - spare) // max(1, len(trainers)))
    if trainer_cores is not None:
        per = min(per, trainer_cores)
    left = cores[per * len(trainers):]  # what the trainers do not take goes to the others
    if role != "trainer":
        helper_cores = left or cores
        return Placement(policy, role, helper_cores, helper_cores, threads or 1)
    j = trainers.index(me)
    if per * len(trainers) <= len(cores):
        mine = cores[j * per:(j + 1) * per]
    else:  # more trainers than cores: they take turns on them
        mine = (cores[j % len(cores)],)
    return Placement(policy, role, mine, mine, threads or len(mine))


def pin(cores: tuple[int, ...]) -> bool:
    """Pin the calling thread (and the threads it starts later) to `cores`; False where the
    OS does not allow it."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(0, cores)
    except OSError:
        return False
    return True


class Pinned:
    """Apply a placement to this thread and torch for a block; unpin the thread afterwards
    (an in-process run must not leave the caller's thread pinned)."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self._saved: tuple[int, ...] = ()

    def __enter__(self) -> Placement:
        import torch

        p = self.placement
        self._saved = affinity()
        pinned = p.policy != "off" and pin(p.compute)
        torch.set_num_threads(p.torch_threads)
        self.placement = replace(p, pinned=pinned)
        return self.placement

    def __exit__(self, *exc: object) -> None:
        # The caller's thread is unpinned again; torch keeps the run's thread count (what
        # the run's environment records, as --threads always did).
        if self.placement.pinned:
            pin(self._saved)

    def helper(self) -> None:
        """Called first on every helper thread: pin it to the helper cores."""
        if self.placement.pinned:
            pin(self.placement.helpers)

"""How much of the machine a run had: the cores it may use, the load it found, and how long
its own threads waited for a CPU. Recorded in every summary.json (`contention`), so that a
speed figure made on a busy machine says so.

A user's bench on a shared 2-core machine (load average 8-13) made bagpipe look 0.05x sync
with nothing to say why; these figures are what `bench` and `report` read to flag such runs.

- `cores`: the cores this process may run on (affinity), capped by a cgroup CPU quota;
- `load_per_core`: other processes' runnable tasks per usable core when training started
  (the median of a few samples of /proc/stat's procs_running, less this process's own);
- `loadavg`: the 1-minute load average at the start and at the end;
- `run_queue_wait_share`: of the time this run's threads were runnable, the share they
  spent waiting for a CPU (/proc/<pid>/task/*/schedstat; threads that ended before the
  measurement are not counted);
- `steal_share`: of the machine's CPU time during the run, the share a hypervisor took;
- `loaded`: other work competed for the run's cores (load_per_core at or over LOADED's while
  its threads waited at least AFFECTED_WAIT, or the wait or the steal share at or over
  LOADED's); `note`: one sentence saying what was seen.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# At or above these the run shared its cores with other work: other runnable tasks per core
# at the start, the share of its threads' runnable time spent waiting for a CPU, the share of
# the CPU time a hypervisor took.
# A run's own threads (loader, servers, collectives beside torch's) wait up to about a third of
# their runnable time on an idle 2-core machine; other processes at 2 per core made it 0.7-0.8.
# Load seen only at the start, with the run's threads then hardly waiting (under
# AFFECTED_WAIT), passed before it mattered: not counted.
LOADED = {"load_per_core": 0.5, "run_queue_wait_share": 0.5, "steal_share": 0.1}
AFFECTED_WAIT = 0.1
PROC = Path("/proc")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def cgroup_quota() -> float | None:
    """The CPUs a cgroup CPU quota allows this process (v2 cpu.max or v1 cfs quota), None
    where none is set or none can be read."""
    root = Path("/sys/fs/cgroup")
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.strip().partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    q, p = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if q is not None and p is not None and int(q) > 0 and int(p) > 0:
        return int(q) / int(p)
    return None


def usable_core_count(affinity: int) -> int:
    """Of `affinity` cores, how many this process can keep busy at once: a cgroup quota of
    q CPUs allows round(q) (at least 1)."""
    q = cgroup_quota()
    return affinity if q is None else max(1, min(affinity, int(q + 0.5)))


def _own_tasks(pid: int) -> list[Path]:
    try:
        return list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return []


def sched_times(pid: int | None = None) -> dict[str, tuple[int, int]]:
    """Per thread of process `pid` (this one by default): (ns on a CPU, ns runnable but
    waiting for one)."""
    out = {}
    for t in _own_tasks(pid or os.getpid()):
        s = _read(t / "schedstat")
        if s:
            run, wait = s.split()[:2]
            out[t.name] = (int(run), int(wait))
    return out


def thread_cpu_clock(tid: int) -> int:
    """The clock id of thread `tid`'s CPU time, for `time.clock_gettime` (Linux's per-thread
    CPU clock, CPUCLOCK_SCHED: the run time /proc/<pid>/task/<tid>/schedstat shows)."""
    return (~tid << 3) | 6


def thread_cpu(clock: int) -> float | None:
    """The CPU seconds of a `thread_cpu_clock` (None: the thread is gone)."""
    try:
        return time.clock_gettime(clock)
    except OSError:
        return None


def busy_threads(probe: Callable[[], None], limit: int) -> list[int]:
    """The threads of this process (tids), at most `limit` of them and the busiest first, that
    ran on a CPU while `probe()` ran on the calling thread: neither the calling thread nor any
    Python thread (`threading.enumerate`), so when `probe` runs a parallel torch op, torch's
    intra-op workers of this thread."""
    python = {t.native_id for t in threading.enumerate()} | {threading.get_native_id()}

    def cpu() -> dict[int, float]:  # each thread's CPU clock: current even while it runs
        tids = (int(t.name) for t in _own_tasks(os.getpid()))
        return {t: c for t in tids if t not in python
                and (c := thread_cpu(thread_cpu_clock(t))) is not None}

    before = cpu()
    probe()
    ran = {t: c - before.get(t, 0.0) for t, c in cpu().items()}
    busy = sorted((t for t, r in ran.items() if r > 0), key=lambda t: -ran[t])
    return busy[:max(0, limit)]


def wait_delta(before: dict[str, tuple[int, int]],
               after: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(ns on a CPU, ns waiting) between two `sched_times`, summed over the threads."""
    run = wait = 0
    for tid, (r, w) in after.items():
        r0, w0 = before.get(tid, (0, 0))
        run, wait = run + r - r0, wait + w - w0
    return run, wait


def _own_runnable(pid: int) -> int:
    n = 0
    for t in _own_tasks(pid):
        s = _read(t / "stat")
        if s and s.rsplit(")", 1)[-1].split()[0] == "R":
            n += 1
    return n


def others_runnable(pids: list[int], samples: int = 5, every_s: float = 0.01) -> float | None:
    """Runnable tasks of processes other than `pids` (the run's own) now (median of
    `samples`), None without /proc."""
    got = []
    for i in range(samples):
        stat = _read(PROC / "stat")
        if stat is None:
            return None
        running = next((int(line.split()[1]) for line in stat.splitlines()
                        if line.startswith("procs_running")), None)
        if running is None:
            return None
        got.append(max(0, running - sum(_own_runnable(p) for p in pids)))
        if i + 1 < samples:
            time.sleep(every_s)
    return float(statistics.median(got))


def machine_load(cores: int) -> float | None:
    """Other processes' runnable tasks per core of this process's `cores`, now."""
    n = others_runnable([os.getpid()])
    return None if n is None else n / cores


def load_now() -> dict[str, Any]:
    """The machine's load now, as this process finds it (for a `simulate`, which measures
    nothing itself but records what it ran beside): its usable cores, other processes'
    runnable tasks per core, the 1-minute load average, and `loaded` (LOADED's
    load_per_core or more)."""
    cores = usable_core_count(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                              else os.cpu_count() or 1)
    load = machine_load(cores)
    return {"cores": cores, "load_per_core": load, "loadavg": _loadavg(),
            "loaded": load is not None and load >= LOADED["load_per_core"]}


def _loadavg() -> float | None:
    s = _read(PROC / "loadavg")
    return float(s.split()[0]) if s else None


def _cpu_jiffies() -> tuple[int, int] | None:
    """(steal, total) jiffies of the machine since boot."""
    s = _read(PROC / "stat")
    if not s:
        return None
    v = [int(x) for x in s.splitlines()[0].split()[1:]]
    return (v[7] if len(v) > 7 else 0), sum(v[:8])


def share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


class ContentionMeter:
    """Started when training starts, read when it ends (`figures`); `pids`: the run's
    processes on this machine (this one by default)."""

    def __init__(self, cores: int, pids: list[int] | None = None):
        self.cores, self.pids = cores, pids or [os.getpid()]
        self.load = others_runnable(self.pids)
        self.loadavg = _loadavg()
        self.cpu = _cpu_jiffies()
        self.sched = sched_times()

    def wait(self) -> tuple[int, int]:
        """(ns on a CPU, ns waiting for one) of this process's threads since the start."""
        return wait_delta(self.sched, sched_times())

    def figures(self, waits: list[tuple[int, int]] | None = None) -> dict[str, Any]:
        """The summary's `contention`: `waits` are the (run, wait) ns of the processes whose
        threads compute (a distributed run's trainers); this process's own by default."""
        run, wait = (sum(x) for x in zip(*(waits or [self.wait()]), strict=True))
        cpu = _cpu_jiffies()
        steal = share(cpu[0] - self.cpu[0], cpu[1] - self.cpu[1]) \
            if cpu is not None and self.cpu is not None else None
        return describe({
            "cores": self.cores, "processes": len(self.pids),
            "load_per_core": None if self.load is None else self.load / self.cores,
            "loadavg": [self.loadavg, _loadavg()],
            "run_queue_wait_share": share(wait, run + wait),
            "steal_share": steal,
        })


# The next step where comparing --threads 1 is what the runs already did: the model, whose
# compute is measured in CPU time (a busy machine's waits left out).
ADVISE = "bagpipe advise DATA --trainers N --net-gbps G"


def remedy(one_thread: bool) -> str:
    """What to do about figures taken on a busy machine, never what the runs already did:
    at one torch thread a run has compared --threads 1, so the next step is `bagpipe
    advise` (it measures compute in CPU time and answers from the model)."""
    if one_thread:
        return ("rerun on an idle machine, or ask the model, which measures compute in CPU "
                f"time: `{ADVISE}`")
    return "rerun on an idle machine, or compare --threads 1"


def describe(c: dict[str, Any], threads: int | None = None) -> dict[str, Any]:
    """`c` with `loaded` and a one-sentence `note` (None when nothing was seen). Waiting for
    a CPU counts as load only where the run's own processes do not outnumber its cores (a
    --procs run of more ranks than cores waits by design). `threads`: the run's torch
    threads where known (1: the note's remedy is not --threads 1 again)."""
    load, wait, steal = c.get("load_per_core"), c.get("run_queue_wait_share"), c.get("steal_share")
    cores, procs = c["cores"], c.get("processes", 1)
    seen, own = [], None
    if load is not None and load >= LOADED["load_per_core"] and (wait is None or
                                                                 wait >= AFFECTED_WAIT):
        seen.append(f"{load * cores:.1f} other runnable processes on its {cores} "
                    f"core{'s' if cores != 1 else ''} at the start")
    if steal is not None and steal >= LOADED["steal_share"]:
        seen.append(f"the hypervisor took {100 * steal:.0f}% of the CPU time")
    if wait is not None and wait >= LOADED["run_queue_wait_share"]:
        waited = f"its threads waited for a CPU {100 * wait:.0f}% of the time they could run"
        if procs > cores:
            own = f"its {procs} processes shared {cores} cores: {waited}"
        else:
            seen.append(waited)
    note = None
    if seen:
        note = ("Ran on a busy machine: " + "; ".join(seen + ([own] if own else [])) +
                ". Its speed is not the machine's: " + remedy(threads == 1))
    elif own:
        note = own[0].upper() + own[1:] + " (a cluster gives each its own cores)"
    return {**c, "loaded": bool(seen), "note": note}

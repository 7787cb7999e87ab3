"""Helpers shared by the tests: the one "same parameters" check, and running real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def parameters(run: Any) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """(tables, dense state_dict) of a TrainResult, or of a model saved by --save-model."""
    if isinstance(run, dict):
        return list(run["tables"].values()), run["dense"]
    return list(run.tables), run.model.state_dict()


def assert_same_parameters(a: Any, b: Any, losses: bool = True) -> None:
    """Bitwise the same tables and dense parameters (and, for two TrainResults, the same loss
    curve over the same iterations). `a`, `b`: TrainResults or paths/dicts of saved models."""
    a, b = (torch.load(x) if isinstance(x, str | Path) else x for x in (a, b))
    (ta, da), (tb, db) = parameters(a), parameters(b)
    assert len(ta) == len(tb)
    for t, (x, y) in enumerate(zip(ta, tb, strict=True)):
        assert torch.equal(x, y), f"table {t} differs"
    assert list(da) == list(db)
    for k in da:
        assert torch.equal(da[k], db[k]), f"dense parameter {k} differs"
    if losses and not isinstance(a, dict) and not isinstance(b, dict):
        assert a.metrics["iteration"].tolist() == b.metrics["iteration"].tolist()
        assert a.metrics["loss"].tolist() == b.metrics["loss"].tolist()


ROUNDING_TOLERANCE = 1e-4  # sync's parameters up to the order of summation (hotline)


def max_difference(a: Any, b: Any) -> float:
    """The largest absolute difference between two runs' parameters (tables and dense)."""
    (ta, da), (tb, db) = parameters(a), parameters(b)
    return max([float((x - y).abs().max()) for x, y in zip(ta, tb, strict=True)]
               + [float((da[k] - db[k]).abs().max()) for k in da])


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`bagpipe ARGS` in this process, `env` added to the environment while it runs, as a
    CompletedProcess. A --procs run's ranks are still real processes (forked from the
    session's fork server); only the launcher runs here, which saves each test the import
    of torch a `bagpipe` process of its own pays. Tests of the launcher as a process (its
    signals, its exit) use `bagpipe` instead."""
    from unittest import mock

    from click.testing import CliRunner

    from bagpipe_cli.cli import cli

    with mock.patch.dict(os.environ, env or {}):
        r = CliRunner().invoke(cli, list(args))
    stderr = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        # an exception the command let escape (a bug: a user would see a traceback): its
        # traceback, so that a failing assertion on the result shows it
        stderr += "".join(traceback.format_exception(r.exception))
    return subprocess.CompletedProcess(list(args), r.exit_code, r.stdout, stderr)


def bagpipe(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m bagpipe_cli ARGS` as a real process."""
    return subprocess.run([sys.executable, "-m", "bagpipe_cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


class Hung(BaseException):
    """Raised by `hang_guard`: a BaseException, so that no `except Exception` on the way (a
    launcher's) turns it into an ordinary error, while every `finally` still runs."""


@contextlib.contextmanager
def hang_guard(seconds: float, what: str) -> Iterator[None]:
    """Fail with `Hung` if the block (in this process: `run_cli`'s launcher) runs longer than
    `seconds`: a guard against a hang, never a speed limit. SIGALRM, main thread only."""
    def hung(signum, frame):
        raise Hung(f"{what}: still running after {seconds:g} s (hung?)")

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def communicate_all(procs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr); any left running (a failed test) is killed."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def one_per_volumes(systems: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The first engine system of each simulated traffic model (`SystemSpec.volumes`): the
    registry's group `each-model`. A new system with volumes of its own is one of them; a
    system simulate has no model of (no volumes) is not."""
    from bagpipe_cli.engine import registry

    return registry.group("each-model", systems)


def wait_until(p: subprocess.Popen, ready: Any, what: str, timeout: float = 120,
               every: float = 0.01) -> None:
    """Poll `ready()` until it holds while process `p` runs: fail if `p` ends first, or after
    `timeout` seconds (a hang guard, not a speed limit)."""
    import time

    deadline = time.monotonic() + timeout
    while not ready():
        assert p.poll() is None, f"the process ended ({p.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout:g} s (hung?)"
        time.sleep(every)


def user_warnings(output: str) -> list[str]:
    """The `Warning:` lines of a command's output, less the one a busy machine adds to any
    run (launch/contention.py): a test that asserts on warnings must pass on a loaded
    machine too."""
    return [line for line in output.splitlines()
            if "Warning" in line and "Ran on a busy machine" not in line]


def policy_replay(system: str, trace: Any, capacity: int) -> tuple[list[int], int]:
    """(rows fetched per batch, peak of resident rows) of a fixed-capacity system's policy on
    `trace`: the profile's simulator of its policy where the policy table has one (an
    independent count), else its own planner policy's decisions replayed (as profile does)."""
    from bagpipe_cli.engine.registry import spec
    from bagpipe_cli.policies.simulators import simulate_decisions
    from bagpipe_cli.policies.table import policy

    s = spec(system)
    if s.decisions is None and s.policy is not None and policy(s.policy).simulate:
        r = policy(s.policy).simulate(trace, capacity, None, None)
    else:
        r = simulate_decisions(system, trace, capacity, s.planner_decisions())
    return r.fetched_per_batch.tolist(), int(r.peak_resident_rows)

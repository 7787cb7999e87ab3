"""The environment a result was produced in, stored with every result."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy

from bagpipe_cli import OMP_WAIT_POLICY, OMP_WAIT_POLICY_APPLIED, __version__


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                           cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def environment() -> dict[str, Any]:
    """torch/python versions, CPU/GPU, threads, git revision and dirty flag, host."""
    import torch  # here, so that peak_rss_mb's users need not load torch
    status = _git("status", "--porcelain", "--untracked-files=no")
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "bagpipe_version": __version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # OpenMP's wait policy (bagpipe_cli/__init__.py), None where torch had loaded before
        # bagpipe_cli set it (so the policy the run got is not known)
        "omp_wait_policy": OMP_WAIT_POLICY if OMP_WAIT_POLICY_APPLIED else None,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git_revision": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }

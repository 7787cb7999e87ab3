"""Wall time and peak memory of a benchmark's subprocess (shared by the benchmark scripts)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

GIB = 1024**3


def tree_rss(root: int) -> int:
    """Resident bytes of `root` and all its descendants now (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            pages = int(Path(f"/proc/{d}/statm").read_text().split()[1])
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
        rss[int(d)] = pages * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run(cmd: list[str], log: Path, stdout: bool = True, cwd: Path | None = None) -> dict:
    """Run `cmd` (stderr, and stdout unless `stdout` is False, to `log`): its wall seconds,
    the peak RSS of its largest process (wait4) and the peak of its whole tree at once
    (sampled every 0.5 s). A failure exits with the command and the last lines of `log`."""
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    peak_tree = 0
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f if stdout else subprocess.DEVNULL,
                             stderr=subprocess.STDOUT if stdout else f, cwd=cwd)
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            peak_tree = max(peak_tree, tree_rss(p.pid))
            time.sleep(0.5)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        tail = log.read_text().strip().splitlines()[-3:]
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n  " + "\n  ".join(tail))
    return {"cmd": cmd, "wall_s": wall, "peak_rss_gb": usage.ru_maxrss * 1024 / GIB,
            "peak_tree_gb": peak_tree / GIB}

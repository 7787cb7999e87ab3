"""Bounds on what a user may ask for: this machine's memory and disk, and sizes in words.

Options are checked against these before anything is allocated or written, so that a size
no machine can hold is one line naming the option and what it would need, instead of an
allocator's traceback a minute into the run. Standard library only: a config module
imports it without loading numpy or torch.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bagpipe_cli.errors import ConfigError

INT32_MAX = 2**31 - 1  # batch numbers, slots and positions are int32 in the engine's arrays
INT64_MAX = 2**63 - 1
# The least memory per embedding row that any command using a dataset needs (a profile: a
# count, int64, and a last use, int32, per row): tables that need more than the machine's
# memory at this rate are ones nothing here can use.
LEAST_BYTES_PER_ROW = 12


def machine_memory() -> int:
    """Bytes of memory this process may use: the physical memory, or the cgroup's limit
    where one is set and lower."""
    physical, cgroup = _memory_limits()
    return physical if cgroup is None else min(physical, cgroup)


def memory_source() -> str:
    """Whose memory `machine_memory` is, as a refusal words it."""
    physical, cgroup = _memory_limits()
    return "this cgroup's limit of" if cgroup is not None and cgroup < physical else "this machine's"


def _memory_limits() -> tuple[int, int | None]:
    """(physical memory, the cgroup's limit or None)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 1 << 62  # unknown: nothing is refused for want of memory
    cgroup = None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            cgroup = int(text) if cgroup is None else min(cgroup, int(text))
    return total, cgroup


def free_disk(path: Path) -> int:
    """Bytes free on the file system that holds `path` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return 1 << 62


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; 2.2e18 -> '1.9 EiB'."""
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30),
                       ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def human_seconds(s: float) -> str:
    """0.13 -> '0.13 s'; 131072 -> '36.4 hours'; 1e9 -> '31.7 years' (the largest unit that
    gives at least 2 of it)."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600),
                       ("minutes", 60)):
        if s >= 2 * size:
            return f"{s / size:.3g} {unit}"
    return f"{s:.2g} s"


def check_memory(need: float, what: str, fix: str) -> None:
    """Refuse `what` (it would need `need` bytes) when it exceeds this machine's memory."""
    have = machine_memory()
    if need > have:
        raise ConfigError(f"{what} needs about {human_bytes(need)} of memory, more than "
                          f"{memory_source()} {human_bytes(have)}; {fix}")


def check_disk(need: float, path: Path, what: str, fix: str) -> None:
    """Refuse `what` (it would write `need` bytes near `path`) when the disk cannot hold it."""
    have = free_disk(path)
    if need > have:
        raise ConfigError(f"{what} would take about {human_bytes(need)} on disk, and "
                          f"{human_bytes(have)} are free there; {fix}")


def check_int(option: str, value: int | None, low: int = 0, high: int = INT64_MAX) -> None:
    """An integer option within [low, high] (a C long holds it); None passes."""
    if value is None:
        return
    if value < low:
        raise ConfigError(f"{option} must be >= {low} (got {value})")
    if value > high:
        raise ConfigError(f"{option} {value}: too large (at most {high:,})")


def check_table_rows(option: str, tables: int, widest: int, total: int | None = None) -> None:
    """Refuse tables (`tables` of up to `widest` rows, `total` in all, which `option` asks
    for) that no command could use on this machine: a profile keeps LEAST_BYTES_PER_ROW per
    row, a run at --emb-dim 16 about 85."""
    total = tables * widest if total is None else total
    have = machine_memory()
    if total * LEAST_BYTES_PER_ROW > have:
        raise ConfigError(f"{option}: {tables:,} table{'s' if tables != 1 else ''} of up to "
                          f"{widest:,} rows; a profile of them would need about "
                          f"{human_bytes(total * LEAST_BYTES_PER_ROW)} of memory and a run at "
                          f"--emb-dim 16 about {human_bytes(total * 85)}, more than this "
                          f"machine's {human_bytes(have)}; ask for fewer rows per table")

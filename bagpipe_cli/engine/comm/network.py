"""Network emulation: delay remote transfers as a cluster network would, without burning CPU."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.limits import human_seconds

# A network a run can finish on: a 16 KB row (a 4096-dim row) takes at most 0.13 s on the
# slowest link, and a message waits at most 1 s; anything slower is a run that never ends.
MIN_GBPS = 1e-3
MAX_LATENCY_US = 1e6
_ROW_BYTES = 16 * 1024


@dataclass(frozen=True)
class NetworkModel:
    """A link of `gbps` Gbit/s with `latency_us` one-way latency; None fields = no emulation."""

    gbps: float | None = None  # link bandwidth in Gbit/s (None: transfers are not delayed)
    latency_us: float = 0.0  # per-message latency in microseconds

    def __post_init__(self) -> None:
        g, lat = self.gbps, self.latency_us
        if g is not None and not (g > 0 and math.isfinite(g)):
            raise ConfigError(f"--net-gbps must be a finite number > 0 (got {g})")
        if g is not None and g < MIN_GBPS:
            raise ConfigError(f"--net-gbps {g:g}: a 16 KB row would take "
                              f"{human_seconds(_ROW_BYTES * 8 / (g * 1e9))}; give at least "
                              f"{MIN_GBPS:g} (1 Mbit/s, where it takes 0.13 s)")
        if not (lat >= 0 and math.isfinite(lat)):
            raise ConfigError(f"--net-latency-us must be a finite number >= 0 (got {lat})")
        if lat > MAX_LATENCY_US:
            raise ConfigError(f"--net-latency-us {lat:g}: every message would wait "
                              f"{human_seconds(lat * 1e-6)}; give at most {MAX_LATENCY_US:,.0f} (1 s)")

    @property
    def emulated(self) -> bool:
        return self.gbps is not None or self.latency_us > 0

    def transfer_seconds(self, nbytes: int) -> float:
        """Time one message of `nbytes` takes on the link."""
        if not self.emulated:
            return 0.0
        bw = float("inf") if self.gbps is None else self.gbps * 1e9 / 8
        return self.latency_us * 1e-6 + nbytes / bw

    def allreduce_seconds(self, nbytes: int, n: int) -> float:
        """Ring all-reduce of `nbytes` over `n` participants: 2(n-1) steps of nbytes/n each."""
        if n <= 1 or not self.emulated or nbytes == 0:
            return 0.0
        return 2 * (n - 1) * self.transfer_seconds(nbytes // n)

    def collective_seconds(self, kind: str, nbytes: int, n: int) -> float:
        """A sum of `nbytes` per trainer over `n` trainers (`engine/comm/collective.py`): a ring's
        time for `exact` and `allreduce` (2(n-1) steps of nbytes/n), n-1 whole vectors for
        `allgather`."""
        if n <= 1 or not self.emulated or nbytes == 0:
            return 0.0
        if kind == "allgather":
            return (n - 1) * self.transfer_seconds(nbytes)
        return self.allreduce_seconds(nbytes, n)

    def wait(self, seconds: float) -> None:
        """Sleep (releases the CPU) for an emulated transfer."""
        if seconds > 0:
            time.sleep(seconds)

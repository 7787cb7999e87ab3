"""A shaped network for a local job (`--net-shape`): every rank in a network namespace of
its own, linked to a private switch by a veth pair that the kernel rate-limits.

    hub namespace:   a bridge, and the switch side of every rank's link
    rank r:          namespace with one interface, address 10.77.0.(r+1)/24, its default
                     route to the bridge; a token-bucket filter (tc tbf) at --net-gbps on
                     both ends of its link, so what it sends and receives is shaped

gloo's real TCP traffic (server requests, collectives among trainers, rank 0's rounds) then
crosses links of the given bandwidth, as on a cluster whose machines have one NIC each on a
non-blocking switch. The kernel adds no per-message latency (tc netem is not available on
every machine): `--net-latency-us` stays the servers' per-message sleep. Needs root (network
namespaces, veth and tc); anything else is refused with one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

from bagpipe_cli.errors import ConfigError

SUBNET = "10.77.0"
RANK_IF = "bp0"  # a rank's interface inside its namespace


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode:
        raise ConfigError(f"--net-shape: `ip {' '.join(args)}` failed: "
                          f"{(r.stderr or r.stdout).strip().splitlines()[0]}")


def check_available() -> None:
    """Refuse --net-shape where this process cannot build namespaces and shaped links."""
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise ConfigError(f"--net-shape needs {' and '.join(missing)} (iproute2) on the PATH; "
                          "install iproute2, or drop --net-shape for the sleep emulation")
    if os.geteuid() != 0:
        raise ConfigError("--net-shape needs root to create network namespaces and shape links "
                          "(ip netns, tc); run as root, or drop --net-shape for the sleep emulation")


@dataclass
class ShapedNetwork:
    """The namespaces and links of one job of `world` ranks at `gbps` (see the module doc)."""

    world: int
    gbps: float
    name: str = field(default_factory=lambda: f"bp{os.getpid()}")
    _made: list[str] = field(default_factory=list)

    def ns(self, rank: int) -> str:
        return f"{self.name}r{rank}"

    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def _tbf(self, ns: str, dev: str) -> list[str]:
        rate = self.gbps * 1e9 / 8  # bytes/s
        burst = max(256 * 1024, int(rate / 250))  # a timer tick's worth at 250 Hz, at least 256 KiB
        return ["netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                "rate", f"{self.gbps * 1000:.0f}mbit", "burst", str(burst), "latency", "50ms"]

    def __enter__(self) -> ShapedNetwork:
        check_available()
        if self.world > 250:
            raise ConfigError(f"--net-shape: at most 250 ranks (got {self.world})")
        try:
            hub = f"{self.name}hub"
            self._add(hub)
            _ip("-n", hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", hub, "link", "set", "br0", "up")
            for r in range(self.world):
                self._link(hub, r)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)

    def _link(self, hub: str, r: int) -> None:
        ns, peer = self.ns(r), f"bph{r}"
        self._add(ns)
        _ip("link", "add", RANK_IF, "netns", ns, "type", "veth", "peer", "name", peer, "netns", hub)
        _ip("-n", ns, "addr", "add", f"{self.address(r)}/24", "dev", RANK_IF)
        for args in (("-n", ns, "link", "set", "lo", "up"), ("-n", ns, "link", "set", RANK_IF, "up"),
                     ("-n", hub, "link", "set", peer, "master", "br0"),
                     ("-n", hub, "link", "set", peer, "up")):
            _ip(*args)
        _ip(*self._tbf(ns, RANK_IF))
        _ip(*self._tbf(hub, peer))

    def command(self, rank: int, command: list[str]) -> list[str]:
        """`command` run inside rank `rank`'s namespace."""
        return ["ip", "netns", "exec", self.ns(rank), *command]

    def env(self, rank: int) -> dict[str, str]:
        """What a rank needs to reach rank 0 over its shaped link."""
        return {"MASTER_ADDR": self.address(0), "GLOO_SOCKET_IFNAME": RANK_IF}

    def __exit__(self, *exc: object) -> None:
        while self._made:  # deleting a namespace deletes its end of every link
            subprocess.run(["ip", "netns", "del", self._made.pop()], capture_output=True)

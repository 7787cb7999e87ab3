"""The systems `bagpipe` trains, and what each one is: the one list every command reads.

`train`, `bench`, `simulate` and `report` ask this registry what a system does (where its
rows live, how its gradients are synchronised, which settings it reads, whether it gives
the same parameters as `sync`) instead of comparing system names. A new system is one
entry here plus its implementation (`engine/systems.py`, or an external runner).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bagpipe_cli.errors import ConfigError

# Settings that belong to one system rather than to the setting it runs in.
SYSTEM_SETTINGS = ("lookahead", "round", "cache_rows", "staleness", "hot_sample")
ENGINE = "engine"  # SystemSpec.runner of the systems this package's engine trains


@dataclass(frozen=True)
class SystemSpec:
    """One trainable system."""

    name: str
    summary: str  # one line, for --help and the README
    store: str  # where a trainer's rows live: "cache" (planned cache), "tables" (every table),
    #             "none" (fetched every iteration), "stale-cache" (copies with a staleness bound)
    planner: str  # what plans its cache: "oracle" (lookahead), "policy" (lru/lfu/fae), "none"
    replicated: bool  # trainers hold every row of U_b and all-reduce its gradients (else:
    #                   they push their own rows' gradients to the servers)
    reads: frozenset[str] = frozenset()  # the SYSTEM_SETTINGS it reads
    capacity_from_peak: bool = False  # default --cache-rows is Bagpipe's peak at --lookahead
    lrpp: bool = False  # LRPP: sync_now / sync_later / no_sync rows, private fetches
    prefetch_ahead: bool = False  # a round's rows are fetched while the previous round trains
    exact: bool = True  # the same parameters as `sync` ...
    exact_only_if: tuple[str, Any] | None = None  # ... only when this setting has this value
    inexact_when: str = ""  # the same condition, for messages ("--staleness > 0")
    runner: str = ENGINE  # ENGINE, or "module:function" of an external runner (optional install)
    install: str | None = None  # how to install an external runner's library
    role: str = "baseline"  # "reference" (speed-ups are over it), "ours", "bound", "baseline"
    color: str = "#333333"  # its colour in every plot

    def is_exact(self, cfg: Any) -> bool:
        """Whether `cfg` (a TrainConfig) trains the same parameters as `sync` would."""
        if not self.exact:
            return False
        if self.exact_only_if is None:
            return True
        key, value = self.exact_only_if
        return getattr(cfg, key) == value

    def ignored_settings(self, cache_rows: int | None) -> set[str]:
        """The SYSTEM_SETTINGS this system does not read (with `cache_rows` as configured)."""
        ignored = set(SYSTEM_SETTINGS) - self.reads
        if self.capacity_from_peak and cache_rows is not None:
            ignored |= {"lookahead", "round"}  # only read for the default capacity
        return ignored

    @property
    def external(self) -> bool:
        return self.runner != ENGINE


_CACHE_SETTINGS = frozenset({"lookahead", "round", "cache_rows"})

_SPECS = (
    SystemSpec("sync", "no cache: every iteration fetches its rows and writes the update back "
               "(parameter server)", store="none", planner="none", replicated=False,
               role="reference", color="#555555"),
    SystemSpec("bagpipe", "lookahead oracle cache + prefetch one round ahead + LRPP", store="cache",
               planner="oracle", replicated=True, reads=_CACHE_SETTINGS, lrpp=True,
               prefetch_ahead=True, role="ours", color="#d62728"),
    SystemSpec("lru", "fixed cache, fetch on miss, evict the least recently used", store="cache",
               planner="policy", replicated=True, reads=_CACHE_SETTINGS, capacity_from_peak=True,
               color="#1f77b4"),
    SystemSpec("lfu", "fixed cache, fetch on miss, evict the least frequently used", store="cache",
               planner="policy", replicated=True, reads=_CACHE_SETTINGS, capacity_from_peak=True,
               color="#2ca02c"),
    SystemSpec("fae", "static cache of the hottest rows (FAE); the others fetched every iteration",
               store="cache", planner="policy", replicated=True,
               reads=_CACHE_SETTINGS | {"hot_sample"}, capacity_from_peak=True, color="#9467bd"),
    SystemSpec("het", "bounded-staleness cache (HET): copies may lag --staleness versions",
               store="stale-cache", planner="none", replicated=False, reads=frozenset({"staleness"}),
               exact_only_if=("staleness", 0), inexact_when="--staleness > 0", color="#ff7f0e"),
    SystemSpec("local", "every table on the trainer: the upper bound, no remote access",
               store="tables", planner="none", replicated=True, role="bound", color="#17becf"),
    SystemSpec("torchrec", "TorchRec EmbeddingBagCollection + DistributedModelParallel "
               "(optional: make torchrec)", store="tables", planner="none", replicated=False,
               runner="bagpipe_cli.external.torchrec_run:run_torchrec", install="make torchrec",
               color="#8c564b"),
)

SYSTEMS: dict[str, SystemSpec] = {s.name: s for s in _SPECS}
ENGINE_SYSTEMS = tuple(s.name for s in _SPECS if not s.external)
ALL_SYSTEMS = tuple(SYSTEMS)
REFERENCE = next(s.name for s in _SPECS if s.role == "reference")  # "sync": speed-ups are over it


def spec(name: str, option: str = "--system") -> SystemSpec:
    """The registry entry of `name`; a ConfigError naming `option` if there is none."""
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ConfigError(f"{option} {name!r}: choose one of {', '.join(ALL_SYSTEMS)}") from None


def color(name: str) -> str:
    """The plot colour of a system (grey for a name this registry does not know)."""
    s = SYSTEMS.get(name)
    return s.color if s else "#999999"


def role(name: str) -> str:
    """A system's role in plots and tables ("baseline" for a name this registry does not know)."""
    s = SYSTEMS.get(name)
    return s.role if s else "baseline"

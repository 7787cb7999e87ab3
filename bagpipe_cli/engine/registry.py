"""The systems `bagpipe` trains: what each one is, and how it builds itself.

Each `SystemSpec` builds its planner (`plan`), its embedding system for one process
(`build_system`) and its simulated per-iteration volumes (`volumes`), and says what it
is: which settings it reads, whether it gives the same parameters as `sync`, its role and
colour. `train`, `bench`, `simulate`, `report` and the tests ask this registry instead of
comparing system names, and every list of systems (help texts, memory estimates and
advice, `bagpipe systems`, a bench file's `systems: all`) is made from it, so a new system
is its module (an `EmbeddingSystem` in `engine/systems/`, with its planner policy if it has
one of its own) plus one entry here. `register` adds one at run time (a plugin's, a test's),
before anything reads the lists.

The builders are named ("module:function", as `runner` and `volumes` are) and imported when
first called (`Lazy`), so this table, and the configs whose choices come from it, import
without the engine (torch): `bagpipe --help` starts at once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.policies.table import TABLE, policy, with_role

# Settings that belong to one system rather than to the setting it runs in.
SYSTEM_SETTINGS = ("lookahead", "round", "cache_rows", "staleness", "hot_sample",
                   "snapshot_every", "drop_target", "stale_share")
ENGINE = "engine"  # SystemSpec.runner of the systems this package's engine trains
VOLUMES = "bagpipe_cli.simulate.volumes"  # where the engine's systems' simulated volumes are


class Lazy:
    """A function named "module:name" (`name` may be dotted, a class's method), imported when
    first called, with `kwargs` bound as `functools.partial` binds them."""

    def __init__(self, target: str, **kwargs: Any):
        self.target, self.kwargs = target, kwargs
        self._fn: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        """The function itself (imported on the first call)."""
        if self._fn is None:
            module, _, name = self.target.partition(":")
            fn: Any = importlib.import_module(module)
            for part in name.split("."):
                fn = getattr(fn, part)
            self._fn = partial(fn, **self.kwargs) if self.kwargs else fn
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fn": None}  # what it resolved to may be a closure

    def __repr__(self) -> str:
        bound = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"Lazy({self.target}{bound})"


# A builder: a function, or a `Lazy` naming one. The registry imports nothing of the engine, not
# even its types (the engine imports the registry), so each field says its builder's signature.
Builder = Callable[..., Any]

PLANNER = "bagpipe_cli.engine.planning.builders"
SYSTEMS_PACKAGE = "bagpipe_cli.engine.systems"


@dataclass(frozen=True)
class SystemSpec:
    """One trainable system."""

    name: str
    summary: str  # one line, for --help and the README
    plan: Builder  # (RunSetup, first iteration) -> Planning (planner.PlanBuilder): its cache's plan
    build_system: Builder | None  # (systems.SystemParts) -> EmbeddingSystem: one process's system
    volumes: str | None  # "module:function" of its simulated volumes (simulate imports this
    #                      registry, so it is resolved when asked: `simulated_volumes`)
    replicated: bool  # trainers hold every row of U_b and all-reduce its gradients (else:
    #                   they push their own rows' gradients to the servers)
    reads: frozenset[str] = frozenset()  # the SYSTEM_SETTINGS it reads
    rounds: bool = False  # its iterations come in rounds of --round (default L/4), planned
    #                       --lookahead ahead (else: one iteration a round)
    capacity_from_peak: bool = False  # default --cache-rows is Bagpipe's peak at --lookahead
    policy: str | None = None  # the cache policy (policies/table.py) its cache follows, if one
    global_view: bool = True  # its trainers read U_b of the global batch (False: each needs
    #                           its own rows only, so rank 0 sends them |U_b| alone)
    per_trainer_volumes: bool = False  # its volumes depend on --trainers even in-process (each
    #                                    trainer keeps a cache of its own)
    holds_tables: str | None = None  # "all": every trainer holds the whole tables while it
    #                                  trains (fetched before, written back after); "shard":
    #                                  each its 1/N of them; None: the servers hold them
    partitioned: bool = False  # at N > 1 its cache is partitioned among the trainers
    #                            (engine/planning/partition.py): the oracle keeps each row's home, and
    #                            its volumes depend on --trainers even in-process
    exact: bool = True  # the same parameters as `sync` ...
    exact_only_if: tuple[str, Any] | None = None  # ... only when this setting has this value
    inexact_when: str = ""  # the same condition, for messages ("--staleness > 0")
    up_to_order: bool = False  # when not exact: sync's parameters up to the order in which
    #                            gradients are summed (hotline), not an approximation
    resumable: bool = True  # when not exact, a checkpoint still holds the parameters it
    #                         trains (hotline's, bitwise; not het's stale copies or
    #                         slipstream's snapshots)
    decisions: Builder | None = None  # a fixed-capacity cache's planner policy: (trace,
    #                                   capacity, hot_sample) -> decisions, as policies/decisions.py's
    #                                   (None: its `policy`'s in policies/table.py)
    planner_bytes_per_row: int = 0  # what its planner keeps per embedding row beyond the
    #                                 oracle's (engine/memory.py's estimate counts it)
    runner: str = ENGINE  # ENGINE, or "module:function" of an external runner (optional install)
    install: str | None = None  # how to install an external runner's library
    # "reference" (speed-ups are over it), "ours", "bound" (local: every table on each
    # trainer; a name, not a claim that nothing is faster), "baseline"
    role: str = "baseline"
    color: str = "#333333"  # its colour in every plot
    published: bool = False  # the Bagpipe paper compared it (a scenario's `reported:` applies)

    def is_exact(self, cfg: Any) -> bool:
        """Whether `cfg` (a TrainConfig) trains the same parameters as `sync` would."""
        if not self.exact:
            return False
        if self.exact_only_if is None:
            return True
        key, value = self.exact_only_if
        return getattr(cfg, key) == value

    def fidelity(self, cfg: Any) -> str:
        """What `cfg` trains, against sync: "exact" (the same bits), "rounding" (the same
        up to the order of summation) or "approximate" (another computation)."""
        if self.is_exact(cfg):
            return "exact"
        return "rounding" if self.up_to_order else "approximate"

    def exact_settings(self) -> dict[str, Any]:
        """The settings under which it is exact (`{"staleness": 0}` for het, else none)."""
        return dict([self.exact_only_if]) if self.exact_only_if else {}

    def ignored_settings(self, cache_rows: int | None) -> set[str]:
        """The SYSTEM_SETTINGS this system does not read (with `cache_rows` as configured)."""
        ignored = set(SYSTEM_SETTINGS) - self.reads
        if self.capacity_from_peak and cache_rows is not None:
            ignored |= {"lookahead", "round"}  # only read for the default capacity
        return ignored

    def round_length(self, lookahead: int, round_len: int | None) -> int:
        """Iterations per round at these settings."""
        return (round_len or max(1, lookahead // 4)) if self.rounds else 1

    def planner_decisions(self) -> Builder:
        """Its fixed-capacity cache's planner policy: its own, or its `policy`'s."""
        if self.decisions is not None:
            return self.decisions
        decide = policy(self.policy).decisions if self.policy else None
        if decide is None:
            raise ValueError(f"system {self.name!r} has no planner policy a trainer can follow")
        return decide

    def profiled(self) -> str | None:
        """The policy `bagpipe profile` simulates for its cache (policies/table.py): its own
        (its `decisions`), the one it follows, the table's of its name (bagpipe, prefetch) or
        no cache for the reference; None where profile has none (a cache that is not a policy's)."""
        if self.decisions is not None:
            return self.name
        if self.policy:
            return self.policy
        if any(p.name == self.name for p in TABLE):
            return self.name
        return with_role("reference").name if self.role == "reference" else None

    def facts(self) -> dict[str, Any]:
        """What `bagpipe systems` shows of it."""
        if self.role == "reference":
            fidelity = "(it is sync)"
        elif self.exact and self.exact_only_if:
            key, value = self.exact_only_if
            fidelity = f"for --{key.replace('_', '-')} {value}"
        else:
            fidelity = "yes" if self.exact else "up to the order of summation" if self.up_to_order else "no"
        if self.external:
            cache = f"external ({self.install})"
        elif self.partitioned:
            cache = "partitioned among the trainers (N > 1)"
        elif self.holds_tables == "shard":
            cache = "none: the tables sharded across the trainers" + (
                " (and a hot set on every one)" if "hot_sample" in self.reads else "")
        elif self.holds_tables == "all":
            cache = "every row"
        else:
            cache = "replicated" if self.replicated else "none: gradients pushed to the servers"
        return {"name": self.name, "role": self.role, "summary": self.summary,
                "fidelity": fidelity, "reads": sorted(f"--{s.replace('_', '-')}" for s in self.reads),
                "cache": cache,
                "simulated": (self.volumes or "").partition(":")[2].removesuffix("_volumes"),
                "profiled": self.profiled(),
                "color": self.color,
                "runner": self.runner}

    def simulated_volumes(self, trace: Any) -> Any:
        """Its per-iteration volumes on a simulated trace (`simulate/volumes.py`)."""
        module, fn = (self.volumes or "").partition(":")[::2]
        if not fn:
            raise ConfigError(f"--systems {self.name}: simulate has no performance model of it")
        return getattr(importlib.import_module(module), fn)(trace, self)

    @property
    def external(self) -> bool:
        return self.runner != ENGINE


_CACHE_SETTINGS = frozenset({"lookahead", "round", "cache_rows"})


def _baseline(name: str, summary: str, reads: frozenset[str] = _CACHE_SETTINGS,
              **kw: Any) -> SystemSpec:
    """A fixed-capacity cache that follows the policy table's policy `name`."""
    return SystemSpec(name, summary, plan=Lazy(f"{PLANNER}:policy_plan"),
                      build_system=Lazy(f"{SYSTEMS_PACKAGE}:CacheSystem.build",
                                        prefetch_ahead=False, lrpp=False),
                      volumes=f"{VOLUMES}:policy_volumes", replicated=True, reads=reads,
                      capacity_from_peak=True, policy=name, color=policy(name).color, **kw)


_SPECS = (
    SystemSpec("sync", "no cache: every iteration fetches its rows and writes the update back "
               "(parameter server)", plan=Lazy(f"{PLANNER}:no_plan"),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}:SyncSystem.build"),
               volumes=f"{VOLUMES}:fetched_volumes", replicated=False, global_view=False,
               role="reference", published=True,
               color=policy("none").color),
    SystemSpec("bagpipe", "lookahead oracle cache + prefetch one round ahead + LRPP",
               plan=Lazy(f"{PLANNER}:lookahead_plan"),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}.partitioned:bagpipe_system"),
               volumes=f"{VOLUMES}:lookahead_volumes", replicated=True, reads=_CACHE_SETTINGS,
               partitioned=True,
               rounds=True, role="ours", published=True, color=policy("bagpipe").color),
    SystemSpec("prefetch", "one-batch prefetch pipeline (TorchRec/FBGEMM style): batch b+1's "
               "rows are fetched into the cache while batch b trains; no lookahead beyond it",
               plan=Lazy(f"{PLANNER}:lookahead_plan", lookahead=1, lrpp=False),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}:CacheSystem.build", prefetch_ahead=True,
                                 lrpp=False),
               volumes=f"{VOLUMES}:prefetch_volumes", replicated=True,
               reads=frozenset({"cache_rows"}), color=policy("prefetch").color),
    _baseline("lru", "fixed cache, fetch on miss, evict the least recently used"),
    _baseline("lfu", "fixed cache, fetch on miss, evict the least frequently used"),
    _baseline("fae", "static cache of the hottest rows (FAE); the others fetched every iteration",
              reads=_CACHE_SETTINGS | {"hot_sample"}, published=True),
    SystemSpec("hotline", "fae's hot set; each batch split: samples whose rows are all hot "
               "compute while the others' rows are fetched, then the rest, one optimizer step",
               plan=Lazy(f"{PLANNER}:policy_plan"),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}.hotline:HotlineSystem.build"),
               volumes=f"{VOLUMES}:hotline_volumes", replicated=True, reads=_CACHE_SETTINGS | {"hot_sample"},
               capacity_from_peak=True, policy="fae", exact=False, up_to_order=True,
               color="#bcbd22"),
    SystemSpec("slipstream", "fae's hot set, snapshotted every --snapshot-every iterations; "
               "samples whose rows mostly stopped changing are skipped (--drop-target of them)",
               plan=Lazy(f"{PLANNER}:policy_plan"),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}.slipstream:SlipstreamSystem.build"),
               volumes=None, replicated=True,
               reads=_CACHE_SETTINGS | {"hot_sample", "snapshot_every", "drop_target", "stale_share"},
               capacity_from_peak=True, policy="fae", exact_only_if=("drop_target", 0.0),
               inexact_when="--drop-target > 0", resumable=False, color="#393b79"),
    SystemSpec("het", "bounded-staleness cache (HET): copies may lag --staleness versions",
               plan=Lazy(f"{PLANNER}:no_plan"),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}:HetSystem.build"),
               volumes=f"{VOLUMES}:stale_volumes",
               per_trainer_volumes=True, replicated=False, reads=frozenset({"staleness"}),
               exact_only_if=("staleness", 0), inexact_when="--staleness > 0", resumable=False,
               published=True, color="#ff7f0e"),
    SystemSpec("local", "every table on each trainer: no fetches, all row gradients summed "
               "among the trainers",
               plan=Lazy(f"{PLANNER}:no_plan"),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}:LocalSystem.build"),
               volumes=f"{VOLUMES}:local_volumes", holds_tables="all",
               replicated=True, role="bound", color="#17becf"),
    SystemSpec("sharded", "the tables sharded row-wise across the trainers (TorchRec's and "
               "HugeCTR's model parallelism): all-to-alls of ids, rows and gradients; no cache",
               plan=Lazy(f"{PLANNER}:no_plan"),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}.sharded:ShardedSystem.build"),
               volumes="bagpipe_cli.simulate.sharded:sharded_volumes", replicated=False, global_view=False, holds_tables="shard",
               color="#e7969c"),
    SystemSpec("sharded-hot", "sharded, with the rows whose sum costs fewer bytes than their "
               "all-to-alls (profiled over --hot-sample; not --cache-rows) replicated on every "
               "trainer: their gradients summed among all trainers, only cold rows in the all-to-alls",
               plan=Lazy(f"{PLANNER}:no_plan"),
               build_system=Lazy(f"{SYSTEMS_PACKAGE}.sharded_hot:sharded_hot_system"),
               volumes="bagpipe_cli.simulate.sharded:sharded_hot_volumes", replicated=False, holds_tables="shard",
               reads=frozenset({"hot_sample"}), color="#637939"),
    SystemSpec("torchrec", "TorchRec EmbeddingBagCollection + DistributedModelParallel "
               "(optional: make torchrec)", plan=Lazy(f"{PLANNER}:no_plan"), build_system=None,
               volumes=None,
               replicated=False, runner="bagpipe_cli.external.torchrec_run:run_torchrec",
               install="make torchrec", exact=False, up_to_order=True, color="#8c564b"),
)
SYSTEMS: dict[str, SystemSpec] = {s.name: s for s in _SPECS}
REFERENCE = next(s.name for s in _SPECS if s.role == "reference")  # "sync": speed-ups are over it
OURS = next(s.name for s in _SPECS if s.role == "ours")  # "bagpipe"


def _lists() -> None:
    """The lists made of SYSTEMS (made again when a system is registered)."""
    global ENGINE_SYSTEMS, SIMULATED_SYSTEMS, ALL_SYSTEMS
    ENGINE_SYSTEMS = tuple(s.name for s in SYSTEMS.values() if not s.external)
    SIMULATED_SYSTEMS = tuple(s.name for s in SYSTEMS.values() if s.volumes)  # `simulate` models these
    ALL_SYSTEMS = tuple(SYSTEMS)


ENGINE_SYSTEMS: tuple[str, ...]
SIMULATED_SYSTEMS: tuple[str, ...]
ALL_SYSTEMS: tuple[str, ...]
_lists()


def register(s: SystemSpec) -> None:
    """Add system `s` (a plugin's, or a test's). Modules copy the lists when they are first
    imported (a command's choices, `simulate`'s systems), so register before importing them."""
    if s.name in SYSTEMS:
        raise ValueError(f"system {s.name!r} is registered already")
    SYSTEMS[s.name] = s
    _lists()


# A bench or cluster file's `systems:` may name a group instead of listing its systems.
GROUPS = {"all": "every system of the engine", "simulated": "every system `simulate` models",
          "each-model": "one system of each traffic model `simulate` has"}


def group(name: str, systems: dict[str, SystemSpec] | None = None) -> tuple[str, ...] | None:
    """The systems of group `name` (GROUPS) among `systems` (default: the registry's), in
    their order; None if `name` is no group."""
    systems = SYSTEMS if systems is None else systems
    simulated = [n for n, s in systems.items() if s.volumes]
    if name == "all":
        return tuple(n for n, s in systems.items() if not s.external)
    if name == "simulated":
        return tuple(simulated)
    if name == "each-model":
        first: dict[str | None, str] = {}
        for n in simulated:
            first.setdefault(systems[n].volumes, n)
        return tuple(first.values())
    return None


def names_where(test: Callable[[SystemSpec], bool]) -> tuple[str, ...]:
    """The systems for which `test(spec)` holds, in registry order."""
    return tuple(s.name for s in SYSTEMS.values() if test(s))


def listed(names: Any) -> str:
    """Names in words: "a", "a and b", "a, b and c"."""
    names = list(names)
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + (names[-1] if names else "")


def system_facts() -> list[dict[str, Any]]:
    """`bagpipe systems`'s rows: every system's `facts()`, in registry order."""
    return [s.facts() for s in SYSTEMS.values()]


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

"""Planning a bench: a `BenchConfig` -> every distinct run, in the order one repeat runs them.

A setting a system does not read (Bagpipe's lookahead for `sync`) is reset to its default
for that system (`effective_config`), so it neither multiplies the system's runs nor
changes its run id: runs are deduplicated by the hash of their effective config
(`config_key`). Labels and slugs (`L16`, `net=slow`) name the runs.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import re
import typing
from dataclasses import dataclass, fields, replace
from typing import Any

from bagpipe_cli.bench.matrix import BenchConfig
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.registry import SYSTEM_SETTINGS, SYSTEMS
from bagpipe_cli.errors import ConfigError

# Settings that belong to a system rather than to the environment it runs in: the report
# compares systems across them (Bagpipe at L=16 against sync in the same setting).
SYSTEM_OWN_SETTINGS = SYSTEM_SETTINGS
MAX_REPEAT = 1000  # repeats of every run
MAX_RUNS = 100_000  # runs of a bench, repeats included
TRACE_FILE = "trace.json"  # a traced bench run's --trace: its trace, in its run folder
# Short names of settings, the one table of them: run ids and labels here, the report's
# variants (`report.analysis`), `simulate --validate`'s settings. No two share a name; a
# setting without one is shown by its own name.
SHORT = {"lookahead": "L", "round": "C", "cache_rows": "R", "trainers": "N", "servers": "K",
         "batch_size": "B", "emb_dim": "E", "net_gbps": "net", "net_latency_us": "lat",
         "iterations": "it", "optimizer": "opt", "dense_optimizer": "dopt", "staleness": "s",
         "hot_sample": "hot", "snapshot_every": "snap", "drop_target": "D", "stale_share": "alpha"}


def ignored_settings(system: str, cache_rows: int | None = None) -> set[str]:
    """The `TrainConfig` settings `system` does not read (they are reset to defaults); every
    setting is read by a system the registry does not know (never deduplicated wrongly)."""
    s = SYSTEMS.get(system)
    return s.ignored_settings(cache_rows) if s is not None else set()


def train_fields() -> dict[str, Any]:
    """Every `TrainConfig` field: name -> (type hint, default)."""
    return dict(_train_fields())


@functools.cache
def _train_fields() -> dict[str, Any]:  # (type hints are slow to resolve: once per process)
    hints = typing.get_type_hints(TrainConfig)
    return {f.name: (hints[f.name], f.default) for f in fields(TrainConfig)}


@dataclass(frozen=True)
class PlannedRun:
    """One configuration of the matrix (repeated `repeat` times)."""

    config: Any  # TrainConfig (effective: settings the system ignores are at their defaults)
    dataset: str  # dataset name
    setting: dict[str, str]  # matrix axis -> label ("net=slow"), axes not the system's own
    variant: dict[str, str]  # matrix axis -> label ("L16"), the system's own settings
    slug: str  # readable part of the run id
    key: str  # short hash of the effective config

    def run_id(self, repeat: int) -> str:
        return f"{self.slug}-{self.key}-r{repeat}"

    @property
    def setting_label(self) -> str:
        return ", ".join(self.setting.values()) or "-"

    @property
    def variant_label(self) -> str:
        return ", ".join(self.variant.values())


def slugify(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", str(s)).strip("-") or "x"


def value_label(name: str, v: Any) -> str:
    """`L16` for a setting with a short name and a number, else `device=cuda`."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    shown = "none" if v is None else v
    if name in SHORT and not isinstance(v, str):
        return slugify(f"{SHORT[name]}{shown}")
    return f"{SHORT.get(name, name)}={slugify(shown)}"


def config_key(cfg: Any) -> str:
    """8 hex digits of the SHA-1 of the effective config (sorted JSON; its fields are scalars
    and tuples, so this is `asdict`'s JSON, made without its deep copy)."""
    blob = json.dumps({f.name: getattr(cfg, f.name) for f in fields(cfg)}, sort_keys=True,
                      default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:8]


def effective_config(cfg: Any) -> Any:
    """`cfg` with the settings its system ignores reset to their defaults."""
    defaults = {k: d for k, (_, d) in _train_fields().items()}
    reset = {k: defaults[k] for k in ignored_settings(cfg.system, cfg.cache_rows) if k in defaults}
    if all(getattr(cfg, k) == v for k, v in reset.items()):
        return cfg  # (already so: no second validation)
    return replace(cfg, **reset)


def plan_runs(cfg: BenchConfig) -> list[PlannedRun]:
    """Every distinct effective configuration, in the order one repeat runs them.

    Comparable runs are adjacent: for each dataset, model and matrix choice, every system.
    A bench too large to run is refused first, from its matrix's sizes (`count_runs`). The
    last plan is kept: loading a bench file plans it (to validate every run), running it
    plans it again (another --repeat aside, the same plan).
    """
    check_size(cfg, count_runs(cfg))
    key = json.dumps({**cfg.to_json(), "repeat": None}, sort_keys=True, default=str)
    if key not in _LAST_PLAN:
        _LAST_PLAN.clear()
        _LAST_PLAN[key] = _plan(cfg)
    return list(_LAST_PLAN[key])


_LAST_PLAN: dict[str, list[PlannedRun]] = {}


def _plan(cfg: BenchConfig) -> list[PlannedRun]:
    varying = [a for a in cfg.matrix if len(a.choices) > 1]
    seen: dict[str, PlannedRun] = {}
    for ds, model, combo in itertools.product(cfg.datasets, cfg.models,
                                              itertools.product(*[a.choices for a in cfg.matrix])):
        settings: dict[str, Any] = dict(cfg.base, **({"trace": TRACE_FILE} if cfg.trace else {}))
        for (_, s) in combo:
            settings.update(s)
        for system, own_combo in ((s, oc) for s in cfg.systems for oc in itertools.product(
                *[a.choices for a in cfg.system_axes.get(s, ())])):
            own_settings = dict(settings)
            for (_, s) in own_combo:
                own_settings.update(s)
            try:
                tc = TrainConfig(data=str(ds.path), system=system, model=model, **own_settings)
                if tc.transport == "torch" and tc.procs is None:
                    tc = replace(tc, procs=tc.world_size)  # a bench starts the ranks itself
            except ConfigError as e:
                raise ConfigError(f"{cfg.source}: {system}/{model} with {own_settings}: {e}") from None
            if tc.warmup >= tc.iterations:
                raise ConfigError(f"{cfg.source}: warmup {tc.warmup} must be below iterations "
                                  f"{tc.iterations} (warm-up iterations are excluded from figures)")
            eff = effective_config(tc)
            key = config_key(eff)
            if key in seen:
                continue
            ignored = ignored_settings(system, tc.cache_rows)
            setting, variant = {}, {}
            for axis, (label, s) in zip(cfg.matrix, combo, strict=True):
                if axis not in varying or (s and set(s) <= ignored) or (not s and axis.settings <= ignored):
                    continue
                if axis.settings <= set(SYSTEM_OWN_SETTINGS):
                    variant[axis.name] = axis.display(label)
                else:
                    setting[axis.name] = axis.display(label)
            for axis, (label, _s) in zip(cfg.system_axes.get(system, ()), own_combo, strict=True):
                if len(axis.choices) > 1:
                    variant[axis.name] = axis.display(label)
            parts = [system, model]
            if len(cfg.datasets) > 1:
                parts.append(ds.name)
            parts += [slugify(x.split("=")[-1]) for x in [*variant.values(), *setting.values()]]
            seen[key] = PlannedRun(eff, ds.name, setting, variant, slugify("-".join(parts)), key)
    return list(seen.values())


def count_runs(cfg: BenchConfig) -> int:
    """The runs of one repeat, counted from the matrix's sizes without building any: per
    system, the product of its distinct choices of every axis (choices that differ only in
    settings the system does not read are one) and of its own axes; times the datasets and
    models. At least `plan_runs`'s count (which may find a few more alike), so a bench this
    allows is one `plan_runs` allows."""
    per_system = 0
    for system in cfg.systems:
        ignored = ignored_settings(system)
        n = 1
        for axis in cfg.matrix:
            n *= len({json.dumps({k: v for k, v in s.items() if k not in ignored},
                                 sort_keys=True, default=str) for _, s in axis.choices})
        for axis in cfg.system_axes.get(system, ()):
            n *= len(axis.choices)
        per_system += n
    return per_system * len(cfg.datasets) * len(cfg.models)


def count_combinations(cfg: BenchConfig) -> int:
    """The choices `plan_runs` walks through before runs alike are merged: the product of
    every axis's size (an axis of labels alone, which sets nothing, too) times the datasets
    and models, summed over the systems' own axes. Counted, never enumerated."""
    crossed = math.prod(len(a.choices) for a in cfg.matrix)
    own = sum(math.prod(len(a.choices) for a in cfg.system_axes.get(s, ())) for s in cfg.systems)
    return crossed * own * len(cfg.datasets) * len(cfg.models)


def check_size(cfg: BenchConfig, runs: int) -> None:
    """A bench that can finish and be planned: at most MAX_REPEAT repeats (cfg.repeat: the
    file's, or --repeat's), MAX_RUNS runs in all, and at most MAX_RUNS combinations of its
    axes to plan (`count_combinations`)."""
    if cfg.repeat > MAX_REPEAT:
        raise ConfigError(f"{cfg.source}: repeat {cfg.repeat:,} (the file's, or --repeat): at "
                          f"most {MAX_REPEAT:,}; a median over more repeats says nothing new")
    if runs * cfg.repeat > MAX_RUNS:
        raise ConfigError(f"{cfg.source}: {runs:,} runs x {cfg.repeat:,} repeats = "
                          f"{runs * cfg.repeat:,} runs, more than {MAX_RUNS:,} "
                          f"({duration(runs * cfg.repeat)} at 1 s a run); cut the matrix or "
                          "the repeats")
    if (combos := count_combinations(cfg)) > MAX_RUNS:
        sizes = [str(len(a.choices)) for a in cfg.matrix]
        shown = " x ".join(sizes if len(sizes) <= 6 else [*sizes[:3], "...", *sizes[-2:]])
        raise ConfigError(f"{cfg.source}: the matrix's {len(cfg.matrix)} axes ({shown}) cross "
                          f"into {_count(combos)} combinations to plan, every axis counted (one "
                          f"of labels alone too), more than {MAX_RUNS:,}; cut the matrix")


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**12 else f"{n:.1e}".replace("e+", "e")


def duration(seconds: float) -> str:
    """`40 minutes`, `56 hours`, `12 days`: a time in the unit that reads best."""
    for unit, size, below in (("seconds", 1, 120), ("minutes", 60, 7200),
                              ("hours", 3600, 172_800), ("days", 86_400, math.inf)):
        if seconds < below:
            return f"{seconds / size:,.0f} {unit}"
    return ""  # (unreachable)


def plan_lines(cfg: BenchConfig) -> list[str]:
    """`bagpipe bench --dry-run`'s output: the plan `plan_runs` makes (its size checks
    included), one line per configuration (its run id without `-r<N>`, system, model, dataset,
    variant and setting), then `N configurations x R repeats = M runs` and the run ids of the
    first repeat and the last (repeats are interleaved: the plan's order, repeat by repeat)."""
    plan = plan_runs(cfg)
    lines = [f"bench {cfg.name} ({cfg.source}): datasets {len(cfg.datasets)}, models "
             f"{len(cfg.models)}, systems {len(cfg.systems)}, matrix axes "
             f"{' x '.join(str(len(a.choices)) for a in cfg.matrix) or 'none'}"]
    lines.append("configuration\tsystem\tmodel\tdataset\tvariant\tsetting")
    for p in plan:
        lines.append("\t".join([f"{p.slug}-{p.key}", p.config.system, p.config.model, p.dataset,
                                p.variant_label or "-", p.setting_label]))
    n = len(plan)
    lines.append(f"{n:,} configuration{'s' if n != 1 else ''} x {cfg.repeat:,} "
                 f"repeat{'s' if cfg.repeat != 1 else ''} = {n * cfg.repeat:,} "
                 f"run{'s' if n * cfg.repeat != 1 else ''}")
    lines.append(f"run ids: <configuration>-r<repeat>, repeat 1 to {cfg.repeat:,} (e.g. "
                 f"{plan[0].run_id(1) if plan else '-'})")
    return lines

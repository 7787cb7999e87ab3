"""Benchmark matrices: a YAML or TOML file -> a validated `BenchConfig` -> the planned runs.

A bench file names datasets, models and systems, a `base` of `TrainConfig` settings, and a
`matrix` whose lists are crossed (see benchmarks/quick.yaml):

    name: quick
    datasets:
      - name: synth-criteo-0.01
        path: results/datasets/synth-criteo-0.01      # relative to the current directory
        synth: {preset: criteo-kaggle, scale: 0.01, rows: 300000}   # generated if missing
    models: [dlrm]
    systems: [sync, bagpipe]
    repeat: 3
    base: {batch_size: 2048, iterations: 60, warmup: 10}
    matrix:
      lookahead: [16, 64]              # a TrainConfig setting: a list of values
      net:                             # any other name: a list of groups of settings
        - {label: no-net}
        - {label: 0.25Gbps, net_gbps: 0.25, net_latency_us: 50}
    profile: {policies: [none, bagpipe]}   # or false: no access profile of the datasets

A setting a system does not read (Bagpipe's lookahead for `sync`) is reset to its default
for that system, so it neither multiplies the system's runs nor changes its run id: runs
are deduplicated by their *effective* config.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bagpipe_cli.errors import ConfigError

CONFIG_SCHEMA_VERSION = 1
BENCH_KEYS = ("name", "description", "datasets", "models", "systems", "repeat", "base", "matrix",
              "profile")
DATASET_KEYS = ("name", "path", "synth")
PROFILE_KEYS = ("enabled", "batch_size", "lookaheads", "policies", "dim")
# Set by `datasets`, `systems` and `models`, never by `base` or `matrix`.
RESERVED_FIELDS = ("data", "system", "model")

# Settings that belong to a system rather than to the environment it runs in: the report
# compares systems across them (Bagpipe at L=16 against sync in the same setting).
SYSTEM_OWN_SETTINGS = ("lookahead", "round", "cache_rows", "staleness")
# Which systems read each of them. lru/lfu/fae read lookahead and round only for their
# default capacity (Bagpipe's peak at that lookahead), i.e. when cache_rows is not given.
_READERS = {
    "lookahead": {"bagpipe", "lru", "lfu", "fae"},
    "round": {"bagpipe", "lru", "lfu", "fae"},
    "cache_rows": {"bagpipe", "lru", "lfu", "fae"},
    "staleness": {"het"},
    "hot_sample": {"fae"},
}
_CAPACITY_FROM_PEAK = {"lru", "lfu", "fae"}
# Systems whose settings are known; any other system is assumed to read every setting, so
# that it is never deduplicated wrongly (at worst it runs more often than needed).
_KNOWN_SYSTEMS = {"sync", "bagpipe", "lru", "lfu", "fae", "het", "local", "torchrec"}
# Short names for run ids and labels.
SHORT = {"lookahead": "L", "round": "C", "cache_rows": "R", "trainers": "N", "servers": "K",
         "batch_size": "B", "emb_dim": "E", "net_gbps": "net", "net_latency_us": "lat",
         "iterations": "it", "optimizer": "opt", "dense_optimizer": "dopt", "staleness": "s"}


def ignored_settings(system: str, cache_rows: int | None = None) -> set[str]:
    """The `TrainConfig` settings `system` does not read (they are reset to defaults)."""
    if system not in _KNOWN_SYSTEMS:
        return set()
    ignored = {k for k, readers in _READERS.items() if system not in readers}
    if system in _CAPACITY_FROM_PEAK and cache_rows is not None:
        ignored |= {"lookahead", "round"}
    return ignored


def _train_fields() -> dict[str, Any]:
    from bagpipe_cli.engine.trainer import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    return {f.name: (hints[f.name], f.default) for f in fields(TrainConfig)}


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of a bench: a directory, and how to generate it if it is missing."""

    name: str
    path: Path
    synth: dict[str, Any] | None = None  # SynthConfig arguments (generated when path is missing)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "synth": self.synth}


@dataclass(frozen=True)
class MatrixAxis:
    """One crossed list: each choice is (label, settings)."""

    name: str
    choices: tuple[tuple[str, dict[str, Any]], ...]
    group: bool = False  # choices are groups of settings (labelled), not values of one setting

    def display(self, label: str) -> str:
        """`L16` for a value axis, `net=slow` for a group axis."""
        return f"{self.name}={label}" if self.group else label

    @property
    def settings(self) -> set[str]:
        return {k for _, s in self.choices for k in s}


@dataclass(frozen=True)
class ProfileSpec:
    """The access profile run once per dataset (for the report's skew CDF)."""

    batch_size: int | None = None  # default: the first run's batch size
    lookaheads: tuple[int, ...] | None = None  # default: every Bagpipe lookahead of the bench
    policies: tuple[str, ...] = ("none", "bagpipe")
    dim: int | None = None  # default: the first run's embedding dimension


@dataclass(frozen=True)
class BenchConfig:
    """A benchmark matrix, as loaded from a YAML/TOML file."""

    name: str
    source: str  # the file it was loaded from
    datasets: tuple[DatasetSpec, ...]
    models: tuple[str, ...]
    systems: tuple[str, ...]
    repeat: int = 1
    base: dict[str, Any] = field(default_factory=dict)
    matrix: tuple[MatrixAxis, ...] = ()
    profile: ProfileSpec | None = ProfileSpec()
    description: str = ""
    system_axes: dict[str, tuple[MatrixAxis, ...]] = field(default_factory=dict)  # per-system sweeps

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": CONFIG_SCHEMA_VERSION, "name": self.name, "source": self.source,
            "description": self.description,
            "datasets": [d.to_json() for d in self.datasets], "models": list(self.models),
            "systems": [{"name": s, **_axes_json(self.system_axes[s])} if s in self.system_axes
                        else s for s in self.systems],
            "repeat": self.repeat, "base": dict(self.base), "matrix": _axes_json(self.matrix),
            "profile": None if self.profile is None else {
                k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.profile).items()},
        }

    def with_repeat(self, repeat: int | None) -> BenchConfig:
        if repeat is None:
            return self
        if repeat < 1:
            raise ConfigError(f"--repeat must be >= 1 (got {repeat})")
        return BenchConfig(**{**{f.name: getattr(self, f.name) for f in fields(self)}, "repeat": repeat})


def _axes_json(axes: tuple[MatrixAxis, ...]) -> dict[str, list]:
    return {a.name: ([{"label": lab, **s} for lab, s in a.choices] if a.group
                     else [s[a.name] for _, s in a.choices]) for a in axes}


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


# ---------------------------------------------------------------------------------------
# Loading


def load_bench_config(path: Path) -> BenchConfig:
    """Read and validate a bench file (.yaml/.yml or .toml); errors name the file and key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"bench config {path} does not exist" if not path.exists()
                          else f"bench config {path} is not a file")
    text = path.read_text()
    if path.suffix.lower() == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise ConfigError(f"{path}: reading TOML needs Python 3.11+; use YAML") from None
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
    else:
        import yaml

        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            line = f" line {where.line + 1}" if where is not None else ""
            raise ConfigError(f"{path}:{line} not valid YAML: {getattr(e, 'problem', e)}") from None
    return parse_bench_config(raw, str(path))


def parse_bench_config(raw: Any, source: str = "<bench>") -> BenchConfig:
    """Validate a bench config given as a mapping (the parsed file)."""
    from bagpipe_cli.engine.systems import SYSTEMS
    from bagpipe_cli.engine.trainer import EXTERNAL_SYSTEMS
    from bagpipe_cli.models import MODELS

    where = source
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of {', '.join(BENCH_KEYS)}")
    _unknown(raw, BENCH_KEYS, where, "")
    name = raw.get("name") or Path(source).stem
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ConfigError(f"{where}: name {name!r}: use letters, digits, '.', '_' and '-' only")

    datasets = _datasets(raw.get("datasets"), where)
    models = tuple(_str_list(raw.get("models", ["dlrm"]), where, "models"))
    for m in models:
        if m not in MODELS:
            raise ConfigError(f"{where}: models: unknown model {m!r}; choose from "
                              f"{', '.join(sorted(MODELS))}")
    tf = _train_fields()
    systems, system_axes = _systems(raw.get("systems"), tf, where, (*SYSTEMS, *EXTERNAL_SYSTEMS))
    repeat = raw.get("repeat", 1)
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise ConfigError(f"{where}: repeat must be an integer >= 1 (got {repeat!r})")

    base_raw = raw.get("base") or {}
    if not isinstance(base_raw, dict):
        raise ConfigError(f"{where}: base must be a mapping of training settings")
    base = {k: _setting(k, v, tf, where, f"base.{k}") for k, v in base_raw.items()}
    matrix = _matrix(raw.get("matrix") or {}, tf, where)
    prof = _profile(raw.get("profile", True), where)
    cfg = BenchConfig(name=name, source=source, datasets=datasets, models=models, systems=systems,
                      repeat=repeat, base=base, matrix=matrix, profile=prof, system_axes=system_axes,
                      description=str(raw.get("description") or ""))
    plan_runs(cfg)  # every run's TrainConfig is validated now, before any work
    return cfg


def _systems(v: Any, tf: dict[str, Any], where: str, known: tuple[str, ...]
             ) -> tuple[tuple[str, ...], dict[str, tuple[MatrixAxis, ...]]]:
    """`[sync, {name: bagpipe, lookahead: [4, 16, 64]}]`: a mapping adds settings crossed
    for that system only (its own sweep)."""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}: systems must be a non-empty list of names (got {v!r})")
    names, axes = [], {}
    for i, e in enumerate(v):
        own: dict[str, Any] = {}
        if isinstance(e, dict):
            e = dict(e)
            if "name" not in e:
                raise ConfigError(f"{where}: systems[{i}] needs a name")
            name = e.pop("name")
            own = e
        else:
            name = e
        if not isinstance(name, str) or name not in known:
            raise ConfigError(f"{where}: systems: unknown system {name!r}; this bagpipe has "
                              f"{', '.join(known)}")
        if name in names:
            raise ConfigError(f"{where}: systems lists {name!r} twice")
        names.append(name)
        if own:
            axes[name] = _matrix(own, tf, where, prefix=f"systems[{i}]")
    return tuple(names), axes


def _unknown(d: dict, allowed: tuple[str, ...], where: str, prefix: str) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"{where}: unknown key {prefix}{k!r}; expected one of {', '.join(allowed)}")


def _str_list(v: Any, where: str, key: str) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{where}: {key} must be a non-empty list of names (got {v!r})")
    if len(set(v)) != len(v):
        raise ConfigError(f"{where}: {key} lists a name twice: {v}")
    return v


def _datasets(v: Any, where: str) -> tuple[DatasetSpec, ...]:
    from bagpipe_cli.data.synth import SynthConfig

    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}: datasets must be a non-empty list of {{name, path, synth}}")
    out = []
    synth_keys = tuple(f.name for f in fields(SynthConfig))
    for i, d in enumerate(v):
        if isinstance(d, str):
            d = {"path": d}
        if not isinstance(d, dict) or "path" not in d:
            raise ConfigError(f"{where}: datasets[{i}] needs a path")
        _unknown(d, DATASET_KEYS, where, f"datasets[{i}].")
        path = Path(str(d["path"]))
        name = str(d.get("name") or path.name)
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise ConfigError(f"{where}: datasets[{i}].name {name!r}: use letters, digits, '.', '_', '-'")
        synth = d.get("synth")
        if synth is not None:
            if not isinstance(synth, dict):
                raise ConfigError(f"{where}: datasets[{i}].synth must be a mapping of synth options")
            _unknown(synth, synth_keys, where, f"datasets[{i}].synth.")
            try:
                SynthConfig(**synth)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{where}: datasets[{i}].synth: {e}") from None
            except ConfigError as e:
                raise ConfigError(f"{where}: datasets[{i}].synth: {e}") from None
        out.append(DatasetSpec(name, path, synth))
    names = [d.name for d in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: datasets: two datasets are named alike ({names}); set name:")
    return tuple(out)


def _setting(key: str, v: Any, tf: dict[str, Any], where: str, what: str) -> Any:
    """Check one TrainConfig setting's name and type."""
    if key in RESERVED_FIELDS:
        raise ConfigError(f"{where}: {what}: {key!r} is set by the bench's "
                          f"{'datasets' if key == 'data' else key + 's'} list, not here")
    if key not in tf:
        allowed = ", ".join(k for k in tf if k not in RESERVED_FIELDS)
        raise ConfigError(f"{where}: unknown key {what!r}; training settings are: {allowed}")
    hint = tf[key][0]
    args = typing.get_args(hint) or (hint,)
    if v is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{where}: {what} cannot be null")
    if isinstance(v, str) and v.lower() in ("none", "null") and type(None) in args:
        return None  # TOML has no null
    if int in args and isinstance(v, int) and not isinstance(v, bool):
        return v
    if float in args and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if str in args and isinstance(v, str):
        return v
    kind = " or ".join(t.__name__ for t in args if t is not type(None))
    raise ConfigError(f"{where}: {what} must be {kind} (got {v!r})")


def _matrix(m: Any, tf: dict[str, Any], where: str, prefix: str = "matrix") -> tuple[MatrixAxis, ...]:
    if not isinstance(m, dict):
        raise ConfigError(f"{where}: {prefix} must be a mapping of setting -> list of values")
    axes = []
    for name, values in m.items():
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise ConfigError(f"{where}: {prefix}.{name} is an empty list")
        choices: list[tuple[str, dict[str, Any]]] = []
        if all(isinstance(v, dict) for v in values):
            # A group axis: each value is a mapping of settings (with an optional label).
            for i, g in enumerate(values):
                g = dict(g)
                label = str(g.pop("label", "") or f"{name}{i}")
                s = {k: _setting(k, v, tf, where, f"{prefix}.{name}[{i}].{k}") for k, v in g.items()}
                choices.append((_slug(label), s))
        elif any(isinstance(v, dict) for v in values):
            raise ConfigError(f"{where}: {prefix}.{name} mixes mappings and plain values")
        else:
            if name not in tf:
                _setting(name, None, tf, where, f"{prefix}.{name}")  # raises: unknown key
            for v in values:
                val = _setting(name, v, tf, where, f"{prefix}.{name}")
                choices.append((_value_label(name, val), {name: val}))
        labels = [lab for lab, _ in choices]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"{where}: {prefix}.{name}: two choices have the label {labels}; "
                              "give each a distinct label:")
        axes.append(MatrixAxis(str(name), tuple(choices), group=name not in tf))
    return tuple(axes)


def _profile(v: Any, where: str) -> ProfileSpec | None:
    from bagpipe_cli.profile import POLICIES

    if v is False or v is None:
        return None
    if v is True:
        return ProfileSpec()
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: profile must be true, false or a mapping of {', '.join(PROFILE_KEYS)}")
    _unknown(v, PROFILE_KEYS, where, "profile.")
    if v.get("enabled", True) is False:
        return None
    pol = tuple(_str_list(v.get("policies", ["none", "bagpipe"]), where, "profile.policies"))
    for p in pol:
        if p not in POLICIES:
            raise ConfigError(f"{where}: profile.policies: unknown policy {p!r}; choose from "
                              f"{', '.join(POLICIES)}")
    la = v.get("lookaheads")
    if la is not None:
        la = tuple(la) if isinstance(la, list) else (la,)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in la):
            raise ConfigError(f"{where}: profile.lookaheads must be integers >= 1 (got {v['lookaheads']!r})")
    for k in ("batch_size", "dim"):
        x = v.get(k)
        if x is not None and (not isinstance(x, int) or isinstance(x, bool) or x < 1):
            raise ConfigError(f"{where}: profile.{k} must be an integer >= 1 (got {x!r})")
    return ProfileSpec(batch_size=v.get("batch_size"), lookaheads=la, policies=pol, dim=v.get("dim"))


# ---------------------------------------------------------------------------------------
# Planning


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", str(s)).strip("-") or "x"


def _value_label(name: str, v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return _slug(f"{SHORT.get(name, name)}{'none' if v is None else v}")


def config_key(cfg: Any) -> str:
    """8 hex digits of the SHA-1 of the effective config (sorted JSON)."""
    blob = json.dumps(asdict(cfg), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:8]


def effective_config(cfg: Any) -> Any:
    """`cfg` with the settings its system ignores reset to their defaults."""
    from dataclasses import replace

    defaults = {k: d for k, (_, d) in _train_fields().items()}
    reset = {k: defaults[k] for k in ignored_settings(cfg.system, cfg.cache_rows) if k in defaults}
    return replace(cfg, **reset)


def plan_runs(cfg: BenchConfig) -> list[PlannedRun]:
    """Every distinct effective configuration, in the order one repeat runs them.

    Comparable runs are adjacent: for each dataset, model and matrix choice, every system.
    """
    from bagpipe_cli.engine.trainer import TrainConfig

    varying = [a for a in cfg.matrix if len(a.choices) > 1]
    seen: dict[str, PlannedRun] = {}
    for ds, model, combo in itertools.product(cfg.datasets, cfg.models,
                                              itertools.product(*[a.choices for a in cfg.matrix])):
        settings: dict[str, Any] = dict(cfg.base)
        for (_, s) in combo:
            settings.update(s)
        for system, own_combo in ((s, oc) for s in cfg.systems for oc in itertools.product(
                *[a.choices for a in cfg.system_axes.get(s, ())])):
            own_settings = dict(settings)
            for (_, s) in own_combo:
                own_settings.update(s)
            try:
                tc = TrainConfig(data=str(ds.path), system=system, model=model, **own_settings)
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
            parts += [_slug(x.split("=")[-1]) for x in [*variant.values(), *setting.values()]]
            seen[key] = PlannedRun(eff, ds.name, setting, variant, _slug("-".join(parts)), key)
    return list(seen.values())


def find_bench_file(name: str = "quick") -> Path:
    """benchmarks/<name>.yaml next to the package (a source checkout), else under the cwd."""
    for root in (Path(__file__).resolve().parents[2] / "benchmarks", Path.cwd() / "benchmarks"):
        for ext in (".yaml", ".yml", ".toml"):
            p = root / f"{name}{ext}"
            if p.is_file():
                return p
    raise ConfigError(f"--quick: benchmarks/{name}.yaml not found next to the package or in the "
                      "current directory; pass a CONFIG file")

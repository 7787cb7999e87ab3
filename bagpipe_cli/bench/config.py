"""Benchmark matrices: a YAML or TOML file -> a validated `BenchConfig` -> the planned runs.

A bench file names datasets, models and systems, a `base` of `TrainConfig` settings, and a
`matrix` whose lists are crossed (see benchmarks/quick.yaml):

    name: quick
    datasets:
      - name: synth-criteo-0.01
        path: results/datasets/synth-criteo-0.01      # relative to the current directory
        synth: {preset: criteo-kaggle, scale: 0.01, rows: 300000}   # generated if missing
    models: [dlrm]
    systems: [sync, bagpipe]         # or: all (every system of the engine; `bagpipe systems`)
    repeat: 3
    base: {batch_size: 2048, iterations: 60, warmup: 10}
    matrix:
      lookahead: [16, 64]              # a TrainConfig setting: a list of values
      net:                             # any other name: a list of groups of settings
        - {label: no-net}
        - {label: 0.25Gbps, net_gbps: 0.25, net_latency_us: 50}
    profile: {policies: [none, bagpipe]}   # or false: no access profile of the datasets
    trace: true                            # every run's trace.json in its folder (--trace)

A setting a system does not read (Bagpipe's lookahead for `sync`) is reset to its default
for that system, so it neither multiplies the system's runs nor changes its run id: runs
are deduplicated by their *effective* config.

This module loads and validates; the config's types are in `bagpipe_cli.bench.matrix`
and the runs are planned by `bagpipe_cli.bench.plan`.
"""

from __future__ import annotations

import re
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

from bagpipe_cli.bench.matrix import BenchConfig, DatasetSpec, MatrixAxis, ProfileSpec
from bagpipe_cli.bench.plan import (
    check_size,
    count_runs,
    ignored_settings,
    plan_runs,
    slugify,
    train_fields,
    value_label,
)
from bagpipe_cli.data.synth import SynthConfig
from bagpipe_cli.engine.registry import ALL_SYSTEMS, GROUPS, group
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.records import read_record
from bagpipe_cli.model_names import MODEL_NAMES
from bagpipe_cli.policies.table import policy_names

BENCH_KEYS = ("name", "description", "datasets", "models", "systems", "repeat", "base", "matrix",
              "profile", "trace")
DATASET_KEYS = ("name", "path", "synth")
PROFILE_KEYS = ("enabled", "batch_size", "lookaheads", "policies", "dim")
_EXPONENT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+")
NULL_WORDS = ("none", "null")  # a YAML string that means "not set" for an optional setting
# Set by `datasets`, `systems` and `models`, never by `base` or `matrix`.
RESERVED_FIELDS = ("data", "system", "model")
# A bench of at most this many runs a repeat is planned (every run validated) when loaded; a
# larger one when it is run, before any work (so --repeat applies before its planning).
PLAN_ON_LOAD = 10_000


def load_bench_config(path: Path) -> BenchConfig:
    """Read and validate a bench file (.yaml/.yml or .toml); errors name the file and key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"bench config {path} does not exist" if not path.exists()
                          else f"bench config {path} is not a file")
    # YAML (TOML for a .toml file), with the limits of records.KINDS["bench file"].
    return parse_bench_config(read_record(path, "bench file"), str(path))


def parse_bench_config(raw: Any, source: str = "<bench>") -> BenchConfig:
    """Validate a bench config given as a mapping (the parsed file)."""
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
        if m not in MODEL_NAMES:
            raise ConfigError(f"{where}: models: unknown model {m!r}; choose from "
                              f"{', '.join(MODEL_NAMES)}")
    tf = train_fields()
    systems, system_axes = _systems(raw.get("systems"), tf, where, ALL_SYSTEMS)
    repeat = raw.get("repeat", 1)
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise ConfigError(f"{where}: repeat must be an integer >= 1 (got {repeat!r})")

    base_raw = raw.get("base") or {}
    if not isinstance(base_raw, dict):
        raise ConfigError(f"{where}: base must be a mapping of training settings")
    base = {k: _setting(k, v, tf, where, f"base.{k}") for k, v in base_raw.items()}
    matrix = _matrix(raw.get("matrix") or {}, tf, where)
    prof = _profile(raw.get("profile", True), where)
    trace = raw.get("trace", False)
    if not isinstance(trace, bool):
        raise ConfigError(f"{where}: trace must be true or false (got {trace!r})")
    cfg = BenchConfig(name=name, source=source, datasets=datasets, models=models, systems=systems,
                      repeat=repeat, base=base, matrix=matrix, profile=prof, system_axes=system_axes,
                      description=str(raw.get("description") or ""), trace=trace)
    # Checked at one repeat: --repeat may replace the file's (plan_runs counts that one).
    once = cfg.with_repeat(1)
    if (runs := count_runs(once)) <= PLAN_ON_LOAD:
        plan_runs(once)  # every run's TrainConfig is validated now, before any work
    else:  # a bench too large is refused now; a large one is planned (validated) by its run
        check_size(once, runs)
    return cfg


def _systems(v: Any, tf: dict[str, Any], where: str, known: tuple[str, ...]
             ) -> tuple[tuple[str, ...], dict[str, tuple[MatrixAxis, ...]]]:
    """`[sync, {name: bagpipe, lookahead: [4, 16, 64]}]`: a mapping adds settings crossed
    for that system only (its own sweep). A group (`all`, registry.GROUPS) stands for its
    systems, in registry order; a mapping may then give one of them settings of its own."""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}: systems must be a non-empty list of names (got {v!r})")
    names: list[str] = []
    grouped: dict[str, str] = {}  # a system a group brought in -> the group
    axes = {}
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
        members = group(name) if isinstance(name, str) and not own else None
        if members is not None:
            for m in members:
                if m not in names:  # one listed before the group keeps its place
                    names.append(m)
                    grouped[m] = name
            continue
        if not isinstance(name, str) or name not in known:
            raise ConfigError(f"{where}: systems: unknown system {name!r}; this bagpipe has "
                              f"{', '.join(known)} (or a group: {', '.join(GROUPS)})")
        if name in names and not (own and grouped.pop(name, None)):
            raise ConfigError(f"{where}: systems lists {name!r} twice")
        if name not in names:
            names.append(name)
        unread = sorted(ignored_settings(name) & own.keys())
        if unread:  # set for this system alone, so a setting it never reads is a mistake
            readers = [s for s in known if unread[0] not in ignored_settings(s)]
            raise ConfigError(f"{where}: systems[{i}].{unread[0]}: {name} does not read it "
                              f"(read by {', '.join(readers)})")
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
    if key == "trace":
        raise ConfigError(f"{where}: {what}: write `trace: true` at the top of the bench file; "
                          "each run's trace goes into its folder as trace.json")
    if key in ("master", "node_rank"):
        raise ConfigError(f"{where}: {what}: a bench starts every rank of its runs on this "
                          "machine; --master and --node-rank are for `bagpipe train` on several")
    if key not in tf:
        allowed = ", ".join(k for k in tf if k not in RESERVED_FIELDS)
        raise ConfigError(f"{where}: unknown key {what!r}; training settings are: {allowed}")
    hint = tf[key][0]
    if typing.get_origin(hint) is tuple:  # layer sizes: a list of positive integers
        if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                            for x in v):
            return tuple(v)
        raise ConfigError(f"{where}: {what} must be a list of positive integers (got {v!r})")
    if hint is bool:
        if isinstance(v, bool):
            return v
        raise ConfigError(f"{where}: {what} must be true or false (got {v!r})")
    args = typing.get_args(hint) or (hint,)
    if v is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{where}: {what} cannot be null")
    if isinstance(v, str) and v.lower() in NULL_WORDS and type(None) in args:
        return None  # TOML has no null
    if int in args and isinstance(v, int) and not isinstance(v, bool):
        return v
    if float in args and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if float in args and isinstance(v, str) and _EXPONENT.fullmatch(v.strip()):
        return float(v)  # YAML 1.1 reads 1e-3 (no dot) as a string
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
                choices.append((slugify(label), s))
        elif any(isinstance(v, dict) for v in values):
            raise ConfigError(f"{where}: {prefix}.{name} mixes mappings and plain values")
        else:
            if name not in tf:
                _setting(name, None, tf, where, f"{prefix}.{name}")  # raises: unknown key
            for v in values:
                val = _setting(name, v, tf, where, f"{prefix}.{name}")
                choices.append((value_label(name, val), {name: val}))
        labels = [lab for lab, _ in choices]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"{where}: {prefix}.{name}: two choices have the label {labels}; "
                              "give each a distinct label:")
        axes.append(MatrixAxis(str(name), tuple(choices), group=name not in tf))
    return tuple(axes)


def _profile(v: Any, where: str) -> ProfileSpec | None:
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
        if p not in policy_names():
            raise ConfigError(f"{where}: profile.policies: unknown policy {p!r}; choose from "
                              f"{', '.join(policy_names())}")
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


def find_bench_file(name: str = "quick") -> Path:
    """benchmarks/<name>.yaml next to the package (a source checkout), else under the cwd."""
    for root in (Path(__file__).resolve().parents[2] / "benchmarks", Path.cwd() / "benchmarks"):
        for ext in (".yaml", ".yml", ".toml"):
            p = root / f"{name}{ext}"
            if p.is_file():
                return p
    raise ConfigError(f"--quick: benchmarks/{name}.yaml not found next to the package or in the "
                      "current directory; pass a CONFIG file")

"""A benchmark matrix as data: `BenchConfig` and its parts (datasets, crossed axes, profile).

Built and validated from a bench file by `bagpipe_cli.bench.config`; expanded into runs by
`bagpipe_cli.bench.plan`. `BenchConfig.to_json()` is what a bench folder stores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bagpipe_cli.errors import ConfigError

CONFIG_SCHEMA_VERSION = 1


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
    trace: bool = False  # every run traced (--trace), its trace.json in its run folder

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
            "trace": self.trace,
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

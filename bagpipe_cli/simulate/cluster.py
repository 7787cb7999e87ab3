"""Cluster/scenario description files (YAML) for `bagpipe simulate --cluster FILE`.

    name: my-cluster
    description: 8 GPUs over 25 Gbit/s
    data: results/datasets/synth-criteo      # dataset directory (relative to the current dir)
    synth: {preset: criteo-kaggle, rows: 4000000, seed: 0}   # generated if `data` is missing
    trainers: 8
    servers: 4
    net_gbps: 25                     # every embedding server's link
    net_latency_us: 10
    trainer_gbps: 10                 # every trainer's link (collectives) [default: net_gbps]
    runtime: distributed             # a process per trainer (default); or inproc
    collective: allreduce            # dense + row gradients: allreduce (ring, as DDP/NCCL) or
                                     #   allgather (the engine's bitwise sums) [default: the runtime's]
    compute_ms: 5.0                  # per iteration on one trainer; or `calibrate: RESULTS`
    batch_size: 16384                # global batch
    lookahead: 200
    emb_dim: 48
    optimizer: adagrad
    model: dlrm
    bottom_mlp: [512, 256, 64]       # hidden layer sizes [default: the package's small MLPs]
    top_mlp: [1024, 1024, 1024, 256, 128]
    systems: [sync, bagpipe, lru, lfu, fae, het, local]
    sweep: {trainers: [1, 2, 4, 8, 16], net_gbps: [1, 10, 25, 100]}
    reported: {speedup_max: 5.6, source: "BagPipe, SOSP 2023"}   # shown next to the prediction

Every key is optional except the dataset (`data`) and one of `compute_ms` / `calibrate`
(which the command line may give instead); an unknown key is an error that names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.errors import ConfigError

SYNTH_KEYS = ("preset", "rows", "scale", "tables", "max_rows_per_table", "alpha", "dense", "seed",
              "name")
SWEEP_KEYS = ("trainers", "net_gbps")


@dataclass
class ClusterFile:
    """The contents of a cluster file; None = not given (the command line or a default decides)."""

    source: str = ""  # the file it was read from
    name: str = ""
    description: str = ""
    data: str | None = None
    synth: dict[str, Any] | None = None
    trainers: int | None = None
    servers: int | None = None
    net_gbps: float | None = None
    net_latency_us: float | None = None
    trainer_gbps: float | None = None
    runtime: str | None = None
    collective: str | None = None
    bottom_mlp: list[int] | None = None
    top_mlp: list[int] | None = None
    compute_ms: float | None = None
    calibrate: str | None = None
    batch_size: int | None = None
    iterations: int | None = None
    warmup: int | None = None
    lookahead: int | None = None
    round: int | None = None
    cache_rows: int | None = None
    staleness: int | None = None
    emb_dim: int | None = None
    optimizer: str | None = None
    model: str | None = None
    eval_rows: int | None = None
    systems: list[str] | None = None
    sweep: dict[str, list[float]] = field(default_factory=dict)
    reported: dict[str, Any] = field(default_factory=dict)


_TYPES = {"trainers": int, "servers": int, "net_gbps": float, "net_latency_us": float,
          "trainer_gbps": float,
          "compute_ms": float, "batch_size": int, "iterations": int, "warmup": int,
          "lookahead": int, "round": int, "cache_rows": int, "staleness": int, "emb_dim": int,
          "eval_rows": int}


def load_cluster(path: Path) -> ClusterFile:
    """Read and check a cluster file; errors name the file and the key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"--cluster {path}: cannot read: {e.strerror or e}") from None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--cluster {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"--cluster {path}: expected a mapping of settings at the top level")
    known = {f.name for f in fields(ClusterFile)} - {"source"}
    out = ClusterFile(source=str(path))
    for key, value in obj.items():
        if key not in known:
            raise ConfigError(f"--cluster {path}: unknown key {key!r}; known keys: "
                              f"{', '.join(sorted(known))}")
        if value is None:
            continue
        if key in _TYPES:
            try:
                if isinstance(value, bool) or (_TYPES[key] is int and float(value) != int(value)):
                    raise ValueError
                value = _TYPES[key](value)
            except (TypeError, ValueError):
                raise ConfigError(f"--cluster {path}: {key} must be a number (got {value!r})") from None
        elif key == "systems":
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"--cluster {path}: systems must be a list of names")
        elif key == "synth":
            if not isinstance(value, dict) or set(value) - set(SYNTH_KEYS):
                raise ConfigError(f"--cluster {path}: synth must be a mapping with keys from "
                                  f"{', '.join(SYNTH_KEYS)}")
        elif key == "sweep":
            if not isinstance(value, dict) or set(value) - set(SWEEP_KEYS):
                raise ConfigError(f"--cluster {path}: sweep must be a mapping with keys from "
                                  f"{', '.join(SWEEP_KEYS)}")
            try:
                value = {k: [float(x) for x in v] for k, v in value.items()}
            except (TypeError, ValueError):
                raise ConfigError(f"--cluster {path}: sweep values must be lists of numbers") from None
        elif key == "reported":
            if not isinstance(value, dict):
                raise ConfigError(f"--cluster {path}: reported must be a mapping")
        elif key in ("bottom_mlp", "top_mlp"):
            if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                      and v > 0 for v in value):
                raise ConfigError(f"--cluster {path}: {key} must be a list of layer sizes (got {value!r})")
        else:
            value = str(value)
        setattr(out, key, value)
    if out.data is None:
        raise ConfigError(f"--cluster {path}: give `data` (a dataset directory)")
    return out


def ensure_dataset(cf: ClusterFile, progress=None) -> Path:
    """The cluster file's dataset; generated with `bagpipe synth` settings if it is missing."""
    path = Path(cf.data)
    if (path / "meta.json").is_file() or cf.synth is None:
        return path
    try:
        sc = SynthConfig(**cf.synth)
    except TypeError as e:
        raise ConfigError(f"--cluster {cf.source}: synth: {e}") from None
    if progress:
        progress(f"generating {path} ({sc.num_rows:,} rows of {sc.preset})")
    generate(sc, path)
    return path

"""Setting a run up: what every process derives from the config and the dataset, alike.

`prepare(cfg)` opens and checks the dataset and splits off the held-out tail; the builders
make the dense model and its optimizer (from the seed, identically on every trainer), the
planner of the system's cache, and the system itself for the trainers of one process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bagpipe_cli.data.format import Dataset, open_dataset, table_offsets
from bagpipe_cli.engine.cache import RowCache
from bagpipe_cli.engine.checkpoint import (
    Checkpoint,
    check_compatible,
    dataset_identity,
    find_checkpoint,
)
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.feed import key_batches
from bagpipe_cli.engine.network import NetworkModel
from bagpipe_cli.engine.optim import RowOptimizer
from bagpipe_cli.engine.oracle import Oracle, plan_peak
from bagpipe_cli.engine.planner import PolicyPlanner, trace_of
from bagpipe_cli.engine.registry import SystemSpec, spec
from bagpipe_cli.engine.shards import Shard
from bagpipe_cli.engine.systems import (
    CacheSystem,
    EmbeddingSystem,
    HetSystem,
    LocalSystem,
    SyncSystem,
)
from bagpipe_cli.engine.trainer_set import TrainerSet
from bagpipe_cli.engine.transport import Transport
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.models import ModelConfig, build_model, row_dim


def split_rows(ds: Dataset, batch_size: int, eval_rows: int | None) -> tuple[int, int]:
    """(training rows, held-out tail rows): the tail is `eval_rows` (default 10%, <= 50,000)."""
    ev = eval_rows if eval_rows is not None else min(ds.rows // 10, 50_000)
    if ev < 0 or ev >= ds.rows:
        raise ConfigError(f"--eval-rows {ev} must be in [0, {ds.rows})")
    train_rows = ds.rows - ev
    if train_rows < batch_size:
        raise ConfigError(f"--batch-size {batch_size} is larger than the {train_rows} training "
                          f"rows of {ds.path}")
    return train_rows, ev


@dataclass
class RunSetup:
    """A run's config with its dataset, model shape and optimizers' settings."""

    cfg: TrainConfig
    spec: SystemSpec
    ds: Dataset
    train_rows: int
    eval_rows: int
    offsets: np.ndarray
    mcfg: ModelConfig
    row_dim: int
    rowopt: RowOptimizer
    network: NetworkModel

    @property
    def cardinalities(self) -> list[int]:
        return list(self.ds.meta.cardinalities)

    @property
    def total_rows(self) -> int:
        return int(sum(self.ds.meta.cardinalities))


def prepare(cfg: TrainConfig) -> RunSetup:
    ds = open_dataset(cfg.data)
    if ds.labels is None:
        raise ConfigError(f"dataset {cfg.data} has no labels; training needs a labeled dataset")
    train_rows, eval_rows = split_rows(ds, cfg.batch_size, cfg.eval_rows)
    mcfg = ModelConfig(cfg.model, ds.meta.num_dense, ds.meta.num_tables, cfg.emb_dim,
                       bottom_mlp=cfg.bottom_mlp, top_mlp=cfg.top_mlp)
    # With --net-shape the kernel limits the bandwidth; only the latency is slept.
    network = NetworkModel(None if cfg.net_shape else cfg.net_gbps, cfg.net_latency_us)
    return RunSetup(cfg, spec(cfg.system), ds, train_rows, eval_rows,
                    table_offsets(ds.meta.cardinalities), mcfg, row_dim(mcfg),
                    RowOptimizer(cfg.optimizer, cfg.lr), network)


def build_dense(cfg: TrainConfig, mcfg: ModelConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The dense model (initialised from the seed, identically on every trainer) and its optimizer."""
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg)
    opt = torch.optim.SGD if cfg.dense_optimizer == "sgd" else torch.optim.Adam
    return model, opt(model.parameters(), lr=cfg.dense_learning_rate)


def restore_dense(model: torch.nn.Module, dense_opt: torch.optim.Optimizer, dense: dict[str, Any],
                  optimizer: dict[str, Any], rng: torch.Tensor) -> None:
    """A checkpoint's dense model, its optimizer and the RNG state."""
    model.load_state_dict(dense)
    dense_opt.load_state_dict(optimizer)
    torch.set_rng_state(rng)


def open_resume(s: RunSetup) -> Checkpoint | None:
    """The checkpoint --resume names, verified and checked against this run (or None)."""
    if s.cfg.resume is None:
        return None
    ck = find_checkpoint(Path(s.cfg.resume))
    check_compatible(s.cfg, ck, dataset_identity(s.ds))
    return ck


@dataclass
class Planning:
    """The planner of a run's cache, its capacity and bagpipe's peak (None without a cache)."""

    planner: Oracle | PolicyPlanner
    capacity: int | None
    peak: int | None

    @property
    def slots(self) -> int | None:
        """Physical rows of the trainer cache the plan needs (None: the system has no cache)."""
        p = self.planner
        return p.slots if isinstance(p, PolicyPlanner) else p.capacity


def build_planner(s: RunSetup, start: int = 0) -> Planning:
    """The planner of batches start.. (a resumed run plans only what is left)."""
    cfg = s.cfg

    def keys():
        return key_batches(s.ds, cfg, s.train_rows, s.offsets, start)

    if s.spec.planner == "none":
        # Only U_b and its inverse are needed: an oracle with lookahead 1 and no cache plans them.
        return Planning(Oracle(s.total_rows, 1, 1, cfg.trainers, None), None, None)
    # A planning pass (the oracle is deterministic) gives the peak before any training; the
    # baselines' default capacity is the memory Bagpipe needs, as in `bagpipe profile`.
    peak, _ = plan_peak(keys(), s.total_rows, cfg.lookahead, cfg.round)
    capacity = cfg.cache_rows or max(peak, 1)
    if s.spec.planner == "oracle":
        if cfg.cache_rows is not None and cfg.cache_rows < peak:
            raise ConfigError(f"cache capacity {cfg.cache_rows} rows is below the lookahead's peak "
                              f"of {peak} rows; raise --cache-rows or lower --lookahead")
        return Planning(Oracle(s.total_rows, cfg.lookahead, cfg.round, cfg.trainers, capacity),
                        capacity, peak)
    planner = PolicyPlanner(cfg.system, trace_of(keys(), s.total_rows), capacity, s.total_rows,
                            cfg.hot_sample)
    return Planning(planner, capacity, peak)


def build_system(s: RunSetup, slots: int | None, transport: Transport, trainers: TrainerSet,
                 device: str | torch.device = "cpu",
                 servers: list[Shard] | None = None) -> EmbeddingSystem:
    """The embedding system for `trainers`, with a cache of `slots` rows (`Planning.slots`);
    `servers`: the in-process server objects (the local system copies the tables from them)."""
    store = s.spec.store
    if store == "cache":
        cache = RowCache(slots, s.row_dim, s.rowopt.state_dim, device)
        return CacheSystem(transport, trainers, cache, s.spec.prefetch_ahead, s.spec.lrpp, device)
    if store == "tables":
        return LocalSystem(transport, trainers, s.total_rows, servers, device)
    if store == "stale-cache":
        return HetSystem(transport, trainers, s.total_rows, s.cfg.staleness, s.row_dim, device)
    return SyncSystem(transport, trainers, device)


def run_config(s: RunSetup, layout: dict[str, Any], runner: dict[str, Any]) -> dict[str, Any]:
    """config.json of a run: every option, the model, the dataset, how ranks were laid out and
    what ran it (`runner`: its name and the runner's own settings)."""
    ds = s.ds
    return {"train": asdict(s.cfg), "model": asdict(s.mcfg), "row_dim": s.row_dim,
            "dataset": {"path": str(s.cfg.data), "name": ds.meta.name, "rows": ds.rows,
                        "cardinalities": s.cardinalities, "dense_features": ds.meta.num_dense},
            "layout": layout, "runner": runner}

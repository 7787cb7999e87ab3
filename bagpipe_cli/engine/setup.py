"""Setting a run up: what every process derives from the config and the dataset, alike.

`prepare(cfg)` opens and checks the dataset and splits off the held-out tail; the builders
make the dense model and its optimizer (from the seed, identically on every trainer). The
system for the trainers of one process is its registry entry's to build
(`s.spec.build_system(SystemParts(...))`), and to plan (`s.spec.plan(s, start)`); this module
imports no system and no planner, so they can name `RunSetup` without an import cycle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bagpipe_cli.data.format import Dataset, DatasetMeta, open_dataset, read_meta, table_offsets
from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.memory import RunMemory, RunShape, check_run_memory, estimate_run
from bagpipe_cli.engine.records.checkpoint import (
    Checkpoint,
    check_compatible,
    dataset_identity,
    find_checkpoint,
)
from bagpipe_cli.engine.registry import SystemSpec, spec
from bagpipe_cli.engine.trainer.device import cuda_count
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.atomic import path_record
from bagpipe_cli.models import ModelConfig, build_model, footprint, row_dim


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
    memory: RunMemory  # the estimate the run was admitted on
    feed_cores: int | None = None  # the cores the planner may use (its runtime's placement)

    @property
    def cardinalities(self) -> list[int]:
        return list(self.ds.meta.cardinalities)

    @property
    def total_rows(self) -> int:
        return int(sum(self.ds.meta.cardinalities))


def prepare(cfg: TrainConfig) -> RunSetup:
    memory = admit(cfg)  # from meta.json alone, before the arrays are read or anything allocated
    ds = open_dataset(cfg.data)
    if ds.labels is None:
        raise ConfigError(f"dataset {cfg.data} has no labels; training needs a labeled dataset")
    train_rows, eval_rows = split_rows(ds, cfg.batch_size, cfg.eval_rows)
    mcfg = model_config(cfg, ds.meta)
    # With --net-shape the kernel limits the bandwidth; only the latency is slept.
    network = NetworkModel(None if cfg.net_shape else cfg.net_gbps, cfg.net_latency_us)
    return RunSetup(cfg, spec(cfg.system), ds, train_rows, eval_rows,
                    table_offsets(ds.meta.cardinalities), mcfg, row_dim(mcfg),
                    RowOptimizer(cfg.optimizer, cfg.lr), network, memory)


def model_config(cfg: TrainConfig, meta: DatasetMeta) -> ModelConfig:
    return ModelConfig(cfg.model, meta.num_dense, meta.num_tables, cfg.emb_dim,
                       bottom_mlp=cfg.bottom_mlp, top_mlp=cfg.top_mlp)


def admit(cfg: TrainConfig) -> RunMemory:
    """The run's memory estimate (`engine/memory.py`) from the dataset's meta.json; a run
    whose processes on this machine need more than it has is refused (a torchrun job's
    machines: `check_hosts`, from every rank's facts)."""
    shape, memory = estimate(cfg)
    check_run_memory(cfg, shape, memory)
    return memory


def estimate(cfg: TrainConfig) -> tuple[RunShape, RunMemory]:
    """The run's shape and memory estimate, from the dataset's meta.json."""
    meta = read_meta(Path(cfg.data))
    mcfg = model_config(cfg, meta)
    params, kept = footprint(mcfg)
    ev = cfg.eval_rows if cfg.eval_rows is not None else min(meta.rows // 10, 50_000)
    gpu = cfg.device != "cpu" and cuda_count() > 0  # trainers will be on GPUs
    shape = RunShape(tuple(meta.cardinalities), meta.num_dense, row_dim(mcfg),
                     RowOptimizer(cfg.optimizer, cfg.lr).state_dim, max(0, min(ev, meta.rows)),
                     params, kept, gpu)
    return shape, estimate_run(cfg, spec(cfg.system), shape)


def build_dense(cfg: TrainConfig, mcfg: ModelConfig, device: str | torch.device = "cpu"
                ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The dense model on `device` (initialised from the seed on the CPU, identically on every
    trainer) and its optimizer."""
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg).to(device)
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


def run_config(s: RunSetup, layout: dict[str, Any], runner: dict[str, Any]) -> dict[str, Any]:
    """config.json of a run: every option, the model, the dataset, how ranks were laid out and
    what ran it (`runner`: its name and the runner's own settings)."""
    ds = s.ds
    return {"train": asdict(s.cfg), "model": asdict(s.mcfg), "row_dim": s.row_dim,
            "dataset": {**path_record(s.cfg.data), "name": ds.meta.name, "rows": ds.rows,
                        "cardinalities": s.cardinalities, "dense_features": ds.meta.num_dense},
            "layout": layout, "runner": runner}

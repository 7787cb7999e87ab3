"""TorchRec's side of the TorchRec baseline: its sharded EmbeddingBagCollection under one of
our dense models, the sharding plan, tables in and out of the shards, and timed pipeline
parts. Everything here imports torchrec lazily (it is an optional install: `make torchrec`).

`TorchRecModel` puts *our* dense model on top of the EBC's pooled output (KeyedTensor ->
[B, T, E] in table order), so the dense configuration and its initialisation are the
engine's by construction; the tables start from the engine's initial values (`init_shards`).
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bagpipe_cli.engine.comm.shards import assemble_tables, init_shards
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.errors import ConfigError

SHARDINGS = ("table_wise", "column_wise", "data_parallel")
FEATURE = "f{}"  # KeyedJaggedTensor key of table t
TABLE = "t{}"  # EmbeddingBagConfig name of table t


def torchrec_available() -> bool:
    """True when torchrec and the CPU fbgemm it needs import (`make torchrec` installs them)."""
    try:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    except Exception:  # an ImportError, or a broken fbgemm build failing to load its ops
        return False
    return True


def require_torchrec() -> None:
    if not torchrec_available():
        raise ConfigError("--system torchrec needs TorchRec: run `make torchrec` (installs "
                          "torchrec==1.8.0 and fbgemm-gpu-cpu==1.8.0, matched to torch 2.13)")


class TorchRecModel(nn.Module):
    """A TorchRec EmbeddingBagCollection feeding one of our dense models.

    forward(batch) -> (loss, (loss, logits)) as TorchRec's train pipelines expect, where
    `batch` has dense_features [b, D], sparse_features (a KeyedJaggedTensor, one id per table
    and sample) and labels [b]; loss = sum(BCE) * loss_scale (1/b: the slice's mean).
    """

    def __init__(self, ebc: nn.Module, dense: nn.Module, num_tables: int, dim: int,
                 loss_scale: float):
        super().__init__()
        self.ebc = ebc
        self.dense = dense
        self.num_tables = num_tables
        self.dim = dim
        self.loss_scale = loss_scale
        # Sharding reorders the pooled output's keys (table-wise: by shard); `order` puts
        # them back into table order (None: already in order). See `set_key_order`.
        self.order: torch.Tensor | None = None

    def set_key_order(self, keys: list[str]) -> None:
        """Record the order of the EBC output's keys (one of each table's feature)."""
        want = [FEATURE.format(t) for t in range(self.num_tables)]
        if sorted(keys) != sorted(want):
            raise RuntimeError(f"EmbeddingBagCollection output keys {keys}, expected {want}")
        self.order = None if keys == want else torch.tensor([keys.index(k) for k in want])

    def forward(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        pooled = self.ebc(batch.sparse_features)  # KeyedTensor, one E-wide block per table
        emb = pooled.values().view(-1, self.num_tables, self.dim)
        if self.order is not None:
            emb = emb.index_select(1, self.order)
        logits = self.dense(batch.dense_features, emb)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels, reduction="sum") * self.loss_scale
        return loss, (loss.detach(), logits.detach())


def initial_tables(cardinalities: list[int], dim: int, seed: int) -> list[torch.Tensor]:
    """The engine's initial tables for `seed` (what every engine run starts from)."""
    servers = init_shards(cardinalities, dim, 1, seed, lambda n: torch.zeros(n, 0))
    return assemble_tables(servers, cardinalities)


def build_ebc(cardinalities: list[int], dim: int, tables: list[torch.Tensor] | None = None):
    """An unsharded EmbeddingBagCollection, one table per feature (sum pooling of one id)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

    configs = [EmbeddingBagConfig(name=TABLE.format(t), embedding_dim=dim, num_embeddings=n,
                                  feature_names=[FEATURE.format(t)], pooling=PoolingType.SUM)
               for t, n in enumerate(cardinalities)]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    if tables is not None:
        with torch.no_grad():
            for t, w in enumerate(tables):
                ebc.embedding_bags[TABLE.format(t)].weight.copy_(w)
    return ebc


def make_batch(dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray):
    """A torchrec Batch from our arrays: sparse int64 [b, T] -> KJT with one id per table."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    b, n_tables = sparse.shape
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[FEATURE.format(t) for t in range(n_tables)],
        # KJT values are key-major: every sample's id of table 0, then of table 1, ...
        values=torch.from_numpy(np.ascontiguousarray(sparse.T).reshape(-1)),
        lengths=torch.ones(b * n_tables, dtype=torch.int32))
    return Batch(dense_features=torch.from_numpy(np.ascontiguousarray(dense)), sparse_features=kjt,
                 labels=torch.from_numpy(np.ascontiguousarray(labels)))


def quiet() -> None:
    """Silence TorchRec's advice (planner, deprecations, fx tracing) on every trainer's stderr."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torchrec")
    for name in ("torchrec", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)


def output_keys(dmp: nn.Module, ds: Any, n_tables: int) -> list[str]:
    """The key order of the sharded EBC's output, from one lookup (a collective)."""
    bt = ds.slice(0, 1)
    with torch.no_grad():
        pooled = dmp.module.ebc(make_batch(bt.dense, bt.sparse, bt.labels).sparse_features)
        if hasattr(pooled, "wait"):
            pooled = pooled.wait()
    dims = pooled.length_per_key()
    if len(set(dims)) != 1:
        raise RuntimeError(f"EmbeddingBagCollection output widths {dims}: expected one width")
    return list(pooled.keys())


def emb_optimizer_name(cfg: TrainConfig) -> str:
    return "EXACT_SGD" if cfg.optimizer == "sgd" else "EXACT_ROWWISE_ADAGRAD"


def fuse_embedding_optimizer(ebc: nn.Module, cfg: TrainConfig) -> None:
    """Fuse the tables' optimizer into the backward, as TorchRec trains embeddings."""
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    if cfg.optimizer == "sgd":
        apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": cfg.lr})
    elif cfg.optimizer == "adagrad":
        from torchrec.optim import RowWiseAdagrad

        # Our row-wise Adagrad: accumulator += mean(g^2) over the row, eps 1e-8, starts at 0.
        apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": cfg.lr, "eps": 1e-8})
    else:
        raise ConfigError(f"--optimizer {cfg.optimizer!r}: torchrec supports sgd and adagrad")


def sharding_env(pg):
    from torchrec.distributed.types import ShardingEnv

    return ShardingEnv.from_process_group(pg)


def sharding_plan(model: nn.Module, cards: list[int], sharding: str, world: int, pg):
    """A sharding plan with every table of the chosen type (all ranks agree on it)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType

    kind = {"table_wise": ShardingType.TABLE_WISE, "column_wise": ShardingType.COLUMN_WISE,
            "data_parallel": ShardingType.DATA_PARALLEL}[sharding]
    constraints = {TABLE.format(t): ParameterConstraints(sharding_types=[kind.value])
                   for t in range(len(cards))}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"),
                                       constraints=constraints)
    return planner.collective_plan(model, [EmbeddingBagCollectionSharder()], pg)


def table_entries(dmp: nn.Module, n_tables: int) -> list[Any]:
    """The state-dict entry (tensor or ShardedTensor) of every table, in table order."""
    sd = dmp.state_dict()
    out = []
    for t in range(n_tables):
        suffix = f"ebc.embedding_bags.{TABLE.format(t)}.weight"
        keys = [k for k in sd if k.endswith(suffix)]
        if len(keys) != 1:
            raise RuntimeError(f"table {t}: expected one state-dict entry *{suffix}, found {keys}")
        out.append(sd[keys[0]])
    return out


def load_tables(dmp: nn.Module, tables: list[torch.Tensor]) -> None:
    """Copy the full initial tables into this rank's shards (in place: the state dict's
    tensors are views of the fused kernel's weights)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        for entry, full in zip(table_entries(dmp, len(tables)), tables, strict=True):
            if isinstance(entry, ShardedTensor):
                for shard in entry.local_shards():
                    (r0, c0), (n, m) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(full[r0:r0 + n, c0:c0 + m])
            else:
                entry.copy_(full)


def gather_tables(dmp: nn.Module, n_tables: int, cards: list[int], dim: int) -> list[torch.Tensor]:
    """Every full table on rank 0 (other ranks get an empty list); all ranks must call it."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    rank = dist.get_rank()
    out = []
    for entry, n in zip(table_entries(dmp, n_tables), cards, strict=True):
        if isinstance(entry, ShardedTensor):
            full = torch.empty(n, dim) if rank == 0 else None
            entry.gather(dst=0, out=full)
        else:
            full = entry.detach().clone()
        if rank == 0:
            out.append(full)
    return out


class TimedOptimizer:
    """The dense optimizer, timing its steps into times["optimizer"]."""

    def __init__(self, opt: torch.optim.Optimizer, times: dict[str, float]):
        self.opt = opt
        self.times = times
        self.param_groups = opt.param_groups

    def step(self, closure=None):
        t = time.perf_counter()
        out = self.opt.step(closure)
        self.times["optimizer"] += time.perf_counter() - t
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.opt.state_dict()


def timed_pipeline_class():
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    class TimedPipeline(TrainPipelineSparseDist):
        """TorchRec's sparse-dist pipeline, timing its backward into times["backward"]."""

        times: dict[str, float]

        def _backward(self, losses: torch.Tensor) -> None:
            t = time.perf_counter()
            super()._backward(losses)
            self.times["backward"] += time.perf_counter() - t

    return TimedPipeline


def TimedPipeline(*args, **kwargs):  # noqa: N802 - a class built lazily (torchrec is optional)
    return timed_pipeline_class()(*args, **kwargs)

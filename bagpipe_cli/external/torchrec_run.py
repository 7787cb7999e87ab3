"""TorchRec as an external baseline: same data, batches, dense model and initial weights.

    parent:         spawns P trainer processes, relays rank 0's per-iteration progress,
                    kills every child if one fails or the run times out
    trainer r:      gloo process group; TorchRec's EmbeddingBagCollection sharded by
                    DistributedModelParallel (table-wise, column-wise or data-parallel), our
                    dense model (`build_model`) DDP-wrapped by it; TorchRec's
                    TrainPipelineSparseDist overlaps batch b+1's id distribution with batch b
    rank 0 at end:  gathers per-iteration records and the full tables, evaluates the held-out
                    tail with the engine's `evaluate`, writes the result for the parent

Like for like with the engine (`bagpipe_cli.engine.trainer`):
- data: global batch b = training rows [bB, (b+1)B) (wrapping), trainer r reads rows
  [r B/P, (r+1) B/P) of it, one id per table and sample (a KeyedJaggedTensor, lengths 1);
- model: *our* dense model on top of the EBC's pooled output (KeyedTensor -> [B, T, E] in
  table order), so the dense configuration and its initialisation are the same by
  construction; the tables start from the engine's initial values (`init_servers`);
- loss and gradients: TorchRec's convention, which gives the engine's gradient: each
  trainer's loss is the mean BCE of its slice of B/P samples; DDP averages the dense (and
  data-parallel table) gradients over the P trainers, and TorchRec's backward all-to-all
  divides the sharded tables' gradients by P too (`comm_ops` gradient division, on by
  default). (1/P) * sum over slices of sum(BCE)/(B/P) = sum(BCE)/B: the gradient of the
  global batch's mean, as the engine computes it. The recorded loss is the mean of the slices';
- optimizer: the tables' optimizer is fused into the backward (`apply_optimizer_in_backward`:
  SGD -> FBGEMM EXACT_SGD, adagrad -> EXACT_ROWWISE_ADAGRAD, eps 1e-8 as ours), the dense
  optimizer is torch's SGD or Adam with the dense learning rate.
With SGD, one process and the same seed its losses equal `--system sync`'s within float
rounding (tests/test_torchrec.py checks one batch exactly and a short 2-process run).

Timing columns (seconds, the slowest trainer of each iteration): `time` (the whole
`pipeline.progress` call), `data` (reading and building the batch the pipeline loads during
this iteration, b+1), `forward` (model forward: embedding lookup, output all-to-all, dense),
`backward` (backward with the fused embedding update and DDP's all-reduce), `optimizer`
(dense step), `sync` (the rest: the pipeline's input distribution and bookkeeping).
Cache columns are 0: TorchRec keeps every table resident on its shard.
"""

from __future__ import annotations

import math
import os
import queue
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, is_dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from bagpipe_cli.errors import ConfigError

SHARDINGS = ("table_wise", "column_wise", "data_parallel")
DEFAULT_TIMEOUT_S = 120.0  # process-group timeout: a lost peer fails the run instead of hanging
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


def _require_torchrec() -> None:
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
    from bagpipe_cli.engine.server import assemble_tables, init_servers

    servers = init_servers(cardinalities, dim, 1, seed, lambda n: torch.zeros(n, 0))
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


def _config_dict(cfg: Any) -> dict[str, Any]:
    d = asdict(cfg) if is_dataclass(cfg) else dict(vars(cfg))
    d["system"] = "torchrec"
    return d


def train_torchrec(cfg: Any, procs: int | None = None, sharding: str | None = None,
                   timeout_s: float = DEFAULT_TIMEOUT_S, progress=None, run_timeout_s: float | None = None):
    """Train `cfg` (a TrainConfig or an object with its fields) with TorchRec; a TrainResult.

    procs: trainer processes (default cfg.trainers); sharding: table_wise (default),
    column_wise or data_parallel (with one process every table is local whatever the choice).
    progress(b, record) is called with rank 0's record of each iteration. timeout_s bounds
    every collective; run_timeout_s (default: none) the whole run.
    """
    from bagpipe_cli.engine.trainer import TrainResult

    _require_torchrec()
    d = _config_dict(cfg)
    procs = int(procs if procs is not None else d.get("trainers", 1))
    sharding = sharding or "table_wise"
    if sharding not in SHARDINGS:
        raise ConfigError(f"--sharding {sharding!r}: choose one of {', '.join(SHARDINGS)}")
    if procs < 1:
        raise ConfigError(f"--trainers must be >= 1 (got {procs})")
    if d["batch_size"] % procs:
        raise ConfigError(f"--batch-size {d['batch_size']} is not divisible by {procs} trainer processes")
    if d.get("net_gbps") is not None:
        raise ConfigError("--system torchrec does not emulate a network (--net-gbps); its "
                          "processes talk over gloo on this machine")
    d["trainers"] = procs

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="bagpipe-torchrec-") as tmp:
        port = _free_port()
        children = [ctx.Process(target=_worker, name=f"torchrec-trainer-{r}", daemon=True,
                                args=(r, procs, port, d, sharding, tmp, timeout_s, events))
                    for r in range(procs)]
        t0 = time.perf_counter()
        try:
            for c in children:
                c.start()
            _wait(children, events, progress, tmp, t0, run_timeout_s)
        finally:
            for c in children:
                if c.pid is None:  # never started
                    continue
                if c.is_alive():
                    c.kill()
                c.join(timeout=10)
            events.close()
            events.join_thread()
        out = torch.load(Path(tmp) / "result.pt", weights_only=False)
    return TrainResult(out["config"], pd.DataFrame(out["rows"]), out["summary"], out["model"],
                       out["tables"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(children, events, progress, tmp: str, t0: float, run_timeout_s: float | None) -> None:
    """Relay progress until every child exits; raise (children are then killed) on any failure."""
    while True:
        try:
            b, rec = events.get(timeout=0.2)
            if progress:
                progress(b, rec)
            continue
        except queue.Empty:
            pass
        failed = [c for c in children if c.exitcode not in (None, 0)]
        if failed:
            r = children.index(failed[0])
            err = Path(tmp) / f"error-{r}.txt"
            why = err.read_text().strip() if err.exists() else f"exit code {failed[0].exitcode}"
            raise RuntimeError(f"torchrec trainer {r} failed: {why}")
        if all(c.exitcode == 0 for c in children):
            while True:  # progress left in the queue
                try:
                    b, rec = events.get_nowait()
                except queue.Empty:
                    break
                if progress:
                    progress(b, rec)
            return
        if run_timeout_s is not None and time.perf_counter() - t0 > run_timeout_s:
            raise RuntimeError(f"torchrec run exceeded {run_timeout_s:.0f} s; trainers killed")


def _worker(rank: int, world: int, port: int, d: dict[str, Any], sharding: str, tmp: str,
            timeout_s: float, events) -> None:
    """One trainer process; rank 0 writes tmp/result.pt. Errors go to tmp/error-<rank>.txt."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    # The trainers share the machine's cores, as the engine's one process uses them all.
    torch.set_num_threads(d.get("threads") or max(1, (os.cpu_count() or 1) // world))
    _quiet()
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        try:
            _train_rank(rank, world, d, sharding, Path(tmp), events)
        finally:
            dist.destroy_process_group()
    except BaseException:
        (Path(tmp) / f"error-{rank}.txt").write_text(traceback.format_exc())
        raise SystemExit(1) from None
    # Leave without interpreter teardown: TorchRec/fbgemm keep native threads that now and
    # then abort a finished process at exit ("terminate called without an active exception").
    events.close()
    events.join_thread()  # progress events still in the queue's feeder thread get out first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _quiet() -> None:
    """Silence TorchRec's advice (planner, deprecations, fx tracing) on every trainer's stderr."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torchrec")
    for name in ("torchrec", "torch.fx._symbolic_trace"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _train_rank(rank: int, world: int, d: dict[str, Any], sharding: str, tmp: Path, events) -> None:
    import torch.distributed as dist
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from bagpipe_cli.data.format import open_dataset, table_offsets
    from bagpipe_cli.engine.oracle import batch_keys
    from bagpipe_cli.engine.trainer import TIME_KEYS, evaluate, split_rows, summarize
    from bagpipe_cli.models import ModelConfig, build_model, row_dim

    cfg = SimpleNamespace(**d)
    ds = open_dataset(cfg.data)
    if ds.labels is None:
        raise ConfigError(f"dataset {cfg.data} has no labels; training needs a labeled dataset")
    train_rows, eval_rows = split_rows(ds, cfg)
    cards = ds.meta.cardinalities
    n_tables = len(cards)
    mcfg = ModelConfig(cfg.model, ds.meta.num_dense, n_tables, cfg.emb_dim)
    dim = row_dim(mcfg)
    B, per = cfg.batch_size, cfg.batch_size // world

    # Same initial weights as the engine: the dense model from torch's RNG seeded with the
    # run's seed (identical on every rank), the tables from the engine's initialisation.
    torch.manual_seed(cfg.seed)
    dense = build_model(mcfg)
    tables = initial_tables(cards, dim, cfg.seed)
    ebc = build_ebc(cards, dim, tables)
    _fuse_embedding_optimizer(ebc, cfg)
    model = TorchRecModel(ebc, dense, n_tables, dim, 1.0 / per)
    pg = dist.group.WORLD
    dmp = DistributedModelParallel(model, env=_sharding_env(pg), device=torch.device("cpu"),
                                   plan=_plan(model, cards, sharding, world, pg))
    _load_tables(dmp, tables)
    del tables
    model.set_key_order(_output_keys(dmp, ds, n_tables))
    dense_params = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    dlr = cfg.dense_lr if cfg.dense_lr is not None else cfg.lr
    dense_opt = (torch.optim.SGD(dense_params, lr=dlr) if cfg.dense_optimizer == "sgd"
                 else torch.optim.Adam(dense_params, lr=dlr))

    times = dict.fromkeys(TIME_KEYS, 0.0)
    per_epoch = train_rows // B

    def batches():
        for b in range(cfg.iterations):
            t = time.perf_counter()
            lo = (b % per_epoch) * B + rank * per
            bt = ds.slice(lo, lo + per, b)
            batch = make_batch(bt.dense, bt.sparse, bt.labels)
            times["data"] += time.perf_counter() - t
            yield batch

    def forward(batch):
        t = time.perf_counter()
        out = dmp(batch)
        times["forward"] += time.perf_counter() - t
        return out

    pipe = _TimedPipeline(dmp, _TimedOptimizer(dense_opt, times), torch.device("cpu"),
                          custom_model_fwd=forward)
    pipe.times = times
    it = batches()
    rows: list[dict[str, Any]] = []
    dist.barrier()
    t_start = time.perf_counter()
    for b in range(cfg.iterations):
        for k in times:
            times[k] = 0.0
        t = time.perf_counter()
        loss, _ = pipe.progress(it)
        elapsed = time.perf_counter() - t
        times["sync"] = max(0.0, elapsed - times["data"] - times["forward"] - times["backward"]
                            - times["optimizer"])
        rec = {"iteration": b, "loss": float(loss), "time": elapsed, **times}
        rows.append(rec)
        if rank == 0:
            events.put((b, rec))
    wall = time.perf_counter() - t_start
    pipe.detach()

    everyone = [None] * world
    dist.all_gather_object(everyone, rows)
    full = _gather_tables(dmp, n_tables, cards, dim)
    if rank != 0:
        return
    offsets = table_offsets(cards)
    merged = []
    for b in range(cfg.iterations):
        recs = [r[b] for r in everyone]
        slowest = max(recs, key=lambda r: r["time"])
        # The global batch's mean loss is the mean of the (equal-sized) slices' means.
        merged.append({**slowest, "loss": float(sum(r["loss"] for r in recs)) / world})
    for b, rec in enumerate(merged):  # after training: these counts cost nothing in the timing
        lo = (b % per_epoch) * B
        rec.update(unique_rows=len(np.unique(batch_keys(ds.sparse_block(lo, lo + B), offsets))),
                   rows_fetched=0, rows_written_back=0, cache_hits=0)
    metrics = pd.DataFrame(merged)
    dense_model = dmp.module.dense
    ev = evaluate(dense_model, [SimpleNamespace(weight=torch.cat(full))], ds, offsets, train_rows,
                  eval_rows)
    summary = summarize(metrics, SimpleNamespace(**{**d, "system": "torchrec"}), wall)
    summary.update(ev)
    summary.update({
        "oracle_ms_per_batch": math.nan, "peak_resident_rows": None, "cache_rows": None,
        "network_emulated": False, "train_rows": train_rows, "eval_rows": eval_rows,
        "transport_busy_s": math.nan, "rows_written_back_at_end": 0,
        "sharding": sharding if world > 1 else "local", "procs": world,
        "torch_threads_per_proc": torch.get_num_threads(), "pipeline": type(pipe).__mro__[1].__name__,
        "torchrec_version": torchrec.__version__,
    })
    config = {"train": d, "model": asdict(mcfg), "row_dim": dim,
              "torchrec": {"sharding": sharding, "procs": world, "version": torchrec.__version__,
                           "embedding_optimizer": _emb_optimizer_name(cfg)},
              "dataset": {"path": str(cfg.data), "name": ds.meta.name, "rows": ds.rows,
                          "cardinalities": cards, "dense_features": ds.meta.num_dense}}
    out = {"config": config, "rows": merged, "summary": summary, "model": dense_model,
           "tables": full}
    tmp_file = tmp / "result.pt.part"
    torch.save(out, tmp_file)
    tmp_file.rename(tmp / "result.pt")


def _output_keys(dmp: nn.Module, ds: Any, n_tables: int) -> list[str]:
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


def _emb_optimizer_name(cfg: Any) -> str:
    return "EXACT_SGD" if cfg.optimizer == "sgd" else "EXACT_ROWWISE_ADAGRAD"


def _fuse_embedding_optimizer(ebc: nn.Module, cfg: Any) -> None:
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


def _sharding_env(pg):
    from torchrec.distributed.types import ShardingEnv

    return ShardingEnv.from_process_group(pg)


def _plan(model: nn.Module, cards: list[int], sharding: str, world: int, pg):
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


def _table_entries(dmp: nn.Module, n_tables: int) -> list[Any]:
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


def _load_tables(dmp: nn.Module, tables: list[torch.Tensor]) -> None:
    """Copy the full initial tables into this rank's shards (in place: the state dict's
    tensors are views of the fused kernel's weights)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        for entry, full in zip(_table_entries(dmp, len(tables)), tables, strict=True):
            if isinstance(entry, ShardedTensor):
                for shard in entry.local_shards():
                    (r0, c0), (n, m) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(full[r0:r0 + n, c0:c0 + m])
            else:
                entry.copy_(full)


def _gather_tables(dmp: nn.Module, n_tables: int, cards: list[int], dim: int) -> list[torch.Tensor]:
    """Every full table on rank 0 (other ranks get an empty list); all ranks must call it."""
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    rank = dist.get_rank()
    out = []
    for entry, n in zip(_table_entries(dmp, n_tables), cards, strict=True):
        if isinstance(entry, ShardedTensor):
            full = torch.empty(n, dim) if rank == 0 else None
            entry.gather(dst=0, out=full)
        else:
            full = entry.detach().clone()
        if rank == 0:
            out.append(full)
    return out


class _TimedOptimizer:
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


def _timed_pipeline_class():
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    class TimedPipeline(TrainPipelineSparseDist):
        """TorchRec's sparse-dist pipeline, timing its backward into times["backward"]."""

        times: dict[str, float]

        def _backward(self, losses: torch.Tensor) -> None:
            t = time.perf_counter()
            super()._backward(losses)
            self.times["backward"] += time.perf_counter() - t

    return TimedPipeline


def _TimedPipeline(*args, **kwargs):  # noqa: N802 - a class built lazily (torchrec is optional)
    return _timed_pipeline_class()(*args, **kwargs)

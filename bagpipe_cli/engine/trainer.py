"""The training loop shared by every system.

    loader thread:  read batch b+L, oracle plan  ->  queue of (RoundPlan, batches)
    main thread:    per round: system.begin_round (insert prefetched rows, start the next
                    round's fetch on the transport's server workers); per iteration: read rows,
                    forward/backward per trainer slice, sum gradients, sync, optimizers, write
    server workers: serve fetches and write-backs in FIFO order (network emulated there)
    checkpoints:    at the boundary before iteration b (main thread, b % checkpoint_every == 0):
                    pending work lands, the servers' tables with the cache's resident rows over
                    them are written with the dense state (engine/checkpoint.py); training then
                    goes on with the same cache. `resume` starts at b with an empty cache.

Gradient convention: the loss is the mean over the *global* batch; each trainer's slice
contributes sum(BCE)/B, and partial gradients (dense and embedding) are *summed* across
trainers, which equals the gradient of the global mean. With N simulated trainers in one
process the sum is taken in trainer order, identically for every system.
"""

from __future__ import annotations

import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from bagpipe_cli.data.format import Dataset, open_dataset, table_offsets
from bagpipe_cli.engine.cache import RowCache
from bagpipe_cli.engine.checkpoint import (
    Checkpoint,
    Checkpointer,
    check_compatible,
    dataset_identity,
    find_checkpoint,
    full_tables,
)
from bagpipe_cli.engine.network import NetworkModel
from bagpipe_cli.engine.optim import RowOptimizer
from bagpipe_cli.engine.oracle import Oracle, batch_keys, plan_peak
from bagpipe_cli.engine.planner import PLANNED_POLICIES, PolicyPlanner, trace_of
from bagpipe_cli.engine.server import (
    assemble_tables,
    init_servers,
    servers_from_tables,
    split_by_shard,
)
from bagpipe_cli.engine.systems import (
    SYSTEMS,
    CacheSystem,
    EmbeddingSystem,
    HetSystem,
    LocalSystem,
    Step,
    SyncSystem,
)
from bagpipe_cli.engine.transport import InProcessTransport
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.metrics import auc
from bagpipe_cli.models import MODELS, ModelConfig, build_model, row_dim

# Systems run by another library, same data, models and metrics (optional installs).
EXTERNAL_SYSTEMS = ("torchrec",)
TIME_KEYS = ("data", "prefetch_wait", "forward", "backward", "sync", "optimizer")


@dataclass(frozen=True)
class TrainConfig:
    """One training run (`bagpipe train`)."""

    data: str  # dataset directory
    system: str = "bagpipe"  # sync | bagpipe | lru | lfu | fae | het | local
    model: str = "dlrm"  # dlrm | wdl | deepfm | dcn
    batch_size: int = 1024  # global batch size (split evenly over trainers)
    iterations: int = 100  # training iterations (the data wraps around if needed)
    lookahead: int = 16  # L: batches the oracle looks ahead
    round: int | None = None  # C: iterations per prefetch/evict round (default L/4)
    cache_rows: int | None = None  # cache rows of bagpipe/lru/lfu/fae (default: bagpipe's peak)
    staleness: int = 0  # het: versions a cached row may lag behind the servers
    hot_sample: float = 1.0  # fae: fraction of the run's batches profiled to pick the hot rows
    emb_dim: int = 16  # E: embedding dimension
    optimizer: str = "sgd"  # embedding optimizer: sgd | adagrad
    lr: float = 0.1  # embedding learning rate
    dense_optimizer: str = "sgd"  # sgd | adam
    dense_lr: float | None = None  # dense learning rate (default: --lr)
    seed: int = 0  # seed of weights and initial tables
    trainers: int = 1  # N simulated data-parallel trainers
    servers: int = 1  # K embedding server shards
    net_gbps: float | None = None  # emulated network bandwidth (None: no emulation)
    net_latency_us: float = 0.0  # emulated per-message latency
    eval_rows: int | None = None  # held-out tail for AUC (default: 10% of rows, at most 50,000)
    warmup: int = 5  # iterations excluded from the speed figures
    transport: str = "inproc"  # inproc (threads in this process) | torch (torch.distributed ranks)
    timeout_s: float = 120.0  # torch transport: how long a rank waits for a peer
    device: str = "cpu"  # torch transport: where trainers compute: cpu | cuda (a GPU each) | cuda:K
    backend: str = "gloo"  # torch transport: the trainers' collectives: gloo | nccl (GPUs)
    threads: int | None = None  # torch intra-op threads (None: torch's default; torch ranks: 1)
    checkpoint_every: int = 0  # checkpoint every N iterations (0: never)
    checkpoint_dir: str | None = None  # where checkpoints go (None: a temporary dir, removed)
    checkpoint_keep: int = 2  # newest good checkpoints kept
    resume: str | None = None  # a checkpoint (or a directory of them) to resume from

    def __post_init__(self) -> None:
        if self.system not in (*SYSTEMS, *EXTERNAL_SYSTEMS):
            raise ConfigError(f"--system {self.system!r}: choose one of "
                              f"{', '.join((*SYSTEMS, *EXTERNAL_SYSTEMS))}")
        if self.model not in MODELS:
            raise ConfigError(f"--model {self.model!r}: choose one of {', '.join(sorted(MODELS))}")
        for opt, v in [("--batch-size", self.batch_size), ("--iterations", self.iterations),
                       ("--emb-dim", self.emb_dim), ("--trainers", self.trainers),
                       ("--servers", self.servers)]:
            if v < 1:
                raise ConfigError(f"{opt} must be >= 1 (got {v})")
        if self.lookahead < 1:
            raise ConfigError(f"--lookahead must be >= 1 (got {self.lookahead})")
        if self.batch_size % self.trainers:
            raise ConfigError(f"--batch-size {self.batch_size} is not divisible by --trainers "
                              f"{self.trainers}")
        if self.cache_rows is not None and self.cache_rows < 1:
            raise ConfigError(f"--cache-rows must be >= 1 (got {self.cache_rows})")
        if self.dense_optimizer not in ("sgd", "adam"):
            raise ConfigError(f"--dense-optimizer {self.dense_optimizer!r}: choose sgd or adam")
        if not 0 < self.hot_sample <= 1:
            raise ConfigError(f"--hot-sample must be in (0, 1] (got {self.hot_sample})")
        if self.staleness < 0:
            raise ConfigError(f"--staleness must be >= 0 (got {self.staleness})")
        if self.transport not in ("inproc", "torch"):
            raise ConfigError(f"--transport {self.transport!r}: choose inproc or torch")
        if not self.timeout_s > 0:
            raise ConfigError(f"--timeout must be > 0 (got {self.timeout_s})")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"--device {self.device!r}: choose cpu, cuda or cuda:K")
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError(f"--backend {self.backend!r}: choose gloo or nccl")
        if self.device != "cpu" and (self.transport != "torch" or self.system in EXTERNAL_SYSTEMS):
            raise ConfigError(f"--device {self.device}: trainers run on a GPU in torch.distributed "
                              "runs of the engine's systems; use --procs or --transport torch")
        if self.backend == "nccl" and self.device == "cpu":
            raise ConfigError("--backend nccl: NCCL connects GPUs; add --device cuda, or use "
                              "--backend gloo")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be >= 1 (got {self.threads})")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be >= 0 (got {self.warmup})")
        if self.checkpoint_every < 0:
            raise ConfigError(f"--checkpoint-every must be >= 0 (got {self.checkpoint_every})")
        if self.checkpoint_keep < 1:
            raise ConfigError(f"--checkpoint-keep must be >= 1 (got {self.checkpoint_keep})")
        if self.system == "het" and self.staleness > 0 and (self.checkpoint_every or self.resume):
            # Its trainers read stale cached copies that a checkpoint of the true parameters
            # does not hold, so a resumed run would not be the run that was stopped.
            raise ConfigError("--checkpoint-every/--resume: het with --staleness > 0 cannot be "
                              "resumed exactly; use --staleness 0 or another system")
        RowOptimizer(self.optimizer, self.lr)  # validates --optimizer and --lr
        NetworkModel(self.net_gbps, self.net_latency_us)  # validates the network options


@dataclass
class TrainResult:
    """What a run produced: per-iteration metrics, a summary, and the final parameters."""

    config: dict[str, Any]
    metrics: pd.DataFrame
    summary: dict[str, Any]
    model: torch.nn.Module
    tables: list[torch.Tensor]


def split_rows(ds: Dataset, cfg: TrainConfig) -> tuple[int, int]:
    """(training rows, held-out tail rows)."""
    ev = cfg.eval_rows if cfg.eval_rows is not None else min(ds.rows // 10, 50_000)
    if ev < 0 or ev >= ds.rows:
        raise ConfigError(f"--eval-rows {ev} must be in [0, {ds.rows})")
    train_rows = ds.rows - ev
    if train_rows < cfg.batch_size:
        raise ConfigError(f"--batch-size {cfg.batch_size} is larger than the {train_rows} training "
                          f"rows of {ds.path}")
    return train_rows, ev


def iter_train_batches(ds: Dataset, cfg: TrainConfig, train_rows: int, start: int = 0):
    """Global batches start.. in dataset order, wrapping around at the end of the training rows.

    Batch b is the same whatever `start` is, which is what makes a resumed run exact.
    """
    per_epoch = train_rows // cfg.batch_size
    for b in range(start, cfg.iterations):
        lo = (b % per_epoch) * cfg.batch_size
        yield ds.slice(lo, lo + cfg.batch_size, b)


def shift_plan(rp, start: int):
    """A resumed run's planner counts iterations from 0; its plans are for iterations start.."""
    if start:
        for it in rp.iters:
            it.b += start
    return rp


def _loader(ds: Dataset, cfg: TrainConfig, train_rows: int, oracle: Oracle | PolicyPlanner,
            offsets: np.ndarray, out: queue.Queue, stop: threading.Event, start: int = 0) -> None:
    """The data loader + oracle thread: plans rounds ahead into a bounded queue."""
    held: list = []

    def keys() -> Iterator[np.ndarray]:
        for batch in iter_train_batches(ds, cfg, train_rows, start):
            held.append(batch)
            yield batch_keys(batch.sparse, offsets)

    try:
        for rp in oracle.plan(keys()):
            shift_plan(rp, start)
            batches = held[: len(rp.iters)]
            del held[: len(rp.iters)]
            while not stop.is_set():
                try:
                    out.put((rp, batches), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        out.put(None)
    except BaseException as e:  # re-raised on the main thread
        out.put(e)


def _rounds(q: queue.Queue) -> Iterator[tuple]:
    while True:
        item = q.get()
        if isinstance(item, BaseException):
            raise item
        if item is None:
            return
        yield item


def train(cfg: TrainConfig, progress: Callable[[int, dict], None] | None = None) -> TrainResult | None:
    """Run `cfg` and return its metrics, summary and final parameters.

    With `transport="torch"` this process is one rank of a torch.distributed job (see
    `engine/distributed.py`); only rank 0 returns a result, the others return None.
    """
    if cfg.threads is not None:
        # On a busy machine fewer compute threads than cores leave room for the oracle and
        # server threads (OpenMP teams slow down badly when a core is taken from them).
        torch.set_num_threads(cfg.threads)
    if cfg.system == "torchrec":
        from bagpipe_cli.external import train_torchrec

        return train_torchrec(cfg, progress=progress)
    if cfg.transport == "torch":
        from bagpipe_cli.engine.distributed import run_rank

        return run_rank(cfg, progress)
    ds = open_dataset(cfg.data)
    if ds.labels is None:
        raise ConfigError(f"dataset {cfg.data} has no labels; training needs a labeled dataset")
    train_rows, eval_rows = split_rows(ds, cfg)
    cards = ds.meta.cardinalities
    total = int(sum(cards))
    offsets = table_offsets(cards)
    mcfg = ModelConfig(cfg.model, ds.meta.num_dense, ds.meta.num_tables, cfg.emb_dim)
    rdim = row_dim(mcfg)
    rowopt = RowOptimizer(cfg.optimizer, cfg.lr)
    network = NetworkModel(cfg.net_gbps, cfg.net_latency_us)

    ck = open_resume(cfg, ds)
    start = ck.iteration if ck else 0

    model, dense_opt = build_dense(cfg, mcfg)
    if ck is None:
        servers = init_servers(cards, rdim, cfg.servers, cfg.seed, rowopt.init_state)
    else:  # the checkpoint's true parameters; the cache starts empty
        servers = servers_from_tables(ck.weight, ck.state, cfg.servers)
        restore_dense(ck, model, dense_opt)
    transport = InProcessTransport(servers, network)

    planner, capacity, peak = build_planner(cfg, ds, train_rows, offsets, total, start)
    system = build_system(cfg, cache_slots(planner), transport, rdim, rowopt, total, servers)
    ckpt = Checkpointer(cfg, dataset_identity(ds), start) if cfg.checkpoint_every else None

    q: queue.Queue = queue.Queue(maxsize=4)
    stop = threading.Event()
    loader = threading.Thread(target=_loader, name="oracle", daemon=True,
                              args=(ds, cfg, train_rows, planner, offsets, q, stop, start))
    loader.start()
    rows_out: list[dict[str, Any]] = list(ck.metrics[0]) if ck else []
    per = cfg.batch_size // cfg.trainers
    row_bytes = rdim * 4
    dense_bytes = sum(p.numel() for p in model.parameters()) * 4
    later: dict[int, Any] = {}  # iteration -> future of its asynchronous sync
    t_start = time.perf_counter()
    try:
        rounds = _rounds(q)
        t0 = time.perf_counter()
        cur = next(rounds, None)
        while cur is not None:
            rp, batches = cur
            nxt = next(rounds, None)
            t_data_round = time.perf_counter() - t0
            waited = system.begin_round(rp, nxt[0] if nxt else None)
            for i, (plan, batch) in enumerate(zip(rp.iters, batches, strict=True)):
                if ckpt is not None and ckpt.due(plan.b, cfg.iterations):
                    t = time.perf_counter()
                    # At the boundary before b: pending work lands, then the true tables are
                    # the servers' with the resident rows over them (the cache keeps them).
                    for f in later.values():
                        f.result()
                    later.clear()
                    system.flush()
                    weight, state = full_tables(servers, [system.resident()])
                    ckpt.save(plan.b, weight, state, model.state_dict(), dense_opt.state_dict(),
                              torch.get_rng_state(), [rows_out], t)
                    del weight, state
                t_it = time.perf_counter()
                step = Step(plan, torch.from_numpy(batch.dense), torch.from_numpy(batch.labels))
                step.times = dict.fromkeys(TIME_KEYS, 0.0)
                if i == 0:
                    step.times["data"] = t_data_round
                    step.times["prefetch_wait"] = waited
                # The asynchronous sync of iteration b-2 must land before b reads its rows.
                if plan.b - 2 in later:
                    later.pop(plan.b - 2).result()
                rows, state = system.read(step)
                loss = _forward_backward(model, step, rows, per, cfg)
                t = time.perf_counter()
                if cfg.trainers > 1:
                    crit_rows, async_rows = system.sync_rows(plan)
                    network.wait(network.allreduce_seconds(dense_bytes + crit_rows * row_bytes,
                                                           cfg.trainers))
                    if async_rows:
                        later[plan.b] = transport.collective(async_rows * row_bytes, cfg.trainers)
                step.times["sync"] += time.perf_counter() - t
                t = time.perf_counter()
                dense_opt.step()
                dense_opt.zero_grad(set_to_none=True)
                system.update(step, rows, state, step.grad_rows, rowopt)
                step.times["optimizer"] = time.perf_counter() - t
                rec = iteration_record(step, loss, time.perf_counter() - t_it + step.times["data"]
                                       + (waited if i == 0 else 0.0))
                rows_out.append(rec)
                if progress:
                    progress(plan.b, rec)
            t0 = time.perf_counter()
            cur = nxt
        for f in later.values():
            f.result()
        system.flush()
    finally:
        stop.set()
        loader.join(timeout=5)
        transport.close()
        if ckpt is not None:
            ckpt.close()
    wall = time.perf_counter() - t_start
    metrics = pd.DataFrame(rows_out)
    ev = evaluate(model, servers, ds, offsets, train_rows, eval_rows)
    summary = summarize(metrics, cfg, wall)
    summary.update(ev)
    summary.update({
        "oracle_ms_per_batch": planner.ms_per_batch,
        "peak_resident_rows": peak,
        "cache_rows": capacity,
        "network_emulated": network.emulated,
        "train_rows": train_rows,
        "eval_rows": eval_rows,
        "transport_busy_s": transport.busy_seconds(),
        "rows_written_back_at_end": getattr(system, "written_back_at_end", 0),
    })
    summary.update(checkpoint_summary(ckpt, ck, summary))
    tables = assemble_tables(servers, cards)
    config = {"train": asdict(cfg), "model": asdict(mcfg), "row_dim": rdim,
              "dataset": {"path": str(cfg.data), "name": ds.meta.name, "rows": ds.rows,
                          "cardinalities": cards, "dense_features": ds.meta.num_dense}}
    return TrainResult(config, metrics, summary, model, tables)


def build_dense(cfg: TrainConfig, mcfg: ModelConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The dense model (initialised from the seed, identically on every trainer) and its optimizer."""
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg)
    dlr = cfg.dense_lr if cfg.dense_lr is not None else cfg.lr
    dense_opt = (torch.optim.SGD(model.parameters(), lr=dlr) if cfg.dense_optimizer == "sgd"
                 else torch.optim.Adam(model.parameters(), lr=dlr))
    return model, dense_opt


def iteration_record(step: Step, loss: float, seconds: float) -> dict[str, Any]:
    """One row of metrics.csv: loss, time and its split, traffic and the plan's sync lists."""
    p = step.plan
    return {"iteration": p.b, "loss": loss, "time": seconds, **step.times,
            "unique_rows": len(p.uniq), "rows_fetched": step.rows_fetched,
            "rows_written_back": step.rows_written_back, "cache_hits": step.cache_hits,
            "sync_now": p.sync_now, "sync_later": p.sync_later, "no_sync": p.no_sync, **step.extra}


def build_planner(cfg: TrainConfig, ds: Dataset, train_rows: int, offsets: np.ndarray, total: int,
                  start: int = 0) -> tuple[Oracle | PolicyPlanner, int | None, int | None]:
    """The planner of this run (for batches start..: a resumed run plans only what is left),
    the cache capacity and bagpipe's peak (None for systems without a cache)."""

    def keys() -> Iterator[np.ndarray]:
        return (batch_keys(b.sparse, offsets) for b in iter_train_batches(ds, cfg, train_rows, start))

    peak = capacity = None
    if cfg.system in ("bagpipe", *PLANNED_POLICIES):
        # A planning pass (the oracle is deterministic) gives the peak before any training;
        # the baselines' default capacity is the memory Bagpipe needs, as in `bagpipe profile`.
        peak, _ = plan_peak(keys(), total, cfg.lookahead, cfg.round)
        capacity = cfg.cache_rows or max(peak, 1)
    if cfg.system == "bagpipe":
        if cfg.cache_rows is not None and cfg.cache_rows < peak:
            raise ConfigError(f"cache capacity {cfg.cache_rows} rows is below the lookahead's peak "
                              f"of {peak} rows; raise --cache-rows or lower --lookahead")
        return Oracle(total, cfg.lookahead, cfg.round, cfg.trainers, capacity), capacity, peak
    if cfg.system in PLANNED_POLICIES:
        return PolicyPlanner(cfg.system, trace_of(keys(), total), capacity, total, cfg.hot_sample), capacity, peak
    # Only U_b and its inverse are needed: an oracle with lookahead 1 and no cache plans them.
    return Oracle(total, 1, 1, cfg.trainers, None), None, None


def cache_slots(planner: Oracle | PolicyPlanner) -> int | None:
    """Physical rows of the trainer cache the plan needs (None: the system has no cache)."""
    return planner.slots if isinstance(planner, PolicyPlanner) else planner.capacity


def build_system(cfg: TrainConfig, slots: int | None, transport, rdim: int, rowopt: RowOptimizer,
                 total: int, servers=None, member: tuple[int, int] | None = None,
                 device: str | torch.device = "cpu") -> EmbeddingSystem | None:
    """The embedding system of this run, with a cache of `slots` rows (`cache_slots`): for
    every trainer (in-process, with the `servers`), or for trainer i of N (`member`, a
    torch.distributed trainer rank; `sync` is None there: its trainers fetch and push
    gradients themselves)."""
    if cfg.system in ("bagpipe", *PLANNED_POLICIES):
        cache = RowCache(slots, rdim, rowopt.state_dim, device)
        return CacheSystem(cfg.system, transport, cache, cfg.system == "bagpipe", member)
    if cfg.system == "local":
        return LocalSystem(transport, servers, total, member, device)
    if cfg.system == "het":
        return HetSystem(transport, total, cfg.trainers, cfg.staleness, rdim, cfg.batch_size,
                         None if member is None else [member[0]])
    return SyncSystem(transport) if member is None else None


def open_resume(cfg: TrainConfig, ds: Dataset) -> Checkpoint | None:
    """The checkpoint `cfg.resume` names, verified and checked against this run (or None)."""
    if cfg.resume is None:
        return None
    ck = find_checkpoint(Path(cfg.resume))
    check_compatible(cfg, ck, dataset_identity(ds))
    return ck


def restore_dense(ck: Checkpoint, model: torch.nn.Module, dense_opt: torch.optim.Optimizer) -> None:
    model.load_state_dict(ck.dense)
    dense_opt.load_state_dict(ck.dense_optimizer)
    torch.set_rng_state(ck.rng)


def checkpoint_summary(ckpt: Checkpointer | None, ck: Checkpoint | None,
                       summary: dict[str, Any]) -> dict[str, Any]:
    """Summary fields of checkpointing (timings) and of resuming (from where)."""
    out: dict[str, Any] = {}
    if ckpt is not None:
        out.update(ckpt.summary(summary["median_iter_ms"]))
    if ck is not None:
        out["resumed_from"] = {"checkpoint": str(ck.path), "iteration": ck.iteration,
                               "skipped": ck.skipped}
    return out


def slice_partials(model, dense: torch.Tensor, labels: torch.Tensor, values: torch.Tensor,
                   inverse: torch.Tensor, n_uniq: int, slices: list[slice], n_tables: int,
                   batch_size: int, times: dict[str, float]) -> tuple[list[float], list[torch.Tensor]]:
    """Forward/backward of trainer slices (sample ranges); their losses and row-gradient partials.

    `values` [B*T, dim] are the rows each access reads; a slice's partial is the sum, per
    row of U_b, of its accesses' gradients (in sample order). Dense gradients accumulate
    in the parameters' `.grad` (in slice order).
    """
    losses, partials = [], []
    for sl in slices:
        t = time.perf_counter()
        pos = slice(sl.start * n_tables, sl.stop * n_tables)
        emb = values[pos].view(sl.stop - sl.start, n_tables, -1).detach().requires_grad_()
        logits = model(dense[sl], emb)
        loss = F.binary_cross_entropy_with_logits(logits, labels[sl], reduction="sum") / batch_size
        t1 = time.perf_counter()
        times["forward"] += t1 - t
        loss.backward()
        partials.append(torch.zeros(n_uniq, values.shape[1], device=values.device).index_add_(
            0, inverse[pos], emb.grad.view(-1, values.shape[1])))
        times["backward"] += time.perf_counter() - t1
        losses.append(float(loss.detach()))
    return losses, partials


def ordered_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """p0 + p1 + ... in trainer order: the one summation order every transport uses."""
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total


def _forward_backward(model, step: Step, rows: torch.Tensor, per: int, cfg: TrainConfig) -> float:
    """All simulated trainers' slices; leaves the summed row gradients in step.grad_rows."""
    p = step.plan
    inverse = torch.from_numpy(p.inverse)
    values = step.emb if step.emb is not None else rows.index_select(0, inverse)
    slices = [slice(i * per, (i + 1) * per) for i in range(cfg.trainers)]
    losses, partials = slice_partials(model, step.dense, step.labels, values, inverse, len(p.uniq),
                                      slices, len(p.inverse) // cfg.batch_size, cfg.batch_size,
                                      step.times)
    step.grad_rows = ordered_sum(partials)
    total = 0.0
    for x in losses:
        total += x
    return total


@torch.no_grad()
def evaluate(model, servers, ds: Dataset, offsets: np.ndarray, start: int, n: int,
             batch: int = 8192) -> dict[str, float]:
    """Log loss and AUC on rows [start, start+n) with the tables as stored on the servers."""
    if n == 0:
        return {"eval_auc": float("nan"), "eval_logloss": float("nan")}
    k = len(servers)
    scores, labels = [], []
    for lo in range(start, start + n, batch):
        bt = ds.slice(lo, min(lo + batch, start + n))
        keys = batch_keys(bt.sparse, offsets)
        emb = torch.empty(len(keys), servers[0].weight.shape[1])
        for s, (pos, local) in enumerate(split_by_shard(keys, k)):
            emb[torch.from_numpy(pos)] = servers[s].weight[torch.from_numpy(local)]
        logits = model(torch.from_numpy(np.ascontiguousarray(bt.dense)),
                       emb.view(len(bt.labels), -1, emb.shape[1]))
        scores.append(logits.numpy())
        labels.append(np.asarray(bt.labels))
    s = np.concatenate(scores).astype(np.float64)
    y = np.concatenate(labels).astype(np.float64)
    logloss = float(np.mean(np.logaddexp(0, s) - y * s))
    return {"eval_auc": auc(y, s), "eval_logloss": logloss}


def summarize(metrics: pd.DataFrame, cfg: TrainConfig, wall: float) -> dict[str, Any]:
    """Speed and totals; the first `warmup` iterations are excluded from speed figures."""
    m = metrics.iloc[cfg.warmup:] if len(metrics) > cfg.warmup else metrics
    it = m["time"].to_numpy()
    med = float(np.median(it)) if len(it) else math.nan
    return {
        "system": cfg.system,
        "model": cfg.model,
        "iterations": int(len(metrics)),
        "measured_iterations": int(len(m)),
        "samples_per_s": float(cfg.batch_size * len(it) / it.sum()) if len(it) and it.sum() > 0 else math.nan,
        "median_iter_ms": 1e3 * med,
        "p10_iter_ms": 1e3 * float(np.percentile(it, 10)) if len(it) else math.nan,
        "p90_iter_ms": 1e3 * float(np.percentile(it, 90)) if len(it) else math.nan,
        "median_time_ms": {k: 1e3 * float(m[k].median()) for k in TIME_KEYS},
        "rows_fetched": int(metrics["rows_fetched"].sum()),
        "rows_written_back": int(metrics["rows_written_back"].sum()),
        "cache_hits": int(metrics["cache_hits"].sum()),
        "unique_rows": int(metrics["unique_rows"].sum()),
        "final_loss": float(metrics["loss"].iloc[-1]),
        "final_loss_mean10": float(metrics["loss"].iloc[-10:].mean()),
        "wall_s": wall,
    }


def save_model(result: TrainResult, path: Path, table_names: list[str]) -> None:
    """Dense state_dict and one full tensor per embedding table (after all write-backs)."""
    from bagpipe_cli.io import atomic_file

    obj = {"dense": result.model.state_dict(),
           "tables": dict(zip(table_names, result.tables, strict=True)),
           "config": result.config}
    with atomic_file(Path(path), "wb") as f:
        torch.save(obj, f)

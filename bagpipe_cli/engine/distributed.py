"""Runs over torch.distributed: rank 0 is the data loader + oracle, ranks 1..K the embedding
servers, ranks K+1..K+N the trainers (world size 1 + K + N). Every system runs here.

Rank 0, the servers and the trainers talk over gloo (CPU tensors). Trainers run on
`--device` (CPU or a GPU each); their collectives (dense gradients, LRPP's embedding
gradients) go over `--backend`: gloo, or NCCL on the GPUs.

The plan is deterministic, so everyone follows a known schedule and nothing needs an
any-source receive:

- oracle -> trainer i: every round's plan and trainer i's slice of its batches, one round
  ahead of use (the trainer prefetches the next round while it trains on this one);
- trainer <-> server: every trainer sends every server the *same sequence* of requests
  (FETCH, WRITEBACK, GRAD, CHECKPOINT, DONE), empty ones included, and a server serves the
  trainers in lockstep: request k of trainer 0, of trainer 1, ..., then request k+1 of each.
  So request k of every trainer is served before request k+1 of any, which orders
  requests *across* trainers as the schedule does: a write-back of row x by one trainer
  lands before a later fetch of x by another. Headers carry a sequence number, and a server
  that sees two trainers out of step stops with an error instead of serving stale rows;
- checkpoints (every `--checkpoint-every` iterations, at the boundary before iteration b):
  each trainer settles its pending sync_later updates, after which every resident row has
  its true value on the trainers that hold it; it sends rank 0 its new metrics records
  (trainer 0 also its resident rows, the dense model, its optimizer and the RNG state),
  then every server a CHECKPOINT request. A server that has it from every trainer (one
  lockstep pass) sends rank 0 its shard. Rank 0 lays the resident rows over the shards and
  writes the checkpoint. On resume rank 0 reads it and sends each server its shard and each
  trainer the dense state (only rank 0 needs to see the checkpoint directory);
- trainers among themselves: all-gathers of dense gradients and of the embedding
  gradients to synchronise, summed in trainer order on every trainer (the same order as
  the in-process engine, so results are bitwise equal to it). One all-gather per
  iteration is on the critical path (dense gradients, sync_now rows and the loss together).

How the systems map onto the ranks:

- bagpipe: the LRPP cache, logically replicated and physically partitioned. A row fetched
  for iteration b that is no_sync at b (one trainer uses it, then it is evicted) is private:
  only its user fetches, updates and writes it back (`RoundPlan.fetch_for`); every other
  fetched row goes to every trainer. `sync_now` rows are all-gathered on the critical path,
  `sync_later` rows asynchronously (applied before the next round is inserted or after the
  next iteration's backward, whichever comes first; they are not read before), and the
  other no_sync rows are updated and written back by their one user only. Other evicted
  rows are written back by trainer `key % N`.
- lru, lfu, fae: the same replicated cache, fetched on miss at the iteration's start; every
  row of U_b is all-gathered on the critical path (no LRPP); victims are written back by
  trainer `key % N`.
- local: every trainer fetches the whole tables before training (not timed) and
  all-gathers the gradients of every row of U_b; trainer 0 writes the tables back at the end.
- sync: a parameter server. Trainers fetch their slice's rows and push their gradients; a
  server sums them in trainer order and applies the optimizer.
- het: as sync, but each trainer reads its cached copy of a row while it is at most
  `--staleness` versions behind, and fetches it again otherwise (each trainer knows every
  U_b, so it counts the servers' versions itself).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pickle
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from bagpipe_cli.data.format import open_dataset, table_offsets
from bagpipe_cli.engine.checkpoint import Checkpointer, dataset_identity, full_tables
from bagpipe_cli.engine.network import NetworkModel
from bagpipe_cli.engine.optim import RowOptimizer
from bagpipe_cli.engine.oracle import NO_SYNC, SYNC_LATER, SYNC_NOW, IterPlan, batch_keys
from bagpipe_cli.engine.server import EmbeddingServer, assemble_tables, init_servers, split_by_shard
from bagpipe_cli.engine.systems import CacheSystem, Step
from bagpipe_cli.engine.trainer import (
    TIME_KEYS,
    TrainConfig,
    TrainResult,
    build_dense,
    build_planner,
    build_system,
    cache_slots,
    checkpoint_summary,
    evaluate,
    iter_train_batches,
    iteration_record,
    open_resume,
    ordered_sum,
    shift_plan,
    slice_partials,
    split_rows,
    summarize,
)
from bagpipe_cli.engine.transport import Transport
from bagpipe_cli.errors import BagpipeError, ConfigError
from bagpipe_cli.io import atomic_file, json_default
from bagpipe_cli.models import ModelConfig, build_model, row_dim

OP_FETCH, OP_WRITEBACK, OP_GRAD, OP_DONE, OP_CHECKPOINT = 1, 2, 3, 4, 5
OP_NAMES = {OP_FETCH: "FETCH", OP_WRITEBACK: "WRITEBACK", OP_GRAD: "GRAD", OP_DONE: "DONE",
            OP_CHECKPOINT: "CHECKPOINT"}
# Trainers hold U_b's rows (a cache or the whole tables) and all-gather their gradients;
# the others (sync, het) fetch their own rows and push gradients to the servers.
REPLICATED = ("bagpipe", "lru", "lfu", "fae", "local")
ALL_RANKS, TRAINERS = -2, -1  # "peers" of a collective, for error messages


@dataclass(frozen=True)
class Layout:
    """Which rank plays which role."""

    servers: int
    trainers: int

    @property
    def world(self) -> int:
        return 1 + self.servers + self.trainers

    def server_rank(self, k: int) -> int:
        return 1 + k

    def trainer_rank(self, i: int) -> int:
        return 1 + self.servers + i

    def role(self, rank: int) -> tuple[str, int]:
        if rank == 0:
            return "oracle", 0
        if rank <= self.servers:
            return "server", rank - 1
        return "trainer", rank - 1 - self.servers

    def name(self, rank: int) -> str:
        if rank == TRAINERS:
            return "the other trainers (collective)"
        if rank == ALL_RANKS:
            return "the other ranks (collective)"
        role, i = self.role(rank)
        return "oracle/loader (rank 0)" if role == "oracle" else f"{role} {i} (rank {rank})"


class RankFailure(BagpipeError):
    """Another rank died or could not be reached."""


class ScheduleError(BagpipeError):
    """Two trainers sent a server different requests at the same step (a bug, not bad input)."""


def _comm(layout: Layout, peer: int, fn, *args):
    """Run a communication call; a failure names the role of the peer."""
    try:
        return fn(*args)
    except RuntimeError as e:
        msg = str(e)
        why = ("connection closed (it exited or crashed)"
               if "closed by peer" in msg or "reset by peer" in msg
               else "timed out" if "imeout" in msg or "timed out" in msg
               else msg.splitlines()[0][:160])
        raise RankFailure(f"lost contact with {layout.name(peer)}: {why}") from e


def send_obj(obj: Any, dst: int, layout: Layout) -> int:
    """Send a picklable object to rank `dst`; returns the bytes sent."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    _comm(layout, dst, dist.send, torch.tensor([len(data)], dtype=torch.int64), dst)
    _comm(layout, dst, dist.send, buf, dst)
    return len(data) + 8


# Rank 0 plans the whole run (bagpipe's peak, the baselines' trace) before its first message,
# which on a large dataset takes longer than --timeout: that one wait is this long. A rank 0
# that dies meanwhile is noticed at once (its connections close).
PLANNING_WAIT_S = 24 * 3600.0


def recv_obj(src: int, layout: Layout, wait_s: float | None = None) -> Any:
    """Receive an object `send_obj` sent; `wait_s` overrides the job's --timeout."""
    n = torch.empty(1, dtype=torch.int64)
    if wait_s is None:
        _comm(layout, src, dist.recv, n, src)
    else:
        work = _comm(layout, src, dist.irecv, n, src)
        _comm(layout, src, work.wait, datetime.timedelta(seconds=wait_s))
    buf = torch.empty(int(n.item()), dtype=torch.uint8)
    _comm(layout, src, dist.recv, buf, src)
    return pickle.loads(buf.numpy().tobytes())


def to_cpu(obj: Any) -> Any:
    """Tensors in (nested) dicts, lists and tuples moved to the CPU, for sending to rank 0."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


# --------------------------------------------------------------------------- devices


def rank_facts() -> dict[str, Any]:
    """What a rank can offer a trainer: its host, CUDA devices and whether torch has NCCL."""
    return {"host": socket.gethostname(),
            "cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "nccl": dist.is_available() and dist.is_nccl_available()}


def trainer_devices(cfg, layout: Layout, facts: list[dict[str, Any]]) -> list[str]:
    """The device of every trainer, from every rank's `rank_facts()` (the same answer on every
    rank). `--device cuda` gives the trainers on a host its GPUs in turn; NCCL needs one GPU
    per trainer. Raises ConfigError naming the trainer that cannot run as asked."""
    if cfg.device == "cpu":
        return ["cpu"] * layout.trainers
    out: list[str] = []
    taken: dict[tuple[str, int], str] = {}
    for i in range(layout.trainers):
        f = facts[layout.trainer_rank(i)]
        who = f"{layout.name(layout.trainer_rank(i))} on {f['host']}"
        if f["cuda"] == 0:
            raise ConfigError(f"--device {cfg.device}: {who} has no CUDA device "
                              "(torch.cuda.is_available() is False); use --device cpu")
        if cfg.device == "cuda":
            before = sum(facts[layout.trainer_rank(j)]["host"] == f["host"] for j in range(i))
            dev = before % f["cuda"]
        else:
            dev = int(cfg.device.split(":", 1)[1])
            if dev >= f["cuda"]:
                raise ConfigError(f"--device {cfg.device}: {who} has {f['cuda']} CUDA device(s)")
        if cfg.backend == "nccl":
            if not f["nccl"]:
                raise ConfigError(f"--backend nccl: the torch of {who} has no NCCL; use --backend gloo")
            if (f["host"], dev) in taken:
                raise ConfigError(f"--backend nccl: {who} and {taken[(f['host'], dev)]} would share "
                                  f"cuda:{dev}, and NCCL needs a GPU per trainer; use --backend gloo "
                                  "or fewer trainers per machine")
            taken[(f["host"], dev)] = who
        out.append(f"cuda:{dev}")
    return out


# --------------------------------------------------------------------------- trainer side


class _DistRows:
    """A fetch in flight: the replies of every server, assembled on result()."""

    def __init__(self, n: int, parts: list, dim: int, sdim: int, layout: Layout):
        self.n, self.parts, self.dim, self.sdim, self.layout = n, parts, dim, sdim, layout

    def done(self) -> bool:
        return all(w.is_completed() for _, _, _, works, _ in self.parts for w in works)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.empty(self.n, self.dim)
        state = torch.empty(self.n, self.sdim)
        for pos, r, s, works, peer in self.parts:
            for w in works:
                _comm(self.layout, peer, w.wait)
            p = torch.from_numpy(pos)
            rows[p] = r
            state[p] = s
        return rows, state


class TorchTransport(Transport):
    """The trainer's side of the servers over torch.distributed point-to-point (gloo, CPU).

    Every call sends one request to every server (an empty one where a server has no rows
    of it), numbered per server: the servers check that all trainers are in step.
    """

    def __init__(self, layout: Layout, dim: int, state_dim: int, network: NetworkModel):
        self.layout = layout
        self.num_servers = layout.servers
        self.network = network
        self.dim, self.sdim = dim, state_dim
        self._pending: list[tuple[Any, Any, int]] = []  # (work, tensors kept alive, peer)
        self._seq = [0] * layout.servers
        self.bytes_sent = 0
        self.bytes_received = 0

    def _send(self, k: int, op: int, local: np.ndarray, *payload: torch.Tensor) -> None:
        dst = self.layout.server_rank(k)
        hdr = torch.tensor([op, len(local), self._seq[k]], dtype=torch.int64)
        self._seq[k] += 1
        msgs = [hdr] + ([torch.from_numpy(np.ascontiguousarray(local, dtype=np.int64)), *payload]
                        if len(local) else [])
        for m in msgs:
            if m.numel():
                self._pending.append((_comm(self.layout, dst, dist.isend, m.contiguous(), dst), m, dst))
                self.bytes_sent += m.numel() * m.element_size()
        if len(self._pending) > 256:
            self._pending = [p for p in self._pending if not p[0].is_completed()]

    def fetch(self, keys: np.ndarray) -> _DistRows:
        parts = []
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            src = self.layout.server_rank(k)
            self._send(k, OP_FETCH, local)
            r = torch.empty(len(local), self.dim)
            s = torch.empty(len(local), self.sdim)
            works = []
            if len(local):
                works.append(_comm(self.layout, src, dist.irecv, r, src))
                if self.sdim:
                    works.append(_comm(self.layout, src, dist.irecv, s, src))
                self.bytes_received += (r.numel() + s.numel()) * 4
            parts.append((pos, r, s, works, src))
        return _DistRows(len(keys), parts, self.dim, self.sdim, self.layout)

    def write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> list[Future]:
        rows, state = rows.cpu(), state.cpu()
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            p = torch.from_numpy(pos)
            payload = [rows[p].contiguous()] + ([state[p].contiguous()] if self.sdim else [])
            self._send(k, OP_WRITEBACK, local, *payload)
        return []

    def push_gradients(self, keys: np.ndarray, grad: torch.Tensor, opt: Any) -> list[Future]:
        grad = grad.cpu()
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            self._send(k, OP_GRAD, local, grad[torch.from_numpy(pos)].contiguous())
        return []

    def collective(self, nbytes: int, participants: int) -> Future:
        f: Future = Future()
        f.set_result(None)
        return f

    def checkpoint(self) -> None:
        """Tell every server this trainer reached a checkpoint (after its write-backs)."""
        for k in range(self.num_servers):
            self._send(k, OP_CHECKPOINT, np.empty(0, np.int64))

    def close(self) -> None:
        for k in range(self.num_servers):
            self._send(k, OP_DONE, np.empty(0, np.int64))
        for work, _, peer in self._pending:
            _comm(self.layout, peer, work.wait)
        self._pending = []


# --------------------------------------------------------------------------- server


def serve(server: EmbeddingServer, layout: Layout, network: NetworkModel, opt: RowOptimizer) -> dict:
    """Serve the trainers' requests in lockstep (request k of every trainer, then k+1) until
    every trainer is done; a pass of GRAD requests is summed in trainer order and applied."""
    dim, sdim = server.weight.shape[1], server.state.shape[1]
    busy = wait = 0.0
    bytes_sent = 0
    seq = 0
    while True:
        grads = []
        first: tuple[int, int] | None = None
        for i in range(layout.trainers):
            src = layout.trainer_rank(i)
            hdr = torch.empty(3, dtype=torch.int64)
            t0 = time.perf_counter()
            _comm(layout, src, dist.recv, hdr, src)
            t1 = time.perf_counter()
            wait += t1 - t0
            op, n, their_seq = int(hdr[0]), int(hdr[1]), int(hdr[2])
            if first is None:
                first = (op, their_seq)
            if (op, their_seq) != first or their_seq != seq:
                raise ScheduleError(
                    f"server {server.shard}: request {seq} of trainer {i} is "
                    f"{OP_NAMES.get(op, op)} #{their_seq}, trainer 0's is {OP_NAMES.get(first[0])} "
                    f"#{first[1]}; the trainers are out of step (a bug in bagpipe)")
            if op in (OP_DONE, OP_CHECKPOINT):
                continue
            local = torch.empty(n, dtype=torch.int64)
            if n:
                _comm(layout, src, dist.recv, local, src)
            # An empty request only keeps the trainers in step: it costs no emulated transfer.
            if op == OP_FETCH:
                w, s = server.gather(local)
                if n:
                    network.wait(network.transfer_seconds(n * (dim + sdim) * 4))
                    _comm(layout, src, dist.send, w, src)
                    if sdim:
                        _comm(layout, src, dist.send, s, src)
                    bytes_sent += (w.numel() + s.numel()) * 4
            elif op == OP_WRITEBACK:
                if n:
                    rows = torch.empty(n, dim)
                    state = torch.empty(n, sdim)
                    _comm(layout, src, dist.recv, rows, src)
                    if sdim:
                        _comm(layout, src, dist.recv, state, src)
                    server.write_back(local, rows, state)
                    network.wait(network.transfer_seconds(n * (dim + sdim) * 4))
            elif op == OP_GRAD:
                g = torch.empty(n, dim)
                if n:
                    _comm(layout, src, dist.recv, g, src)
                    network.wait(network.transfer_seconds(n * dim * 4))
                grads.append((local, g))
            busy += time.perf_counter() - t1
        seq += 1
        if first[0] == OP_DONE:
            break
        if first[0] == OP_CHECKPOINT:
            # Every trainer's requests before the checkpoint are served: this is the shard at
            # the boundary.
            send_obj({"weight": server.weight, "state": server.state}, 0, layout)
            checkpoint_done()
        if grads:
            # Sum the trainers' gradients in trainer order, then one optimizer step per row.
            t1 = time.perf_counter()
            keys = torch.unique(torch.cat([k for k, _ in grads]))
            total = torch.zeros(len(keys), dim)
            for k, g in grads:
                if len(k):
                    total.index_add_(0, torch.searchsorted(keys, k), g)
            if len(keys):
                server.apply_gradients(keys, total, opt)
            busy += time.perf_counter() - t1
    return {"busy_s": busy, "waiting_s": wait, "bytes_sent": bytes_sent,
            "bytes_received": server.bytes_received, "requests": seq}


# --------------------------------------------------------------------------- trainer


class TrainerGroup:
    """Collectives among the trainers: all-gathers, summed in trainer order on every trainer.

    Tensors travel on `comm` (the CPU for gloo, the trainer's GPU for NCCL) and the sums
    come back on `device`.
    """

    def __init__(self, group, layout: Layout, device: torch.device, comm: torch.device):
        self.group, self.layout, self.device, self.comm = group, layout, device, comm

    def _gather(self, x: torch.Tensor, async_op: bool = False):
        x = x.to(self.comm).contiguous()
        parts = [torch.empty_like(x) for _ in range(self.layout.trainers)]
        work = _comm(self.layout, TRAINERS, dist.all_gather, parts, x, self.group, async_op)
        return x, parts, work

    def start_sum(self, x: torch.Tensor) -> _PendingSum:
        """x0 + x1 + ... of every trainer's `x` (same shape on every trainer), in the
        background; `.result()` waits for it."""
        return _PendingSum(self, *self._gather(x, async_op=True))

    def sum_with_floats(self, x: torch.Tensor, values: list[float]) -> tuple[torch.Tensor, float]:
        """`sum(x)` and the sum of every trainer's `values` (added as Python floats, in trainer
        order) in one all-gather. The values travel in x's dtype, so they must be exact in it
        (a float32 loss is)."""
        k = len(values)
        _, parts, _ = self._gather(torch.cat([x.reshape(-1), x.new_tensor(values)]))
        total = 0.0
        for p in parts:
            for v in p[len(p) - k:].tolist():
                total += v
        return ordered_sum([p[:len(p) - k] for p in parts]).to(self.device), total


class _PendingSum:
    def __init__(self, group: TrainerGroup, x, parts, work):
        self.group, self.x, self.parts, self.work = group, x, parts, work  # x: kept until done

    def result(self) -> torch.Tensor:
        _comm(self.group.layout, TRAINERS, self.work.wait)
        return ordered_sum(self.parts).to(self.group.device)


@dataclass
class _Later:
    """The asynchronous all-gather of an iteration's sync_later gradients, applied (and its
    evicted rows written back) when settled."""

    plan: IterPlan
    idx: np.ndarray  # positions in U_b
    sum: _PendingSum
    evict_keys: np.ndarray  # this trainer's share of the evicted sync_later rows
    evict_slots: np.ndarray


def trainer_main(cfg, layout: Layout, i: int, group: TrainerGroup) -> None:
    """Trainer i: its slice of every global batch, synchronised with the other trainers."""
    device = group.device
    ds = open_dataset(cfg.data)
    total_rows = int(sum(ds.meta.cardinalities))
    mcfg = ModelConfig(cfg.model, ds.meta.num_dense, ds.meta.num_tables, cfg.emb_dim)
    rdim = row_dim(mcfg)
    opt = RowOptimizer(cfg.optimizer, cfg.lr)
    network = NetworkModel(cfg.net_gbps, cfg.net_latency_us)
    model, dense_opt = build_dense(cfg, mcfg)
    model.to(device)  # in place: the optimizer keeps the same parameters
    params = list(model.parameters())
    info = recv_obj(0, layout, PLANNING_WAIT_S)
    start = info["start"]
    if info.get("dense") is not None:  # resumed: the checkpoint's dense model and optimizer
        model.load_state_dict(info["dense"])
        dense_opt.load_state_dict(info["optimizer"])
        torch.set_rng_state(info["rng"])
    transport = TorchTransport(layout, rdim, opt.state_dim, network)
    n, per = layout.trainers, cfg.batch_size // layout.trainers
    system = build_system(cfg, info["slots"], transport, rdim, opt, total_rows, member=(i, n),
                          device=device)
    cache = system if isinstance(system, CacheSystem) else None
    replicated = cfg.system in REPLICATED
    lrpp = cfg.system == "bagpipe"
    records: list[dict] = []
    pending: list[_Later] = []

    def idx(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(a, dtype=np.int64)).to(device)

    def settle() -> None:
        """Apply the pending sync_later updates; then write back their evicted rows."""
        while pending:
            item = pending.pop(0)
            system.update_rows(item.plan, item.idx, item.sum.result(), opt)
            cache.write_back_slots(item.evict_keys, item.evict_slots)  # sent even when empty (lockstep)

    def evict(plan: IterPlan, cls: np.ndarray | None, later: np.ndarray, later_sum) -> int:
        """Write back this trainer's share of the rows evicted after `plan.b`; returns how many.

        no_sync rows by their user, others by trainer `key % N`: now if their update is
        applied, once it is settled for sync_later rows.
        """
        ek = plan.evict_keys
        share = cache.writes_back(ek)  # key % N == i
        if cls is None:  # no LRPP: every row of U_b was synchronised on the critical path
            now_ev, late_ev = share, np.zeros(len(ek), dtype=bool)
        else:
            ev_pos = np.searchsorted(plan.uniq, ek)
            ev_cls = cls[ev_pos]
            now_ev = ((ev_cls == NO_SYNC) & (plan.owner[ev_pos] == i)) | ((ev_cls == SYNC_NOW) & share)
            late_ev = (ev_cls == SYNC_LATER) & share
        cache.write_back_slots(ek[now_ev], plan.evict_slots[now_ev])  # sent even when empty
        cache.forget(plan.evict_slots)  # evicted from the logical cache on every trainer
        if later_sum is not None:
            pending.append(_Later(plan, later, later_sum, ek[late_ev], plan.evict_slots[late_ev]))
        return int(now_ev.sum() + late_ev.sum())

    sent = 0  # records already sent to rank 0 with a checkpoint

    def checkpoint() -> None:
        nonlocal sent
        settle()  # now every resident row has its true value
        msg: dict[str, Any] = {"records": records[sent:]}
        sent = len(records)
        if i == 0:
            msg["resident"] = system.resident() if system is not None else None
            msg["dense"] = to_cpu(model.state_dict())
            msg["optimizer"] = to_cpu(dense_opt.state_dict())
            msg["rng"] = torch.get_rng_state()
        send_obj(msg, 0, layout)
        transport.checkpoint()  # after every write-back of this trainer
        checkpoint_done()

    every = cfg.checkpoint_every
    cur = recv_obj(0, layout)
    while cur is not None:
        rp, batches = cur
        t_round = time.perf_counter()
        nxt = recv_obj(0, layout)
        settle()  # before this round's rows move into freed slots
        waited = system.begin_round(rp, nxt[0] if nxt else None) if system is not None else 0.0
        t_round = time.perf_counter() - t_round
        for j, (plan, (dense_np, labels_np)) in enumerate(zip(rp.iters, batches, strict=True)):
            if every and plan.b > start and plan.b % every == 0:
                checkpoint()
            t_it = time.perf_counter()
            step = Step(plan, torch.from_numpy(dense_np).to(device), torch.from_numpy(labels_np).to(device))
            step.times = dict.fromkeys(TIME_KEYS, 0.0)
            if j == 0:
                step.times["prefetch_wait"] = waited
                step.times["data"] = t_round - waited
            n_tables = len(plan.inverse) // cfg.batch_size
            pos = slice(i * per * n_tables, (i + 1) * per * n_tables)
            inv_i = plan.inverse[pos]
            if replicated:  # U_b's rows are here (cache or tables); gradients over all of U_b
                keys, li = plan.uniq, idx(inv_i)
                rows, _ = system.read(step)
                values = rows.index_select(0, li)
            else:  # only the slice's own rows
                keys, local_inv = np.unique(plan.uniq[inv_i], return_inverse=True)
                li = idx(local_inv.reshape(-1))
                if system is not None:  # het: cached copies, refetched when too stale
                    system.read(step)
                    values = step.emb[pos].to(device)
                else:  # sync: fresh from the servers
                    t0 = time.perf_counter()
                    rows, _ = transport.fetch(keys).result()
                    step.times["prefetch_wait"] += time.perf_counter() - t0
                    step.rows_fetched = len(keys)
                    values = rows.to(device).index_select(0, li)
            losses, partials = slice_partials(model, step.dense, step.labels, values, li, len(keys),
                                              [slice(0, per)], n_tables, cfg.batch_size, step.times)
            partial = partials[0]
            settle()  # the previous iteration's sync_later landed during this backward
            t = time.perf_counter()
            now = later = mine = np.empty(0, np.int64)
            cls = plan.row_class if lrpp else None
            if replicated and cls is None:  # no LRPP: every row of U_b on the critical path
                now = np.arange(len(keys))
            elif replicated:
                now = np.flatnonzero(cls == SYNC_NOW)
                later = np.flatnonzero(cls == SYNC_LATER)
                mine = np.flatnonzero((cls == NO_SYNC) & (plan.owner == i))
            # One all-gather on the critical path: dense gradients, sync_now rows and the loss
            # (summed as Python floats in trainer order, as in the in-process engine) ...
            dense = [p.grad.reshape(-1) for p in params]
            flat, loss = group.sum_with_floats(torch.cat([*dense, partial[idx(now)].reshape(-1)]), losses)
            off = 0
            for p in params:
                p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
            total_now = flat[off:].view(len(now), rdim)
            # ... then sync_later's in the background.
            later_sum = group.start_sum(partial[idx(later)]) if len(later) else None
            step.times["sync"] = time.perf_counter() - t
            t = time.perf_counter()
            dense_opt.step()
            dense_opt.zero_grad(set_to_none=True)
            if replicated:
                system.update_rows(plan, np.concatenate([now, mine]),
                                   torch.cat([total_now, partial[idx(mine)]]), opt)
                written = evict(plan, cls, later, later_sum) if cache is not None else 0
                step.rows_written_back = written + (cache.pre_evicted if cache is not None and j == 0 else 0)
            else:
                transport.push_gradients(keys, partial, opt)
                if system is not None:
                    system.advance(plan)
                step.rows_written_back = len(keys)
            if device.type == "cuda":  # the GPU's queued work belongs to this iteration's time
                torch.cuda.synchronize(device)
            step.times["optimizer"] = time.perf_counter() - t
            rec = iteration_record(step, loss, time.perf_counter() - t_it + step.times["data"]
                                   + (waited if j == 0 else 0.0))
            records.append(rec)
        cur = nxt
    settle()
    if system is not None:
        system.flush()
    transport.close()
    out = {"records": records, "bytes_sent": transport.bytes_sent,
           "bytes_received": transport.bytes_received, "device": str(device),
           "written_back_at_end": getattr(system, "written_back_at_end", 0)}
    if i == 0:
        out["dense"] = to_cpu(model.state_dict())
    send_obj(out, 0, layout)


# --------------------------------------------------------------------------- oracle / rank 0


def oracle_main(cfg, layout: Layout, devices: list[str], progress=None):
    """Rank 0: plan, feed the trainers, then gather everything and return a TrainResult."""
    t_start = time.perf_counter()
    ds = open_dataset(cfg.data)
    train_rows, eval_rows = split_rows(ds, cfg)
    cards = ds.meta.cardinalities
    total = int(sum(cards))
    offsets = table_offsets(cards)
    n, per = layout.trainers, cfg.batch_size // layout.trainers
    ck = open_resume(cfg, ds)
    start = ck.iteration if ck else 0
    if ck is not None and len(ck.metrics) != n:
        raise ConfigError(f"--resume {ck.path}: the checkpoint has metrics of {len(ck.metrics)} "
                          f"trainer(s), this run has {n}")
    prior = [list(m) for m in ck.metrics] if ck else [[] for _ in range(n)]
    planner, capacity, peak = build_planner(cfg, ds, train_rows, offsets, total, start)
    trainers = [layout.trainer_rank(i) for i in range(n)]
    sent = {"bytes_sent": 0, "waiting_s": 0.0}  # rank 0's sends (blocked while a trainer is behind)

    def send(obj: Any, dst: int) -> None:
        t = time.perf_counter()
        sent["bytes_sent"] += send_obj(obj, dst, layout)
        sent["waiting_s"] += time.perf_counter() - t
    for k in range(layout.servers):  # initial shards: the checkpoint's, or None (seeded init)
        send(None if ck is None else {"weight": ck.weight[k::layout.servers].clone(),
                                      "state": ck.state[k::layout.servers].clone()}, layout.server_rank(k))
    for r in trainers:
        send({"slots": cache_slots(planner), "start": start,
              **({"dense": ck.dense, "optimizer": ck.dense_optimizer, "rng": ck.rng} if ck else {})}, r)
    if ck is not None:
        del ck.weight, ck.state
    ckpt = Checkpointer(cfg, dataset_identity(ds), start) if cfg.checkpoint_every else None
    ck_records = [list(p) for p in prior]

    def take_checkpoints(rp) -> None:
        """Rank 0's part of the checkpoints at boundaries inside round `rp` (see the module doc)."""
        for plan in rp.iters:
            if ckpt is None or not ckpt.due(plan.b, cfg.iterations):
                continue
            parts = [recv_obj(r, layout) for r in trainers]
            t = time.perf_counter()
            for i, part in enumerate(parts):
                ck_records[i].extend(part["records"])
            shards = [SimpleNamespace(shard=k, **recv_obj(layout.server_rank(k), layout))
                      for k in range(layout.servers)]
            res = parts[0]["resident"]
            weight, state = full_tables(shards, [res] if res is not None else [])
            ckpt.save(plan.b, weight, state, parts[0]["dense"], parts[0]["optimizer"],
                      parts[0]["rng"], ck_records, t)
            checkpoint_done()

    held: list = []

    def stream():
        for batch in iter_train_batches(ds, cfg, train_rows, start):
            held.append(batch)
            yield batch_keys(batch.sparse, offsets)

    done = start
    prev = None
    try:
        for rp in planner.plan(stream()):
            shift_plan(rp, start)
            batches = held[: len(rp.iters)]
            del held[: len(rp.iters)]
            for i, r in enumerate(trainers):
                sl = slice(i * per, (i + 1) * per)
                send((rp, [(b.dense[sl], b.labels[sl]) for b in batches]), r)
            # The trainers got this round while they train the previous one, which is when
            # they reach its checkpoint boundaries.
            if prev is not None:
                take_checkpoints(prev)
            prev = rp
            done += len(rp.iters)
            if progress and rp.iters:
                progress(done - 1, {"loss": float("nan"), "time": float("nan")})
        for r in trainers:
            send(None, r)
        if prev is not None:
            take_checkpoints(prev)
    finally:
        if ckpt is not None:
            ckpt.close()
    outs = [recv_obj(r, layout) for r in trainers]
    for i, o in enumerate(outs):
        o["records"] = prior[i] + o["records"]
    shards = [recv_obj(layout.server_rank(k), layout) for k in range(layout.servers)]
    wall = time.perf_counter() - t_start

    mcfg = ModelConfig(cfg.model, ds.meta.num_dense, ds.meta.num_tables, cfg.emb_dim)
    model = build_model(mcfg)
    model.load_state_dict(outs[0]["dense"])
    rdim = row_dim(mcfg)
    servers = []
    for k, sh in enumerate(shards):
        s = EmbeddingServer(k, layout.servers, total, rdim, sh["state"])
        s.weight = sh["weight"]
        servers.append(s)
    frames = [pd.DataFrame(o["records"]) for o in outs]
    metrics = frames[0].copy()
    # The run is as slow as its slowest trainer; traffic counts are summed over trainers.
    for col in ["time", *TIME_KEYS]:
        metrics[col] = np.max([f[col].to_numpy() for f in frames], axis=0)
    for col in ["rows_fetched", "rows_written_back", "stale_reads"]:
        if col in metrics:
            metrics[col] = np.sum([f[col].to_numpy() for f in frames], axis=0)
    summary = summarize(metrics, cfg, wall)
    summary.update(evaluate(model, servers, ds, offsets, train_rows, eval_rows))
    summary.update({
        "oracle_ms_per_batch": planner.ms_per_batch, "peak_resident_rows": peak, "cache_rows": capacity,
        "network_emulated": NetworkModel(cfg.net_gbps, cfg.net_latency_us).emulated,
        "train_rows": train_rows, "eval_rows": eval_rows, "transport": "torch",
        "world_size": layout.world, "backend": cfg.backend, "trainer_devices": devices,
        "rows_written_back_at_end": int(sum(o["written_back_at_end"] for o in outs)),
        **checkpoint_summary(ckpt, ck, summary),
        "roles": {"oracle": {"busy_s": planner.seconds, **sent},
                  **{f"trainer{i}": {"device": o["device"], "bytes_sent": o["bytes_sent"],
                                     "bytes_received": o["bytes_received"],
                                     "waiting_s": float(frames[i]["prefetch_wait"].sum() + frames[i]["sync"].sum()),
                                     "busy_s": float(frames[i][["forward", "backward", "optimizer"]].sum().sum())}
                     for i, o in enumerate(outs)},
                  **{f"server{k}": sh["stats"] for k, sh in enumerate(shards)}},
    })
    config = {"train": asdict(cfg), "model": asdict(mcfg), "row_dim": rdim,
              "dataset": {"path": str(cfg.data), "name": ds.meta.name, "rows": ds.rows,
                          "cardinalities": cards, "dense_features": ds.meta.num_dense},
              "layout": {"world": layout.world, "servers": layout.servers, "trainers": layout.trainers,
                         "trainer_devices": devices, "backend": cfg.backend}}
    return TrainResult(config, metrics, summary, model, assemble_tables(servers, cards))


def server_main(cfg, layout: Layout, k: int) -> None:
    ds = open_dataset(cfg.data)
    mcfg = ModelConfig(cfg.model, ds.meta.num_dense, ds.meta.num_tables, cfg.emb_dim)
    opt = RowOptimizer(cfg.optimizer, cfg.lr)
    cards = ds.meta.cardinalities
    init = recv_obj(0, layout, PLANNING_WAIT_S)  # a resumed run's shard, from rank 0's checkpoint
    if init is None:
        # Initial values depend only on (seed, table, id): each server builds just its shard.
        server = init_servers(cards, row_dim(mcfg), layout.servers, cfg.seed, opt.init_state, only=k)[0]
    else:
        server = EmbeddingServer(k, layout.servers, int(sum(cards)), row_dim(mcfg), init["state"])
        server.weight = init["weight"]
    stats = serve(server, layout, NetworkModel(cfg.net_gbps, cfg.net_latency_us), opt)
    send_obj({"weight": server.weight, "state": server.state, "stats": stats}, 0, layout)


def run_rank(cfg, progress=None):
    """Entry point of one rank (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment,
    as torchrun sets them). Returns the TrainResult on rank 0, None elsewhere."""
    layout = Layout(cfg.servers, cfg.trainers)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise ConfigError(f"--transport torch: environment variable {var} is not set; launch "
                              "with torchrun or use --procs")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != layout.world:
        raise ConfigError(f"world size {world} does not match 1 oracle + --servers {cfg.servers} "
                          f"+ --trainers {cfg.trainers} = {layout.world} ranks")
    torch.set_num_threads(cfg.threads or max(1, int(os.environ.get("BAGPIPE_THREADS", "1"))))
    _fault_injection(rank)
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    if cfg.backend == "nccl":  # a timed-out NCCL wait raises (a one-line error), not an abort
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    except RuntimeError as e:  # the rendezvous timed out, or MASTER_ADDR cannot be reached
        m = re.search(r"(\d+)/(\d+) clients joined", str(e))
        joined = f"only {m[1]} of {m[2]} ranks joined" if m else "not every rank joined"
        raise RankFailure(
            f"the job did not start: {joined} within --timeout "
            f"{cfg.timeout_s:g} s at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}; start "
            f"all {world} ranks (1 oracle + --servers + --trainers) with the same options") from None
    try:
        # Every rank learns every trainer's device (and every rank fails alike if one cannot
        # run as asked) before the trainers' group is made.
        facts: list[Any] = [None] * world
        _comm(layout, ALL_RANKS, dist.all_gather_object, facts, rank_facts())
        devices = trainer_devices(cfg, layout, facts)
        role, idx = layout.role(rank)
        device = torch.device(devices[idx] if role == "trainer" else "cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)  # before the trainers' group: NCCL binds to it
        group = dist.new_group([layout.trainer_rank(i) for i in range(layout.trainers)],
                               timeout=timeout, backend=cfg.backend)
        if role == "oracle":
            return oracle_main(cfg, layout, devices, progress)
        if role == "server":
            server_main(cfg, layout, idx)
        else:
            comm = device if cfg.backend == "nccl" else torch.device("cpu")
            trainer_main(cfg, layout, idx, TrainerGroup(group, layout, device, comm))
        return None
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


class RankError(BagpipeError):
    """A rank of a local job failed: its own error (exit code 2 for bad options or input)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code if exit_code in (1, 2, 130) else 1


def spawn_local(command: list[str], layout: Layout, timeout_s: float,
                on_line: Callable[[str], None] | None = None) -> None:
    """Run `command` as layout.world local processes (one per rank) over loopback. Rank 0's
    stdout lines go to `on_line` (the others' stdout is dropped); the ranks' stderr is passed
    through, except their one-line errors ("Error: ..."), which are collected.

    If a rank fails, the others get `timeout_s` plus a grace period to notice (they exit
    with an error naming the lost role) before they are killed. Then one error is raised:
    which rank died without an error (killed, crashed) and what another rank saw, or else
    the first error a rank gave of its own (not "lost contact with ...").
    """
    port = free_port()
    procs = []
    errors: list[tuple[int, str]] = []  # (rank, message) in the order they came

    def relay(rank: int, stream) -> None:
        for line in stream:
            if line.startswith("Error: "):
                errors.append((rank, line[len("Error: "):].rstrip("\n")))
            else:
                sys.stderr.write(line)

    readers = []
    for rank in range(layout.world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(layout.world),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               # c10d's own socket warnings; our errors say what failed
               "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
        out = subprocess.DEVNULL if rank else subprocess.PIPE if on_line else None
        p = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        readers.append(threading.Thread(target=relay, args=(rank, p.stderr), daemon=True))
    if on_line is not None:
        readers.append(threading.Thread(target=lambda: [on_line(x) for x in procs[0].stdout], daemon=True))
    for t in readers:
        t.start()
    failed: tuple[int, int] | None = None
    deadline = None
    try:
        while any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                if p.poll() not in (None, 0) and failed is None:
                    failed = (rank, p.returncode)
                    deadline = time.monotonic() + timeout_s + 10
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for t in readers:
            t.join(timeout=5)
    if failed is None:
        failed = next(((r, p.returncode) for r, p in enumerate(procs) if p.returncode), None)
    if failed is None:
        return
    # A rank that failed without an error of its own (killed, crashed) is the cause ...
    said = {r for r, _ in errors}
    silent = [r for r, p in enumerate(procs) if p.returncode and r not in said]
    if silent:
        rank = failed[0] if failed[0] in silent else silent[0]
        seen = next(((r, m) for r, m in errors if r != rank), None)
        raise RankFailure(f"{layout.name(rank)} exited with code {procs[rank].returncode}"
                          + (f"; {layout.name(seen[0])}: {seen[1]}" if seen else ""))
    # ... else the first error a rank gave of its own, not one that it lost contact with another.
    rank, message = next(((r, m) for r, m in errors if not m.startswith("lost contact with")), errors[0])
    raise RankError(message, procs[rank].returncode)


def spawn_train(cfg, progress: Callable[[int, dict], None] | None = None) -> TrainResult:
    """Run `cfg` over torch.distributed as local processes, one per rank (`--procs`, or a bench
    run with `transport: torch`), and return rank 0's TrainResult."""
    cfg = replace(cfg, transport="torch")
    layout = Layout(cfg.servers, cfg.trainers)
    trainer_devices(cfg, layout, [rank_facts()] * layout.world)  # every rank runs on this machine
    with tempfile.TemporaryDirectory(prefix="bagpipe-ranks-") as tmp:
        conf, out = Path(tmp) / "config.json", Path(tmp) / "result.pt"
        conf.write_text(json.dumps(asdict(cfg), default=json_default))

        def on_line(line: str) -> None:  # rank 0 reports each planned round
            if progress and line.startswith("{"):
                progress(json.loads(line)["iteration"], {"loss": math.nan, "time": math.nan})

        entry = "import sys; from bagpipe_cli.engine.distributed import rank_main; sys.exit(rank_main(*sys.argv[1:]))"
        spawn_local([sys.executable, "-c", entry, str(conf), str(out)], layout, cfg.timeout_s, on_line)
        return torch.load(out, weights_only=False)


def rank_main(conf: str, out: str) -> int:
    """One rank of `spawn_train`: rank 0 saves the TrainResult to `out`. Returns the exit code."""
    try:
        cfg = TrainConfig(**json.loads(Path(conf).read_text()))
        result = run_rank(cfg, lambda b, rec: print(json.dumps({"iteration": b}), flush=True))
        if result is not None:
            with atomic_file(Path(out), "wb") as f:
                torch.save(result, f)
        return 0
    except BagpipeError as e:
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


_after_checkpoints: list = []  # [checkpoints left before the kill, delay_s] when armed


def _fault_injection(rank: int) -> None:
    """For fault tests: BAGPIPE_FAULT="rank=R,after_s=S" SIGKILLs rank R after S seconds;
    "rank=R,after_checkpoints=K[,delay_s=D]" SIGKILLs it D seconds after its part of the
    K-th checkpoint is done (a server: its shard sent; a trainer: its state sent; rank 0:
    the checkpoint written)."""
    spec = os.environ.get("BAGPIPE_FAULT")
    if not spec:
        return
    kv = dict(part.split("=", 1) for part in spec.split(","))
    if int(kv.get("rank", -1)) != rank:
        return
    if "after_checkpoints" in kv:
        _after_checkpoints[:] = [int(kv["after_checkpoints"]), float(kv.get("delay_s", 0.0))]
        return
    _kill_later(float(kv.get("after_s", 1.0)))


def _kill_later(seconds: float) -> None:
    import signal

    t = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGKILL))
    t.daemon = True
    t.start()


def checkpoint_done() -> None:
    """This rank finished its part of a checkpoint (for BAGPIPE_FAULT's after_checkpoints)."""
    if _after_checkpoints:
        _after_checkpoints[0] -= 1
        if _after_checkpoints[0] == 0:
            _kill_later(_after_checkpoints[1])

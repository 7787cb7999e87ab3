"""Runs over torch.distributed: rank 0 is the data loader + oracle, ranks 1..K the embedding
servers, ranks K+1..K+N the trainers (world size 1 + K + N; gloo).

The plan is deterministic, so everyone follows a known schedule and nothing needs an
any-source receive:

- oracle -> trainer i: every round's plan and trainer i's slice of its batches, one round
  ahead of use (the trainer prefetches the next round while it trains on this one);
- trainer <-> server: each trainer sends every server the same sequence of requests
  (FETCH, WRITEBACK, GRAD, DONE; empty ones included), so a server serves the trainers
  round-robin, each in its own order. A trainer's write-backs precede its later fetches on
  the same connection, which keeps fetches after the write-backs they depend on;
- checkpoints (every `--checkpoint-every` iterations, at the boundary before iteration b):
  each trainer settles its pending sync_later updates, after which every resident row of
  the replicated cache has its true value on every trainer; it sends rank 0 its new metrics
  records (trainer 0 also the resident rows, the dense model, its optimizer and the RNG
  state), then every server a CHECKPOINT request after its write-backs. A server that has
  it from a trainer serves that trainer no further until it has it from all of them, then
  sends rank 0 its shard. Rank 0 lays the resident rows over the shards and writes the
  checkpoint. On resume rank 0 reads it and sends each server its shard and each trainer
  the dense state (only rank 0 needs to see the checkpoint directory);
- trainers among themselves: all-gathers of dense gradients and of the embedding
  gradients LRPP says to synchronise, summed in trainer order on every trainer (the same
  order as the in-process engine, so results are bitwise equal to it).

Bagpipe's cache is logically replicated and, here, physically replicated too: every trainer
fetches a round's rows and holds U_b. `sync_now` rows are all-gathered on the critical
path, `sync_later` rows asynchronously (applied before the next round is inserted or after
the next iteration's backward, whichever comes first; they are not read before), and
`no_sync` rows are updated and written back by their one user only. Other evicted rows are
written back by trainer `key % N`. `sync` works like a parameter server: trainers fetch
their slice's rows and push gradients; a server sums them in trainer order and applies
the optimizer.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import subprocess
import sys
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from bagpipe_cli.data.format import open_dataset, table_offsets
from bagpipe_cli.engine.cache import RowCache
from bagpipe_cli.engine.checkpoint import Checkpointer, dataset_identity, full_tables
from bagpipe_cli.engine.network import NetworkModel
from bagpipe_cli.engine.optim import RowOptimizer
from bagpipe_cli.engine.oracle import (
    NO_SYNC,
    SYNC_LATER,
    SYNC_NOW,
    Oracle,
    batch_keys,
    plan_peak,
)
from bagpipe_cli.engine.server import EmbeddingServer, assemble_tables, init_servers, split_by_shard
from bagpipe_cli.engine.systems import CacheSystem, Step
from bagpipe_cli.engine.trainer import (
    TIME_KEYS,
    TrainResult,
    build_dense,
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
from bagpipe_cli.models import ModelConfig, build_model, row_dim

OP_FETCH, OP_WRITEBACK, OP_GRAD, OP_DONE, OP_CHECKPOINT = 1, 2, 3, 4, 5
DIST_SYSTEMS = ("bagpipe", "sync")


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
        if rank < 0:
            return "the other trainers (collective)"
        role, i = self.role(rank)
        return "oracle/loader (rank 0)" if role == "oracle" else f"{role} {i} (rank {rank})"


class RankFailure(BagpipeError):
    """Another rank died or could not be reached."""


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


def send_obj(obj: Any, dst: int, layout: Layout) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    _comm(layout, dst, dist.send, torch.tensor([len(data)], dtype=torch.int64), dst)
    _comm(layout, dst, dist.send, buf, dst)


def recv_obj(src: int, layout: Layout) -> Any:
    n = torch.empty(1, dtype=torch.int64)
    _comm(layout, src, dist.recv, n, src)
    buf = torch.empty(int(n.item()), dtype=torch.uint8)
    _comm(layout, src, dist.recv, buf, src)
    return pickle.loads(buf.numpy().tobytes())


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
    """The trainer's side of the servers over torch.distributed point-to-point (gloo)."""

    def __init__(self, layout: Layout, dim: int, state_dim: int, network: NetworkModel):
        self.layout = layout
        self.num_servers = layout.servers
        self.network = network
        self.dim, self.sdim = dim, state_dim
        self._pending: list[tuple[Any, Any, int]] = []  # (work, tensors kept alive, peer)
        self.bytes_sent = 0

    def _send(self, dst: int, op: int, local: np.ndarray, *payload: torch.Tensor) -> None:
        hdr = torch.tensor([op, len(local)], dtype=torch.int64)
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
            dst = self.layout.server_rank(k)
            self._send(dst, OP_FETCH, local)
            r = torch.empty(len(local), self.dim)
            s = torch.empty(len(local), self.sdim)
            works = []
            if len(local):
                works.append(_comm(self.layout, dst, dist.irecv, r, dst))
                if self.sdim:
                    works.append(_comm(self.layout, dst, dist.irecv, s, dst))
            parts.append((pos, r, s, works, dst))
        return _DistRows(len(keys), parts, self.dim, self.sdim, self.layout)

    def write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> list[Future]:
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            p = torch.from_numpy(pos)
            payload = [rows[p].contiguous()] + ([state[p].contiguous()] if self.sdim else [])
            self._send(self.layout.server_rank(k), OP_WRITEBACK, local, *payload)
        return []

    def push_gradients(self, keys: np.ndarray, grad: torch.Tensor, opt: Any) -> list[Future]:
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            self._send(self.layout.server_rank(k), OP_GRAD, local, grad[torch.from_numpy(pos)].contiguous())
        return []

    def collective(self, nbytes: int, participants: int) -> Future:
        f: Future = Future()
        f.set_result(None)
        return f

    def checkpoint(self) -> None:
        """Tell every server this trainer reached a checkpoint (after its write-backs)."""
        for k in range(self.num_servers):
            self._send(self.layout.server_rank(k), OP_CHECKPOINT, np.empty(0, np.int64))

    def close(self) -> None:
        for k in range(self.num_servers):
            self._send(self.layout.server_rank(k), OP_DONE, np.empty(0, np.int64))
        for work, _, peer in self._pending:
            _comm(self.layout, peer, work.wait)
        self._pending = []


# --------------------------------------------------------------------------- server


def serve(server: EmbeddingServer, layout: Layout, network: NetworkModel, opt: RowOptimizer) -> dict:
    """Serve the trainers' requests round-robin until every trainer is done."""
    dim, sdim = server.weight.shape[1], server.state.shape[1]
    active = list(range(layout.trainers))
    paused: set[int] = set()  # trainers that reached a checkpoint the others have not
    busy = wait = 0.0
    bytes_sent = 0
    while active:
        grads = []
        still = []
        for i in active:
            if i in paused:
                still.append(i)
                continue
            src = layout.trainer_rank(i)
            hdr = torch.empty(2, dtype=torch.int64)
            t0 = time.perf_counter()
            _comm(layout, src, dist.recv, hdr, src)
            t1 = time.perf_counter()
            wait += t1 - t0
            op, n = int(hdr[0]), int(hdr[1])
            if op == OP_DONE:
                continue
            still.append(i)
            if op == OP_CHECKPOINT:
                paused.add(i)
                continue
            local = torch.empty(n, dtype=torch.int64)
            if n:
                _comm(layout, src, dist.recv, local, src)
            if op == OP_FETCH:
                w, s = server.gather(local)
                network.wait(network.transfer_seconds(n * (dim + sdim) * 4))
                if n:
                    _comm(layout, src, dist.send, w, src)
                    if sdim:
                        _comm(layout, src, dist.send, s, src)
                    bytes_sent += (w.numel() + s.numel()) * 4
            elif op == OP_WRITEBACK:
                rows = torch.empty(n, dim)
                state = torch.empty(n, sdim)
                if n:
                    _comm(layout, src, dist.recv, rows, src)
                    if sdim:
                        _comm(layout, src, dist.recv, state, src)
                    server.write_back(local, rows, state)
                network.wait(network.transfer_seconds(n * (dim + sdim) * 4))
            elif op == OP_GRAD:
                g = torch.empty(n, dim)
                if n:
                    _comm(layout, src, dist.recv, g, src)
                grads.append((local, g))
                network.wait(network.transfer_seconds(n * dim * 4))
            busy += time.perf_counter() - t1
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
        active = still
        if active and paused == set(active):
            # Every trainer's requests before the checkpoint are served: this is the shard at
            # the boundary.
            send_obj({"weight": server.weight, "state": server.state}, 0, layout)
            paused.clear()
            checkpoint_done()
    return {"busy_s": busy, "waiting_s": wait, "bytes_sent": bytes_sent,
            "bytes_received": server.bytes_received}


# --------------------------------------------------------------------------- trainer


def _all_gather_sum(x: torch.Tensor, group, layout: Layout) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(layout.trainers)]
    _comm(layout, -1, dist.all_gather, parts, x.contiguous(), group)
    return ordered_sum(parts)


class _Later:
    """An asynchronous all-gather of sync_later gradients, applied when completed."""

    def __init__(self, b, idx, parts, work, evict_keys):
        self.b, self.idx, self.parts, self.work, self.evict_keys = b, idx, parts, work, evict_keys


def trainer_main(cfg, layout: Layout, i: int, group) -> None:
    """Trainer i: its slice of every global batch, LRPP sync with the other trainers."""
    ds = open_dataset(cfg.data)
    mcfg = ModelConfig(cfg.model, ds.meta.num_dense, ds.meta.num_tables, cfg.emb_dim)
    rdim = row_dim(mcfg)
    opt = RowOptimizer(cfg.optimizer, cfg.lr)
    network = NetworkModel(cfg.net_gbps, cfg.net_latency_us)
    model, dense_opt = build_dense(cfg, mcfg)
    params = list(model.parameters())
    info = recv_obj(0, layout)
    start = info["start"]
    if info.get("dense") is not None:  # resumed: the checkpoint's dense model and optimizer
        model.load_state_dict(info["dense"])
        dense_opt.load_state_dict(info["optimizer"])
        torch.set_rng_state(info["rng"])
    transport = TorchTransport(layout, rdim, opt.state_dim, network)
    bagpipe = cfg.system == "bagpipe"
    system = (CacheSystem("bagpipe", transport, RowCache(info["capacity"], rdim, opt.state_dim), True)
              if bagpipe else None)
    n, per = layout.trainers, cfg.batch_size // layout.trainers
    records: list[dict] = []
    pending: list[_Later] = []

    def finish_later(item: _Later) -> None:
        _comm(layout, -1, item.work.wait)
        total = ordered_sum(item.parts)
        p = item.idx
        rows, state = system.cache.read(p["slots"])
        new_rows, new_state = opt.step(rows, state, total)
        system.cache.write(p["slots"], new_rows, new_state)
        ek, es = item.evict_keys
        if len(ek):
            r, s = system.cache.read(es)
            transport.write_back(ek, r, s)

    def settle() -> None:
        while pending:
            finish_later(pending.pop(0))

    sent = 0  # records already sent to rank 0 with a checkpoint

    def checkpoint() -> None:
        nonlocal sent
        settle()  # now every resident row has its true value, the same on every trainer
        msg: dict[str, Any] = {"records": records[sent:]}
        sent = len(records)
        if i == 0:
            msg["resident"] = system.resident() if bagpipe else None
            msg["dense"] = model.state_dict()
            msg["optimizer"] = dense_opt.state_dict()
            msg["rng"] = torch.get_rng_state()
        send_obj(msg, 0, layout)
        transport.checkpoint()  # after every write-back of this trainer
        checkpoint_done()

    every = cfg.checkpoint_every

    cur = recv_obj(0, layout)
    while cur is not None:
        rp, batches = cur
        nxt = recv_obj(0, layout)
        t_round = time.perf_counter()
        settle()  # before this round's rows move into freed slots
        waited = system.begin_round(rp, nxt[0] if nxt else None) if bagpipe else 0.0
        t_round = time.perf_counter() - t_round
        for j, (plan, (dense_np, labels_np)) in enumerate(zip(rp.iters, batches, strict=True)):
            if every and plan.b > start and plan.b % every == 0:
                checkpoint()
            t_it = time.perf_counter()
            step = Step(plan, torch.from_numpy(dense_np), torch.from_numpy(labels_np))
            step.times = dict.fromkeys(TIME_KEYS, 0.0)
            if j == 0:
                step.times["prefetch_wait"] = waited
                step.times["data"] = t_round - waited
            n_tables = len(plan.inverse) // cfg.batch_size
            pos = slice(i * per * n_tables, (i + 1) * per * n_tables)
            inv_i = plan.inverse[pos]
            if bagpipe:
                rows, state = system.read(step)
                keys, local_inv = plan.uniq, inv_i
            else:
                keys, local_inv = np.unique(plan.uniq[inv_i], return_inverse=True)
                t0 = time.perf_counter()
                rows, state = transport.fetch(keys).result()
                step.times["prefetch_wait"] += time.perf_counter() - t0
                step.rows_fetched = len(keys)
            li = torch.from_numpy(np.asarray(local_inv, dtype=np.int64).reshape(-1))
            values = rows.index_select(0, li)
            losses, partials = slice_partials(model, step.dense, step.labels, values, li, len(keys),
                                              [slice(0, per)], n_tables, cfg.batch_size, step.times)
            partial = partials[0]
            settle()  # the previous iteration's sync_later landed during this backward
            t = time.perf_counter()
            flat = _all_gather_sum(torch.cat([p.grad.reshape(-1) for p in params]), group, layout)
            off = 0
            for p in params:
                p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
            # Losses are summed as Python floats in trainer order, as in the in-process engine.
            lparts = [torch.empty(1, dtype=torch.float64) for _ in range(n)]
            _comm(layout, -1, dist.all_gather, lparts, torch.tensor(losses, dtype=torch.float64), group)
            loss = 0.0
            for x in lparts:
                loss += float(x)
            if bagpipe:
                cls = plan.row_class
                now = np.flatnonzero(cls == SYNC_NOW)
                later = np.flatnonzero(cls == SYNC_LATER)
                mine = np.flatnonzero((cls == NO_SYNC) & (plan.owner == i))
                total_now = _all_gather_sum(partial[torch.from_numpy(now)], group, layout)
                if len(later):
                    x = partial[torch.from_numpy(later)].contiguous()
                    parts = [torch.empty_like(x) for _ in range(n)]
                    work = _comm(layout, -1, dist.all_gather, parts, x, group, True)
                else:
                    work = parts = None
            step.times["sync"] = time.perf_counter() - t
            t = time.perf_counter()
            dense_opt.step()
            dense_opt.zero_grad(set_to_none=True)
            if bagpipe:
                idx = np.concatenate([now, mine])
                grad = torch.cat([total_now, partial[torch.from_numpy(mine)]])
                sl = plan.slots[idx]
                r, s = system.cache.read(sl)
                nr, ns = opt.step(r, s, grad)
                system.cache.write(sl, nr, ns)
                # Evictions: no_sync rows by their user now; sync_later rows by key % N once
                # their update is applied.
                ev_pos = np.searchsorted(plan.uniq, plan.evict_keys)
                ev_cls = cls[ev_pos]
                mine_ev = (ev_cls == NO_SYNC) & (plan.owner[ev_pos] == i)
                if mine_ev.any():
                    r, s = system.cache.read(plan.evict_slots[mine_ev])
                    transport.write_back(plan.evict_keys[mine_ev], r, s)
                late_ev = (ev_cls == SYNC_LATER) & (plan.evict_keys % n == i)
                system.forget(plan.evict_slots)  # evicted from the logical cache on every trainer
                step.rows_written_back = int(mine_ev.sum() + late_ev.sum())
                step.rows_fetched = plan.fetched
                step.cache_hits = len(plan.uniq) - plan.fetched
                if work is not None:
                    pending.append(_Later(plan.b, {"slots": plan.slots[later]}, parts, work,
                                          (plan.evict_keys[late_ev], plan.evict_slots[late_ev])))
            else:
                transport.push_gradients(keys, partial, opt)
                step.rows_written_back = len(keys)
            step.times["optimizer"] = time.perf_counter() - t
            rec = iteration_record(step, loss, time.perf_counter() - t_it + step.times["data"]
                                   + step.times["prefetch_wait"] * (j == 0 and bagpipe))
            records.append(rec)
        cur = nxt
    settle()
    transport.close()
    out = {"records": records, "bytes_sent": transport.bytes_sent}
    if i == 0:
        out["dense"] = {k: v.clone() for k, v in model.state_dict().items()}
    send_obj(out, 0, layout)


# --------------------------------------------------------------------------- oracle / rank 0


def oracle_main(cfg, layout: Layout, progress=None):
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

    def keys():
        return (batch_keys(b.sparse, offsets) for b in iter_train_batches(ds, cfg, train_rows, start))

    peak = capacity = None
    if cfg.system == "bagpipe":
        peak, _ = plan_peak(keys(), total, cfg.lookahead, cfg.round)
        if cfg.cache_rows is not None and cfg.cache_rows < peak:
            raise ConfigError(f"cache capacity {cfg.cache_rows} rows is below the lookahead's peak "
                              f"of {peak} rows; raise --cache-rows or lower --lookahead")
        capacity = cfg.cache_rows or max(peak, 1)
        oracle = Oracle(total, cfg.lookahead, cfg.round, n, capacity)
    else:
        oracle = Oracle(total, 1, 1, n, None)
    trainers = [layout.trainer_rank(i) for i in range(n)]
    for k in range(layout.servers):  # initial shards: the checkpoint's, or None (seeded init)
        send_obj(None if ck is None else {"weight": ck.weight[k::layout.servers].clone(),
                                          "state": ck.state[k::layout.servers].clone()},
                 layout.server_rank(k), layout)
    for r in trainers:
        send_obj({"capacity": capacity, "start": start,
                  **({"dense": ck.dense, "optimizer": ck.dense_optimizer, "rng": ck.rng} if ck else {})},
                 r, layout)
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
        for rp in oracle.plan(stream()):
            shift_plan(rp, start)
            batches = held[: len(rp.iters)]
            del held[: len(rp.iters)]
            for i, r in enumerate(trainers):
                sl = slice(i * per, (i + 1) * per)
                send_obj((rp, [(b.dense[sl], b.labels[sl]) for b in batches]), r, layout)
            # The trainers got this round while they train the previous one, which is when
            # they reach its checkpoint boundaries.
            if prev is not None:
                take_checkpoints(prev)
            prev = rp
            done += len(rp.iters)
            if progress:
                progress(done - 1, {"loss": float("nan"), "time": float("nan")})
        for r in trainers:
            send_obj(None, r, layout)
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
    for col in ["time", "data", "prefetch_wait", "forward", "backward", "sync", "optimizer"]:
        metrics[col] = np.max([f[col].to_numpy() for f in frames], axis=0)
    for col in ["rows_fetched", "rows_written_back"]:
        metrics[col] = np.sum([f[col].to_numpy() for f in frames], axis=0)
    summary = summarize(metrics, cfg, wall)
    summary.update(evaluate(model, servers, ds, offsets, train_rows, eval_rows))
    summary.update({
        "oracle_ms_per_batch": oracle.ms_per_batch, "peak_resident_rows": peak, "cache_rows": capacity,
        "network_emulated": NetworkModel(cfg.net_gbps, cfg.net_latency_us).emulated,
        "train_rows": train_rows, "eval_rows": eval_rows, "transport": "torch",
        "world_size": layout.world,
        **checkpoint_summary(ckpt, ck, summary),
        "roles": {**{f"trainer{i}": {"bytes_sent": o["bytes_sent"],
                                     "waiting_s": float(frames[i]["prefetch_wait"].sum() + frames[i]["sync"].sum()),
                                     "busy_s": float(frames[i][["forward", "backward", "optimizer"]].sum().sum())}
                     for i, o in enumerate(outs)},
                  **{f"server{k}": sh["stats"] for k, sh in enumerate(shards)}},
    })
    config = {"train": asdict(cfg), "model": asdict(mcfg), "row_dim": rdim,
              "dataset": {"path": str(cfg.data), "name": ds.meta.name, "rows": ds.rows,
                          "cardinalities": cards, "dense_features": ds.meta.num_dense},
              "layout": {"world": layout.world, "servers": layout.servers, "trainers": layout.trainers}}
    return TrainResult(config, metrics, summary, model, assemble_tables(servers, cards))


def server_main(cfg, layout: Layout, k: int) -> None:
    ds = open_dataset(cfg.data)
    mcfg = ModelConfig(cfg.model, ds.meta.num_dense, ds.meta.num_tables, cfg.emb_dim)
    opt = RowOptimizer(cfg.optimizer, cfg.lr)
    cards = ds.meta.cardinalities
    init = recv_obj(0, layout)  # a resumed run's shard, from rank 0's checkpoint
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
    if cfg.system not in DIST_SYSTEMS:
        raise ConfigError(f"--transport torch supports --system {' or '.join(DIST_SYSTEMS)} "
                          f"(got {cfg.system})")
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
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.timeout_s))
    try:
        group = dist.new_group([layout.trainer_rank(i) for i in range(layout.trainers)])
        role, idx = layout.role(rank)
        if role == "oracle":
            return oracle_main(cfg, layout, progress)
        if role == "server":
            server_main(cfg, layout, idx)
        else:
            trainer_main(cfg, layout, idx, group)
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


def spawn_local(argv: list[str], layout: Layout, timeout_s: float) -> None:
    """Run `bagpipe <argv>` as layout.world local processes (one per rank) over loopback.

    If a rank fails, the others get `timeout_s` plus a grace period to notice (they exit
    with an error naming the lost role) before they are killed; raises naming the failed role.
    """
    port = free_port()
    procs = []
    for rank in range(layout.world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(layout.world),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        quiet = rank != 0
        procs.append(subprocess.Popen([sys.executable, "-m", "bagpipe_cli", *argv], env=env,
                                      stdout=subprocess.DEVNULL if quiet else None))
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
    if failed is None:
        failed = next(((r, p.returncode) for r, p in enumerate(procs) if p.returncode), None)
    if failed is not None:
        raise RankFailure(f"{layout.name(failed[0])} exited with code {failed[1]}")


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
    import threading

    t = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGKILL))
    t.daemon = True
    t.start()


def checkpoint_done() -> None:
    """This rank finished its part of a checkpoint (for BAGPIPE_FAULT's after_checkpoints)."""
    if _after_checkpoints:
        _after_checkpoints[0] -= 1
        if _after_checkpoints[0] == 0:
            _kill_later(_after_checkpoints[1])

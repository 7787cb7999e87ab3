"""Every table on each trainer (`local`): no fetches, all row gradients summed among the
trainers."""

from __future__ import annotations

import numpy as np
import torch

from bagpipe_cli.engine.comm.shards import Shard, scatter_to_shards, shard_tables
from bagpipe_cli.engine.comm.transport import Transport
from bagpipe_cli.engine.planning.plans import IterPlan
from bagpipe_cli.engine.records.metrics import Step
from bagpipe_cli.engine.systems.base import EmbeddingSystem, SystemParts
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet

TABLE_CHUNK = 1 << 20  # rows per request when a whole table crosses to or from a trainer


def _pieces(keys: np.ndarray, total_rows: int):
    """(start, end) in sorted `keys` of each TABLE_CHUNK of the key space: every trainer
    sends as many requests, some empty (the servers serve them in lockstep)."""
    for lo in range(0, total_rows, TABLE_CHUNK):
        a, b = np.searchsorted(keys, [lo, lo + TABLE_CHUNK])
        yield int(a), int(b)


def fetch_in_pieces(transport: Transport, keys: np.ndarray,
                    total_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows and optimizer state of sorted `keys` from the servers, a piece at a time into
    tensors made once, so that no side holds a second copy of them."""
    weight = state = None
    for a, b in _pieces(keys, total_rows):
        w, s = transport.fetch(keys[a:b]).result()
        if weight is None:
            weight, state = torch.empty(len(keys), w.shape[1]), torch.empty(len(keys), s.shape[1])
        weight[a:b], state[a:b] = w, s
    return weight, state


def write_back_in_pieces(system: EmbeddingSystem, keys: np.ndarray, weight: torch.Tensor,
                         state: torch.Tensor, total_rows: int) -> None:
    """Write sorted `keys`' rows (`weight`, `state`: theirs, in order) back to the servers, a
    piece at a time, each landed before the next is copied off the device."""
    for a, b in _pieces(keys, total_rows):
        system._write_back(keys[a:b], weight[a:b].cpu(), state[a:b].cpu())
        system.transport.drain()


class LocalSystem(EmbeddingSystem):
    """Every table on each trainer: no fetches, all row gradients summed among the trainers
    (the sum of every row a batch touched, each iteration: with many trainers or a slow
    network it can cost more than a cache's fetches).

    The tables are copied from the servers before training (not timed) and written back
    after it, so evaluation and saved models see the final values. In-process they are
    the server objects' (`servers`: one shard is trained in place, several are copied); a
    trainer rank of a torch.distributed run
    fetches them whole, and trainer 0 writes them back at the end.
    """

    def __init__(self, transport: Transport, trainers: TrainerSet, total_rows: int,
                 servers: list[Shard] | None = None, device: str | torch.device = "cpu"):
        super().__init__(transport, trainers, device)
        self.servers = servers
        self._read: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (b, U_b's index, rows)
        if servers is not None:  # one shard: train it in place
            weight, state = shard_tables(servers)
        else:  # in pieces, so that no side holds a second copy of the tables
            weight, state = fetch_in_pieces(transport, np.arange(total_rows), total_rows)
        self.weight, self.state = weight.to(self.device), state.to(self.device)

    @classmethod
    def build(cls, p: SystemParts) -> LocalSystem:
        return cls(p.transport, p.trainers, p.setup.total_rows, p.servers, p.device)

    def _idx(self, keys: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(keys).to(self.device)

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        step.cache_hits = len(keys)
        t = self._idx(keys)
        rows = self.weight.index_select(0, t)
        self._read = (step.plan.b, t, rows)  # nothing writes these rows before b's update
        return rows.index_select(0, index)

    def update_rows(self, plan: IterPlan, idx: np.ndarray | None, grad: torch.Tensor,
                    opt: RowOptimizer) -> None:
        if idx is None and self._read is not None and self._read[0] == plan.b:
            _, t, rows = self._read
        else:
            t = self._idx(plan.uniq if idx is None else plan.uniq[idx])
            rows = self.weight.index_select(0, t)
        self._read = None
        rows, state = opt.step(rows, self.state.index_select(0, t), grad)
        self.weight.index_copy_(0, t, rows)
        if self.state.shape[1]:
            self.state.index_copy_(0, t, state)

    def flush(self) -> None:
        if self.servers is not None:
            scatter_to_shards(self.servers, self.weight, self.state)
            return
        # Every trainer holds the same tables: trainer 0 sends them, the others as many
        # empty write-backs (lockstep), one piece in flight (the transport copies each piece
        # per server), and then lets its copy go.
        total = self.weight.shape[0]
        keys = np.arange(total) if self.trainers.first == 0 else np.empty(0, np.int64)
        write_back_in_pieces(self, keys, self.weight, self.state, total)
        super().flush()
        self.weight, self.state = self.weight.new_empty(0, self.weight.shape[1]), self.state.new_empty(0, self.state.shape[1])

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        return np.arange(self.weight.shape[0]), self.weight.cpu().clone(), self.state.cpu().clone()

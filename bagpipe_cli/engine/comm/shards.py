"""Shard storage: the full tables in CPU memory, sharded by row over K embedding servers.

This is what a server holds, whichever runtime serves it (`engine/local/server.py`: a
serving thread; `engine/distributed/server.py`: a server rank). Rows of all tables live in one global key space (key = table offset + id). Server k holds
the keys with `key % K == k` (hot ids, which are small ids after preprocessing, spread over
all servers) at local index `key // K`, with each row's optimizer state next to it.
Initial values depend only on (seed, table, id), so results do not depend on K.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bagpipe_cli.engine.memory import INIT_CHUNK  # rows initialised at a time


class Shard:
    """One shard: `weight` [n, dim] and `state` [n, state_dim]; batched gathers and write-backs."""

    def __init__(self, shard: int, num_shards: int, total_rows: int, dim: int, state: torch.Tensor):
        self.shard = shard
        self.num_shards = num_shards
        self.rows = shard_rows(shard, num_shards, total_rows)
        self.weight = torch.empty(self.rows, dim, dtype=torch.float32)
        self.state = state
        self.bytes_served = 0
        self.bytes_received = 0

    @classmethod
    def holding(cls, shard: int, num_shards: int, weight: torch.Tensor, state: torch.Tensor) -> Shard:
        """Shard `shard` of `num_shards` holding the given rows (a checkpoint's, or a rank's)."""
        s = cls.__new__(cls)
        s.shard, s.num_shards, s.rows = shard, num_shards, weight.shape[0]
        s.weight, s.state = weight, state
        s.bytes_served = s.bytes_received = 0
        return s

    def gather(self, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows and optimizer state at local indices (copies)."""
        w = self.weight.index_select(0, local)
        s = self.state.index_select(0, local)
        self.bytes_served += (w.numel() + s.numel()) * 4
        return w, s

    def write_back(self, local: torch.Tensor, rows: torch.Tensor, state: torch.Tensor) -> None:
        """Store updated rows and their optimizer state."""
        self.weight.index_copy_(0, local, rows)
        if state.shape[1]:
            self.state.index_copy_(0, local, state)
        self.bytes_received += (rows.numel() + state.numel()) * 4

    def apply_gradients(self, local: torch.Tensor, grad: torch.Tensor, opt) -> None:
        """Apply the row optimizer to rows at local indices (parameter-server style update)."""
        rows, state = self.weight.index_select(0, local), self.state.index_select(0, local)
        new_rows, new_state = opt.step(rows, state, grad)
        self.weight.index_copy_(0, local, new_rows)
        if new_state.shape[1]:
            self.state.index_copy_(0, local, new_state)
        self.bytes_received += grad.numel() * 4


def shard_rows(shard: int, num_shards: int, total_rows: int) -> int:
    """Number of keys k < total_rows with k % num_shards == shard."""
    return max(0, (total_rows - shard + num_shards - 1) // num_shards)


def split_by_shard(keys: np.ndarray, num_shards: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each shard: (positions in `keys`, local indices on that shard)."""
    keys = np.asarray(keys, dtype=np.int64)
    if num_shards == 1:
        return [(np.arange(len(keys)), keys)]
    owner = keys % num_shards
    out = []
    for k in range(num_shards):
        pos = np.flatnonzero(owner == k)
        out.append((pos, keys[pos] // num_shards))
    return out


def init_shards(cardinalities: list[int], dim: int, num_shards: int, seed: int,
                 state_factory, only: int | None = None) -> list[Shard]:
    """Build K shards holding every table, initialised like DLRM: U(-1/sqrt(n), 1/sqrt(n)).

    `state_factory(rows)` makes the initial optimizer state of a shard. With `only=k` just
    shard k is built (a server rank of a distributed run holds only its own).
    """
    total = int(sum(cardinalities))
    ks = range(num_shards) if only is None else [only]
    servers = {k: Shard(k, num_shards, total, dim, state_factory(shard_rows(k, num_shards, total)))
               for k in ks}
    offset = 0
    for t, n in enumerate(cardinalities):
        bound = 1.0 / math.sqrt(n)
        for c, lo in enumerate(range(0, n, INIT_CHUNK)):
            hi = min(lo + INIT_CHUNK, n)
            g = torch.Generator().manual_seed(hash_seed(seed, t, c))
            # In place: a chunk's values are made in one buffer (engine/memory.py counts two).
            vals = torch.rand(hi - lo, dim, generator=g, dtype=torch.float32).mul_(2 * bound).sub_(bound)
            keys = np.arange(offset + lo, offset + hi, dtype=np.int64)
            for k, (pos, local) in enumerate(split_by_shard(keys, num_shards)):
                if k in servers:
                    servers[k].weight[torch.from_numpy(local)] = vals[torch.from_numpy(pos)]
        offset += n
    return list(servers.values())


def gather_shards(servers: list[Shard]) -> tuple[torch.Tensor, torch.Tensor]:
    """The full tables (weight, optimizer state) in global key order, copied from the shards."""
    k = len(servers)
    total = sum(s.weight.shape[0] for s in servers)
    weight = torch.empty(total, servers[0].weight.shape[1])
    state = torch.empty(total, servers[0].state.shape[1])
    for s in servers:
        weight[s.shard::k] = s.weight
        state[s.shard::k] = s.state
    return weight, state


def shard_tables(servers: list[Shard]) -> tuple[torch.Tensor, torch.Tensor]:
    """The full tables in global key order: one shard's own tensors (no copy: writing them
    writes the shard), else a copy gathered from the shards."""
    if len(servers) == 1:
        return servers[0].weight, servers[0].state
    return gather_shards(servers)


def scatter_to_shards(servers: list[Shard], weight: torch.Tensor, state: torch.Tensor) -> None:
    """Store full tables in global key order back into the shards (inverse of gather_shards)."""
    k = len(servers)
    for s in servers:
        if s.weight is not weight:  # not the shard itself (see shard_tables)
            s.weight.copy_(weight[s.shard::k])
        if s.state is not state:
            s.state.copy_(state[s.shard::k])


def hash_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across runs, unlike Python's hash)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def assemble_tables(servers: list[Shard], cardinalities: list[int]) -> list[torch.Tensor]:
    """Full per-table weights [n_t, dim] (for saving a model): views of a single shard,
    else gathered from the shards."""
    return list(torch.split(shard_tables(servers)[0], cardinalities))


def shards_from_tables(weight: torch.Tensor, state: torch.Tensor, num_shards: int) -> list[Shard]:
    """K shards holding the full tables `weight`/`state` in global key order (a checkpoint's)."""
    return [Shard.holding(k, num_shards, weight[k::num_shards].clone(),
                                    state[k::num_shards].clone()) for k in range(num_shards)]

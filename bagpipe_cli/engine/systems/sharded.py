"""sharded: the tables sharded row-wise across the trainers (model parallelism, as TorchRec's
and HugeCTR's row-wise sharding); no cache, and no server during training.

Row k is trainer (k mod N)'s. Row-wise, not table-wise: a skewed table's hot rows then
spread over every trainer, where a table-wise shard would put a hot table's whole load on
one trainer, and a table larger than a trainer's share still fits. Per iteration a trainer

1. sends each owner the ids its samples read from it (an all-to-all of the counts, then one
   of the ids), and reads its own rows in place;
2. receives those rows (an all-to-all of rows, the owners' answers);
3. after the backward, sends each owner its partial gradients of that owner's rows (an
   all-to-all of gradients);
4. as an owner, sums every trainer's partials of its rows in trainer order and applies the
   row optimizer: the arithmetic of sync's servers (`engine/distributed/server.py`'s
   `_apply`), so the parameters are bitwise sync's.

The embedding servers hold the tables only before training (each trainer fetches its shard,
not timed, as `local` fetches the tables) and after it (each writes its shard back).

With a hot set (`hot`: sharded-hot, engine/systems/sharded_hot.py: the rows whose sum costs
fewer bytes than their all-to-alls) every trainer also holds a replica of the hot rows: their partial gradients over U_b are summed among all trainers
(the exact collective: trainer order) and every trainer applies the same step, so only the
cold rows cross in the all-to-alls. A trainer then needs U_b (the plan's global view).

In-process every trainer is in one process: the tables are trained in place, each update
with the servers' arithmetic, and the communication is emulated: the collective holds the
caller for what each all-to-all would move over the emulated network, the busiest trainer's
share (`LocalCollective.move_rows`), and for the hot rows' sum, and counts those bytes.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from bagpipe_cli.engine.comm.shards import Shard, scatter_to_shards, shard_tables
from bagpipe_cli.engine.comm.transport import Transport
from bagpipe_cli.engine.planning.plans import IterPlan
from bagpipe_cli.engine.records.metrics import Step
from bagpipe_cli.engine.systems.base import SystemParts
from bagpipe_cli.engine.systems.pushing import _PushingSystem
from bagpipe_cli.engine.systems.tables import fetch_in_pieces, write_back_in_pieces
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet

KEY_BYTES = 8  # an id on the wire (int64)
VALUE_BYTES = 4  # a value of a row or of its gradient on the wire (float32)


def owner(keys: np.ndarray, n: int) -> np.ndarray:
    """The trainer that owns each row: row-wise, key mod N."""
    return keys % n


def requests(keys: np.ndarray, n: int, me: int) -> list[np.ndarray]:
    """`keys` (sorted, a trainer's own rows) split by owner; its own are not requested."""
    own = owner(keys, n)
    return [keys[own == j] if j != me else keys[:0] for j in range(n)]


def apply_summed(weight: torch.Tensor, state: torch.Tensor, local: torch.Tensor,
                 parts: list[tuple[torch.Tensor, torch.Tensor]], opt: RowOptimizer) -> None:
    """The servers' update: every part's gradients of rows at `local` indices summed from
    zero in the parts' (trainer) order, then one optimizer step per row."""
    total = torch.zeros(len(local), weight.shape[1], device=weight.device)
    for pos, g in parts:
        if len(pos):
            total.index_add_(0, pos, g)
    rows, new_state = opt.step(weight.index_select(0, local), state.index_select(0, local), total)
    weight.index_copy_(0, local, rows)
    if new_state.shape[1]:
        state.index_copy_(0, local, new_state)


class ShardedSystem(_PushingSystem):
    """Row-wise sharded tables (see the module docstring)."""

    partitioned = True  # every trainer holds rows of its own: each one's are checkpointed

    def __init__(self, transport: Transport, trainers: TrainerSet, total_rows: int,
                 servers: list[Shard] | None = None, device: str | torch.device = "cpu",
                 hot: np.ndarray | None = None):
        super().__init__(transport, trainers, device)
        self.n, self.me, self.servers = trainers.total, trainers.first, servers
        self.total_rows = total_rows
        self.hot = hot  # the replicated hot rows' keys, sorted (None: none)
        self._asked: list[torch.Tensor] | None = None  # ids each trainer asked of this owner
        self._cold = np.empty(0, np.int64)  # the cold rows this trainer read this iteration
        self._served: tuple[np.ndarray, np.ndarray] | None = None  # in-process: rows asked, served
        if servers is not None:  # in-process: the tables trained in place (see the docstring)
            self.own = None
            weight, state = shard_tables(servers)
        else:
            own = np.arange(self.me, total_rows, self.n)
            self.own = own if hot is None else own[~self.is_hot(own)]
            weight, state = fetch_in_pieces(transport, self.own, total_rows)
            if hot is not None:
                hw, hs = fetch_in_pieces(transport, hot, total_rows)
                self.hot_weight, self.hot_state = hw.to(self.device), hs.to(self.device)
        self.weight, self.state = weight.to(self.device), state.to(self.device)

    @classmethod
    def build(cls, p: SystemParts) -> ShardedSystem:
        return cls(p.transport, p.trainers, p.setup.total_rows, p.servers, p.device)

    def is_hot(self, keys: np.ndarray) -> np.ndarray:
        """Whether each of `keys` is a hot row."""
        if self.hot is None or not len(self.hot):
            return np.zeros(len(keys), bool)
        pos = np.minimum(np.searchsorted(self.hot, keys), len(self.hot) - 1)
        return self.hot[pos] == keys

    def _local(self, keys: np.ndarray, among: np.ndarray | None = None) -> torch.Tensor:
        """Positions of `keys` in this trainer's tensors: of its shard's (or `among`'s)."""
        among = self.own if among is None else among
        pos = keys if among is None else np.searchsorted(among, keys)
        return torch.from_numpy(np.ascontiguousarray(pos)).to(self.device)

    def view(self, plan: IterPlan) -> tuple[np.ndarray, np.ndarray]:
        if self.hot is not None:  # the hot rows' sum is over U_b: every trainer's view
            return plan.uniq, self.trainers.inverse(plan)
        return super().view(plan)

    # ------------------------------------------------------------------ one process

    def _emulate(self, step: Step, sent: np.ndarray, received: np.ndarray, width: int) -> None:
        """In-process: one all-to-all's time and bytes (`move_rows`), `width` bytes a row."""
        t0 = time.perf_counter()
        self.collective.move_rows(sent, received, width)
        step.times["prefetch_wait"] += time.perf_counter() - t0

    def _moves(self, step: Step) -> tuple[np.ndarray, np.ndarray]:
        """In-process: per trainer, the rows it asks of others and those others ask of it."""
        plan, n = step.plan, self.n
        asked, served = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i in range(n):
            mine = np.unique(plan.uniq[plan.accesses_of(i, 1, n)])
            mine = mine[~self.is_hot(mine)]
            own = owner(mine, n)
            asked[i] = int((own != i).sum())
            served += np.bincount(own[own != i], minlength=n)
        return asked, served

    # ------------------------------------------------------------------ reads and updates

    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        if self.own is None:
            asked, served = self._moves(step) if self.n > 1 else (np.zeros(1, np.int64),) * 2
            row = VALUE_BYTES * self.weight.shape[1]
            peers = np.full(self.n, self.n - 1)
            self._emulate(step, peers, peers, KEY_BYTES)  # the counts of ids
            self._emulate(step, asked, served, KEY_BYTES)  # ids to the owners
            self._emulate(step, served, asked, row)  # rows back
            step.rows_fetched = step.rows_written_back = int(asked.sum())  # and their partials
            self._served = (asked, served)
            return self.weight.index_select(0, self._local(keys)).index_select(0, index)
        if self.hot is None:
            return self._read_sharded(step, keys).to(self.device).index_select(0, index)
        mine = keys[torch.unique(index).cpu().numpy()]  # U_b's rows this trainer reads
        hot = self.is_hot(mine)
        self._cold = mine[~hot]
        rows = torch.zeros(len(keys), self.weight.shape[1])
        at = np.searchsorted(keys, mine)
        rows[torch.from_numpy(at[~hot])] = self._read_sharded(step, self._cold)
        rows[torch.from_numpy(at[hot])] = self.hot_weight.index_select(
            0, self._local(mine[hot], self.hot)).cpu()
        return rows.to(self.device).index_select(0, index)

    def _read_sharded(self, step: Step, keys: np.ndarray) -> torch.Tensor:
        """A trainer rank: its own rows in place, the others' through two all-to-alls."""
        t0 = time.perf_counter()
        coll, n = self.collective, self.n
        req = requests(keys, n, self.me)
        counts = coll.exchange([torch.tensor([[len(r)]], dtype=torch.int64) if j != self.me
                                else torch.empty(0, 1, dtype=torch.int64) for j, r in enumerate(req)],
                               [1 if j != self.me else 0 for j in range(n)])
        counts = [int(c[0, 0]) if len(c) else 0 for c in counts]
        asked = coll.exchange([torch.from_numpy(r).view(-1, 1) for r in req], counts)
        self._asked = [a.view(-1).cpu() for a in asked]
        answers = coll.exchange([self.weight.index_select(0, self._local(a.numpy())).cpu()
                                 for a in self._asked], [len(r) for r in req])
        rows = torch.empty(len(keys), self.weight.shape[1])
        own = owner(keys, n)
        rows[torch.from_numpy(own == self.me)] = self.weight.index_select(
            0, self._local(keys[own == self.me])).cpu()
        for j, r in enumerate(req):
            if len(r):
                rows[torch.from_numpy(own == j)] = answers[j]
        step.rows_fetched = step.rows_written_back = sum(len(r) for r in req)  # and their partials
        step.times["prefetch_wait"] += time.perf_counter() - t0
        return rows

    def push(self, step: Step, keys: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        if self.own is None:
            if self.n > 1:
                asked, served = self._served
                self._emulate(step, asked, served, VALUE_BYTES * self.weight.shape[1])  # gradients
                if self.hot is not None:  # the hot rows' sum among the trainers
                    hot = torch.from_numpy(self.is_hot(keys)).to(grad.device)
                    self.collective.start_sum(grad[hot]).result()
            local = self._local(keys)
            apply_summed(self.weight, self.state, local,
                         [(torch.arange(len(keys), device=self.device), grad.to(self.device))], opt)
            return
        if self.hot is None:
            self._push_sharded(step, keys, grad, opt)
            return
        hot = torch.from_numpy(self.is_hot(keys))
        g_hot = self.collective.start_sum(grad[hot]).result()  # every trainer's, in trainer order
        apply_summed(self.hot_weight, self.hot_state, self._local(keys[hot.numpy()], self.hot),
                     [(torch.arange(len(g_hot), device=self.device), g_hot.to(self.device))], opt)
        self._push_sharded(step, self._cold, grad[torch.from_numpy(np.searchsorted(keys, self._cold))], opt)

    def _push_sharded(self, step: Step, keys: np.ndarray, grad: torch.Tensor,
                      opt: RowOptimizer) -> None:
        """A trainer rank: partials to the owners, then this owner's rows summed in trainer
        order and stepped."""
        t0 = time.perf_counter()
        n, grad = self.n, grad.cpu()
        own = owner(keys, n)
        parts = [grad[torch.from_numpy(own == j)] if j != self.me else grad[:0] for j in range(n)]
        got = self.collective.exchange(parts, [len(a) for a in self._asked])
        got[self.me] = grad[torch.from_numpy(own == self.me)]
        ids = [a if j != self.me else torch.from_numpy(keys[own == self.me])
               for j, a in enumerate(self._asked)]
        mine = torch.unique(torch.cat(ids))
        apply_summed(self.weight, self.state, self._local(mine.numpy()).to(self.device),
                     [(torch.searchsorted(mine, k).to(self.device), g.to(self.device))
                      for k, g in zip(ids, got, strict=True)], opt)
        step.times["sync"] += time.perf_counter() - t0

    # ------------------------------------------------------------------ the end

    def flush(self) -> None:
        if self.own is None:
            if self.servers is not None:
                scatter_to_shards(self.servers, self.weight, self.state)
            return
        write_back_in_pieces(self, self.own, self.weight, self.state, self.total_rows)
        if self.hot is not None:  # trainer 0's replica (the others': as many empty requests)
            keep = self.hot if self.me == 0 else self.hot[:0]
            write_back_in_pieces(self, keep, self.hot_weight, self.hot_state, self.total_rows)
        super().flush()

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        keys = np.arange(self.weight.shape[0]) if self.own is None else self.own
        w, s = self.weight.cpu().clone(), self.state.cpu().clone()
        if self.own is None or self.hot is None or self.me != 0:
            return keys, w, s
        keys = np.concatenate([keys, self.hot])  # trainer 0 holds the hot rows' newest too
        order = np.argsort(keys, kind="stable")
        return (keys[order], torch.cat([w, self.hot_weight.cpu()])[order],
                torch.cat([s, self.hot_state.cpu()])[order])

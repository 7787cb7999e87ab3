"""sharded-hot: sharded, plus the hot rows replicated on every trainer (the pattern-aware
sparse communication of the PPoPP'24 poster): the hot rows' gradients are summed among all
trainers in trainer order, and only the cold rows cross in the all-to-alls.

The hot set is the rows for which that sum moves fewer bytes than the all-to-alls would
(`rows_that_pay`, the inequality there): a row many trainers read in a batch crosses the
all-to-alls once per reader, and the sum's cost does not grow with its readers; the set is
then cut to what lowers the bytes of the busiest trainer, which the all-to-alls wait for. It is measured over the run's
first --hot-sample share of batches, which every process reads alike, so every trainer
(and `bagpipe simulate`, `simulate/sharded.py`) finds the same set. --cache-rows is not
read: the set's size is what the break-even gives. The mechanism is `sharded.py`'s (its
`hot`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice

import numpy as np

from bagpipe_cli.engine.planning.feed import key_batches
from bagpipe_cli.engine.systems.base import SystemParts
from bagpipe_cli.engine.systems.sharded import KEY_BYTES, VALUE_BYTES, ShardedSystem
from bagpipe_cli.policies.decisions import profiled_batches


def rows_that_pay(batches: Callable[[], Iterable[np.ndarray]], iterations: int,
                  hot_sample: float, trainers: int, row_dim: int, total_rows: int) -> np.ndarray:
    """The hot set, a mask over the rows: the rows whose gradients' sum among the trainers
    moves fewer bytes than the all-to-alls would move for them.

    `batches()` yields the run's global keys [B*T] (trainer i: samples [i B/N, (i+1) B/N));
    the first P = ceil(hot_sample * iterations) of them (at least 1) are profiled, twice.
    With N trainers, G = VALUE_BYTES * row_dim bytes a row (its float32 values, or its
    gradient's), m_b(k) the trainers other than k's owner (k mod N) whose samples read row
    k in batch b, and n(k) the profiled batches whose U_b holds k, row k pays when

        (KEY_BYTES + 2 G) * sum_b m_b(k)  >  2 (N - 1) G * n(k)          (`pays`)

    Left, the all-to-alls' bytes for k, over all the trainers: each reader but the owner
    sends its id (8 B) and, after the backward, its partial gradient (G), and the owner
    sends it the row (G). Right, the sum's: a ring moves 2(N-1)/N of a row per trainer for
    each hot row of U_b, 2(N-1) G over the N trainers. Both sides over N are the bytes per
    trainer. A row read by every trainer (m = N - 1) pays at any N > 1, by 8 (N-1)/N bytes
    a trainer (the ids: the rows and the gradients cost the same 2(N-1)/N G in both); one
    read by one trainer (m <= 1) never does at N >= 3 (8 + 2G <= 4G as G >= 4), but does at
    N = 2 (the sum moves G per trainer, the all-to-alls G + 4 on average); at equality a
    row stays cold. At N = 1 none does.

    The all-to-alls last as long as their busiest trainer's share (`simulate/model.py`), not
    the average, so the set is then the prefix of the rows that pay, ranked by what they
    save (the left side less the right; ties by key), of all of them, half, a quarter, ...,
    one or none, that moves the fewest bytes over the profiled batches as the model counts
    them: sum_b N (KEY_BYTES + 2 G) A_b + 2 (N - 1) G |hot & U_b|, A_b the most rows a
    trainer asks or serves in batch b (ties: the smaller set). None is sharded's, so over
    the profiled batches sharded-hot never moves more than sharded.
    """
    n, g = trainers, VALUE_BYTES * row_dim
    profiled = profiled_batches(iterations, hot_sample)
    readers = np.zeros(total_rows, np.int32)  # sum_b m_b(k)
    present = np.zeros(total_rows, np.int32)  # n(k)
    for keys in islice(batches(), profiled):
        rows, times = np.unique(_away(keys, n)[0], return_counts=True)
        readers[rows] += times.astype(np.int32)
        present[np.unique(keys)] += 1
    saving = pays(readers, present, n, g)
    ranked = np.flatnonzero(saving > 0)
    if not len(ranked):
        return saving > 0
    ranked = ranked[np.argsort(-saving[ranked], kind="stable")]
    rank = np.full(total_rows, len(ranked), np.int32)  # a row's place in `ranked`
    rank[ranked] = np.arange(len(ranked))
    sizes = sorted({len(ranked) >> j for j in range(len(ranked).bit_length() + 1)})
    moved = np.zeros(len(sizes), np.int64)
    for keys in islice(batches(), profiled):
        k, t = _away(keys, n)
        r, ru = rank[k], rank[np.unique(keys)]
        for c, size in enumerate(sizes):
            cold = r >= size
            busiest = max(np.bincount(t[cold], minlength=n).max(), np.bincount(k[cold] % n, minlength=n).max())
            moved[c] += n * (KEY_BYTES + 2 * g) * int(busiest) + 2 * (n - 1) * g * int((ru < size).sum())
    return rank < sizes[int(np.argmin(moved))]


def pays(readers: np.ndarray, present: np.ndarray, trainers: int, row_bytes: int) -> np.ndarray:
    """Per row, the bytes its sum saves over its all-to-alls, over every trainer (> 0: it
    pays; see `rows_that_pay`): (KEY_BYTES + 2 G) sum_b m_b - 2 (N - 1) G n."""
    return ((KEY_BYTES + 2 * row_bytes) * readers.astype(np.int64)
            - 2 * (trainers - 1) * row_bytes * present.astype(np.int64))


def _away(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows each trainer reads of another's shard in one batch: (keys, trainer), each
    trainer's rows once."""
    per = len(keys) // n
    mine = [np.unique(keys[i * per:(i + 1) * per]) for i in range(n)]
    k = np.concatenate(mine)
    t = np.repeat(np.arange(n), [len(m) for m in mine])
    away = k % n != t
    return k[away], t[away]


def hot_set(p: SystemParts) -> np.ndarray:
    """The hot rows' keys, sorted: the rows that pay of the run (see the module docstring)."""
    s = p.setup
    return np.flatnonzero(rows_that_pay(
        lambda: key_batches(s.ds, s.cfg, s.train_rows, s.offsets), s.cfg.iterations, s.cfg.hot_sample,
        p.trainers.total, s.row_dim, s.total_rows)).astype(np.int64)


def sharded_hot_system(p: SystemParts) -> ShardedSystem:
    return ShardedSystem(p.transport, p.trainers, p.setup.total_rows, p.servers, p.device,
                         hot=hot_set(p))

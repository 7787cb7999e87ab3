"""Rank 0's plans: the bytes it sends (each round's plan, as a `--procs` / torchrun run's rank
0 sends it), and the pipeline stages of sending them (`plan_stages`).

A round's plan crosses as `engine/distributed/rounds.py`'s `shared_round` of the planner's
RoundPlan, or, a partitioned cache's (bagpipe, N > 1), as each trainer's own
(`trainer_round`), encoded by `engine/distributed/wire.py` (a length, a pickle, large arrays
raw). Its bytes are the arrays' bytes, which grow with the rows, plus a fixed part (the
pickled RoundPlan and IterPlans, each array's header, the length), measured on encoded
rounds. `tests/test_simulate.py` holds these formulas equal to `wire.encode` of real rounds
(to a few bytes) and to the bytes real runs count. With `kb` the bytes of a key (4 where
every row's key fits int32, else 8), a slot 4 bytes, a row's user 2, its LRPP class 1, and
`ib` the bytes of a trainer's index (1 where N <= 127, else 2):

    lookahead (prefetch, bagpipe at N = 1)
                          800 + 267 C + F (kb + 6) + sum_b [U_b (kb + 7) + E_b (kb + 4) + 16 N]
    trainer i's own (bagpipe, N > 1; rank 0 sends the N of them)
                          818 + 331 C + sum_b [X_ib kb + S_ib (1 + 3 ib) + P_ib ib + E_ib kb + 16 N]
    policy planner        888 + (F + V + U + E) (kb + 4) + 8          (one iteration a round)
                          456 + R (kb + 4)       the last round: every resident row written back
    global view (het, local)   798 + U kb + 16 N                      (one iteration a round)
    no global view (sync)      776 + 16 N
    the end of the plans       31   (to each trainer where each gets its own plans)

F: rows fetched in the round (C iterations), V: pre-evicted rows, U_b = |U_b|, E_b: rows
evicted after b, R: rows resident at the end, N trainers; 16 N: two arrays of N int64s per
iteration (`no_sync_owner_rows`, `private_fetched`). A trainer's own plan of a partitioned
round (engine/planning/partition.py) sends no slots, no owners and no fetched rows (each
trainer's slots are its own; it finds its fetches in its rows' sources): per iteration
S_ib, the rows trainer i needs (those it reads, and those it is home of before or after
b), each with its LRPP class (1), its count of writers, home and source (an index each);
the keys of X_ib of them, those it does not read (it finds the others' in its own samples);
P_ib of the (row, writer) pairs, a writer each (every pair of a row it is home of, its own
of the others); and E_ib, the evicted rows it is home of.

Rank 0 plans each round and sends it to trainer 0, which passes it on to trainers 1 and 2,
and so on down a binary tree (`engine/distributed/relay.py`), or sends each trainer its own
plan. Rank 0's sender thread sends round r while its main thread plans round r + 1
(`engine/distributed/planner.py`), and rounds travel ahead of use, so the planning, rank
0's link and the relay are three pipeline stages: `plan_stages` gives their time per
iteration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from bagpipe_cli.engine.planning.plans import RoundPlan
    from bagpipe_cli.simulate.inputs import Cluster, Volumes

INT32_KEYS = 2**31 - 1  # rounds.key_dtype: int32 keys where every row's key fits

SLOT = 4  # int32 cache slot of a row
OWNER = 2  # int16 one trainer using a row (bagpipe)
ROW_CLASS = 1  # int8 LRPP class of a row (bagpipe)
PER_TRAINER = 16  # no_sync_owner_rows + private_fetched: N int64s each, per iteration

# The fixed part of an encoded round (bytes), measured on wire.encode(shared_round(...)).
LOOKAHEAD_ROUND = 800
LOOKAHEAD_ITER = 267
UNCLASSED_ITER = 181  # an iteration without LRPP classes and users (prefetch)
# A trainer's own round of a partitioned cache (bagpipe, N > 1), measured on
# wire.encode(trainer_round(...)): no slots, a Partition of its rows an iteration.
TRAINER_ROUND = 818
TRAINER_ITER = 331
ROW_IDS = 3  # its count of writers, home and source: a trainer's index each
POLICY_ROUND = 888  # a policy round: always one iteration
POLICY_LAST = 456  # the write-back round after the last iteration (no iterations)
VIEW_ROUND = 798  # U_b and nothing else
COUNT_ROUND = 776  # |U_b| alone
END = 31  # the None that ends the plans
RELAY_FANOUT = 2  # engine/distributed/relay.py's FANOUT (a test holds them equal): the trainers
#                   a trainer passes each plan on to


def key_bytes(total_rows: int) -> int:
    """Bytes of a key on the wire."""
    return 4 if total_rows <= INT32_KEYS else 8


def lookahead_round(kb: int, trainers: int, fetched: int, uniq: list[int], evicted: list[int],
                    lrpp: bool = True) -> int:
    """A lookahead round sent whole: its fetched rows (with slot and owner), and per iteration
    U_b (with slot, and with LRPP class and owner) and the evicted rows (with slot)."""
    per_row, per_iter = (ROW_CLASS + OWNER, LOOKAHEAD_ITER) if lrpp else (0, UNCLASSED_ITER)
    return (LOOKAHEAD_ROUND + per_iter * len(uniq) + fetched * (kb + SLOT + OWNER)
            + sum(uniq) * (kb + SLOT + per_row) + sum(evicted) * (kb + SLOT)
            + PER_TRAINER * trainers * len(uniq))


def id_bytes(trainers: int) -> int:
    """Bytes of a trainer's index (and of a row's count of writers) on the wire."""
    return 1 if trainers <= 127 else 2


def trainer_rounds(kb: int, trainers: int, sizes: list[tuple[np.ndarray, ...]]) -> np.ndarray:
    """[N] the bytes of each trainer's own plan of a partitioned round (bagpipe, N > 1);
    `sizes`: per iteration, `rounds.trainer_sizes` ([N] rows, keys, pairs, evicted rows)."""
    ib = id_bytes(trainers)
    rows, keys, pairs, evicted = (sum(s[k] for s in sizes) for k in range(4))
    return (TRAINER_ROUND + (TRAINER_ITER + PER_TRAINER * trainers) * len(sizes)
            + (keys + evicted) * kb + rows * (ROW_CLASS + ROW_IDS * ib) + pairs * ib)


def lookahead_plans(kb: int, trainers: int, rp: RoundPlan, lrpp: bool = True,
                    own: np.ndarray | None = None) -> int:
    """Rank 0's bytes of a lookahead round: its whole plan (`lookahead_round`), or, given
    `own` (`Volumes.plan_trainer_bytes`: each trainer gets its own), the sum of the trainers'
    (`trainer_rounds`), the largest of them recorded in `own` at the round's first iteration."""
    if own is None:
        return lookahead_round(kb, trainers, len(rp.fetch_keys), [len(p.uniq) for p in rp.iters],
                               [len(p.evict_keys) for p in rp.iters], lrpp)
    from bagpipe_cli.engine.distributed.shares import trainer_sizes

    each = trainer_rounds(kb, trainers, [trainer_sizes(p, trainers) for p in rp.iters])
    own[rp.iters[0].b] = each.max()
    return int(each.sum())


def policy_round(kb: int, fetched: int, pre_evicted: int, uniq: int, evicted: int) -> int:
    """A policy planner's round of one iteration: every list with its slots."""
    return POLICY_ROUND + (fetched + pre_evicted + uniq + evicted) * (kb + SLOT) + 8


def policy_last(kb: int, resident: int) -> int:
    """The round after the last iteration: every resident row written back."""
    return POLICY_LAST + resident * (kb + SLOT)


def view_round(kb: int, trainers: int, uniq: int) -> int:
    """A round of one iteration of a system without a planned cache: U_b (het, local)."""
    return VIEW_ROUND + uniq * kb + PER_TRAINER * trainers


def count_round(trainers: int) -> int:
    """A round of one iteration that carries |U_b| alone (sync)."""
    return COUNT_ROUND + PER_TRAINER * trainers


def bytes_per_iteration(vol: Volumes) -> float:
    """Rank 0's plan bytes per iteration of the run (what a run's traffic counts)."""
    sent = 0 if vol.plan_bytes is None else int(vol.plan_bytes.sum())
    return (sent + vol.plan_end_bytes) / max(1, vol.iterations)


def plan_stages(vol: Volumes, cluster: Cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per iteration, in seconds, three stages: rank 0's planning (the batch's, with the making
    of its trainers' own plans), rank 0's link (its share of sending its round's plans, a CPU
    machine's link as the servers'; on its sender thread, beside the planning) and the
    busiest trainer's on its own link (relayed: its share of sending the round's plan on to
    its children; each trainer its own plan: the largest one's receiving it). Without
    `cluster.plans_on_network` (a --procs run: loopback) the planning alone."""
    I = vol.iterations  # noqa: E741 - the paper's symbol
    oracle, send, relay = np.full(I, vol.plan_ms * 1e-3), np.zeros(I), np.zeros(I)
    if vol.plan_bytes is None or not I or not cluster.plans_on_network:
        return oracle, send, relay
    link, relay_link = cluster.network, cluster.trainer_network
    copies = min(RELAY_FANOUT, cluster.trainers - 1)  # trainer 0's children
    starts = np.flatnonzero(vol.round_start)
    if not len(starts) or starts[0] != 0:
        starts = np.concatenate([[0], starts])
    for a, b in zip(starts, [*starts[1:], I], strict=True):
        nbytes = int(vol.plan_bytes[a:b].sum())
        if nbytes:
            send[a:b] += link.transfer_seconds(nbytes) / (b - a)
            if vol.plan_trainer_bytes is None:
                relay[a:b] += copies * relay_link.transfer_seconds(nbytes) / (b - a)
            else:
                own = int(vol.plan_trainer_bytes[a:b].sum())
                relay[a:b] += relay_link.transfer_seconds(own) / (b - a)
    return oracle, send, relay

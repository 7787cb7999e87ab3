"""What rank 0 sends a trainer each round: only what that trainer reads, in the narrowest dtype.

Of a round's plan a trainer reads: the rows it fetches (`RoundPlan.fetch_for`: the others'
private rows left out), the victims, and per iteration U_b, the slots, the LRPP classes,
the one user of each private row, the evictions, and the positions in U_b of *its own*
accesses only (1/N of the inverse). Keys travel as int32 where the key space fits
(`narrow`), a row's user as int16, labels (0/1) as uint8; the trainer widens them back
(`widen`), so it computes on exactly the values in-process training does. Rank 0's bytes
per iteration then grow with N only by the U_b-sized parts every replicated trainer needs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from bagpipe_cli.engine.feed import Round, Samples
from bagpipe_cli.engine.oracle import IterPlan, RoundPlan

_KEYS = ("uniq", "evict_keys")  # IterPlan's key arrays
_ROUND_KEYS = ("fetch_keys", "pre_evict_keys")


def key_dtype(total_rows: int) -> type:
    """The narrowest integer type of a global row key."""
    return np.int32 if total_rows <= np.iinfo(np.int32).max else np.int64


def narrow(rp: RoundPlan, batches: list[Samples], i: int, n: int, keys: type) -> tuple:
    """Trainer i of n's part of a round: (its RoundPlan, its samples' dense, its labels)."""
    per = len(batches[0].labels) // n if batches else 0  # a last round may have no iterations
    lo, hi = i * per, (i + 1) * per
    fk, fs = rp.fetch_for(i)
    part = replace(rp, fetch_keys=fk.astype(keys), fetch_slots=fs, fetch_owner=None,
                   pre_evict_keys=rp.pre_evict_keys.astype(keys),
                   iters=[_narrow_iter(p, i, n, keys) for p in rp.iters])
    return part, [b.dense[lo:hi] for b in batches], [b.labels[lo:hi].astype(np.uint8) for b in batches]


def _narrow_iter(p: IterPlan, i: int, n: int, keys: type) -> IterPlan:
    out = replace(p, inverse=p.accesses_of(i, 1, n), inverse_of_trainers=(i, 1),
                  uniq=p.uniq.astype(keys), evict_keys=p.evict_keys.astype(keys))
    if p.owner is not None:
        out.owner = p.owner.astype(np.int16)
    return out


def widen(msg: tuple[RoundPlan, list[np.ndarray], list[np.ndarray]]) -> Round:
    """A trainer's Round from rank 0's message: keys back to int64, labels to float32."""
    rp, dense, labels = msg
    for name in _ROUND_KEYS:
        setattr(rp, name, getattr(rp, name).astype(np.int64))
    for p in rp.iters:
        for name in _KEYS:
            setattr(p, name, getattr(p, name).astype(np.int64))
    return Round(rp, list(dense), [y.astype(np.float32) for y in labels])


"""Which of a run's data-parallel trainers one process runs, and what follows from that.

In-process a process runs every trainer; on a torch.distributed trainer rank, one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bagpipe_cli.engine.planning.plans import IterPlan


@dataclass(frozen=True)
class TrainerSet:
    """The data-parallel trainers one process runs: `first`..`first + count - 1` of `total`.

    Trainer i trains samples [i B/N, (i+1) B/N) of every global batch.
    """

    first: int
    count: int
    total: int

    @classmethod
    def everyone(cls, n: int) -> TrainerSet:
        return cls(0, n, n)

    @classmethod
    def one(cls, i: int, n: int) -> TrainerSet:
        return cls(i, 1, n)

    @property
    def all(self) -> bool:
        return self.count == self.total

    def indices(self) -> range:
        return range(self.first, self.first + self.count)

    def inverse(self, plan: IterPlan) -> np.ndarray:
        """The positions in U_b of this set's accesses (its samples' rows, sample by sample)."""
        return plan.accesses_of(self.first, self.count, self.total)

    def owns(self, trainer: np.ndarray) -> np.ndarray:
        """Which entries of an array of trainer indices are trainers of this set."""
        return (trainer >= self.first) & (trainer < self.first + self.count)

    def shares(self, keys: np.ndarray) -> np.ndarray:
        """Which evicted `keys` this set writes back (trainer `key % N` writes a shared row)."""
        if self.all:
            return np.ones(len(keys), dtype=bool)
        return self.owns(np.asarray(keys) % self.total)

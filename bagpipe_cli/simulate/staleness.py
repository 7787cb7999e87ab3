"""het's staleness rule as `simulate/volumes.py` replays it on a trace."""

from __future__ import annotations

import numpy as np


class HetState:
    """HetSystem's rule: a trainer refetches a row it has not cached or whose copy lags
    the servers' version by more than `staleness`; every row of U_b gets one version more."""

    def __init__(self, total: int, trainers: int, staleness: int):
        self.version = np.zeros(total, np.int32)
        self.cached = np.full((trainers, total), -1, np.int32)  # cached version, -1: not cached
        self.n, self.s = trainers, staleness

    def step(self, keys: np.ndarray, uniq: np.ndarray) -> list[np.ndarray]:
        per = len(keys) // self.n
        needs = []
        for i in range(self.n):
            kk = np.unique(keys[i * per:(i + 1) * per])
            cv = self.cached[i, kk]
            need = (cv < 0) | (self.version[kk] - cv > self.s)
            nk = kk[need]
            self.cached[i, nk] = self.version[nk]
            needs.append(nk)
        self.version[uniq] += 1
        return needs

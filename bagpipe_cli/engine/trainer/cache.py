"""The trainer's row cache: preallocated storage for rows and their optimizer state.

Slots are assigned by the oracle (its key -> slot map), so the trainer never searches:
it inserts a round's prefetched rows at their slots, reads and updates an iteration's
rows by slot, and reads evicted rows by slot to write them back.
"""

from __future__ import annotations

import numpy as np
import torch


class RowCache:
    """`capacity` rows of width `dim` plus `state_dim` floats of optimizer state each."""

    def __init__(self, capacity: int, dim: int, state_dim: int, device: str = "cpu"):
        self.capacity = capacity
        self.weight = torch.zeros(capacity, dim, device=device)
        self.state = torch.zeros(capacity, state_dim, device=device)

    def grow(self, capacity: int) -> None:
        """Room for `capacity` rows: the rows held keep their slots."""
        if capacity <= self.capacity:
            return
        for name in ("weight", "state"):
            old = getattr(self, name)
            new = torch.zeros(capacity, old.shape[1], device=old.device)
            new[:self.capacity] = old
            setattr(self, name, new)
        self.capacity = capacity

    def insert(self, slots: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> None:
        idx = torch.from_numpy(slots.astype(np.int64)).to(self.weight.device)
        self.weight.index_copy_(0, idx, rows.to(self.weight.device))
        if self.state.shape[1]:
            self.state.index_copy_(0, idx, state.to(self.weight.device))

    def read(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(slots.astype(np.int64)).to(self.weight.device)
        return self.weight.index_select(0, idx), self.state.index_select(0, idx)

    def write(self, slots: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> None:
        self.insert(slots, rows, state)

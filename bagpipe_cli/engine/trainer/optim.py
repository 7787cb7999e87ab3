"""Embedding-row optimizers as pure functions over gathered rows.

Every system applies the same function to the same rows (gathered from a cache, a server or
a local table) in the same order, which is what makes Bagpipe's parameters bitwise equal to
synchronous training's. The function is elementwise operations only (no reductions, no fused
multiply-adds), so it rounds the same on every device: sync updates rows on the servers'
CPU, bagpipe in a GPU cache. The state of a row (row-wise Adagrad's accumulator) is stored next
to the row and moves with it between servers and caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bagpipe_cli.errors import ConfigError

EMB_OPTIMIZERS = ("sgd", "adagrad")


@dataclass(frozen=True)
class RowOptimizer:
    """SGD, or row-wise Adagrad (one accumulator per row, as FBGEMM's EXACT_ROWWISE_ADAGRAD)."""

    name: str = "sgd"  # sgd | adagrad
    lr: float = 0.1  # learning rate of the embedding rows
    eps: float = 1e-8  # Adagrad's denominator epsilon
    initial_accumulator: float = 0.0  # Adagrad's initial state

    def __post_init__(self) -> None:
        if self.name not in EMB_OPTIMIZERS:
            raise ConfigError(f"--optimizer {self.name!r}: choose one of {', '.join(EMB_OPTIMIZERS)}")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be > 0 (got {self.lr})")

    @property
    def state_dim(self) -> int:
        """Floats of optimizer state stored with every row."""
        return 1 if self.name == "adagrad" else 0

    def init_state(self, rows: int) -> torch.Tensor:
        return torch.full((rows, self.state_dim), self.initial_accumulator, dtype=torch.float32)

    def step(self, rows: torch.Tensor, state: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New (rows, state) after one step with the summed gradient `grad` of each row."""
        if self.name == "sgd":
            return rows - self.lr * grad, state
        new_state = state + mean_square(grad)
        return rows - self.lr * grad / (new_state.sqrt() + self.eps), new_state


def mean_square(g: torch.Tensor) -> torch.Tensor:
    """The mean of each row's squares, [n, 1], summed pairwise in a fixed order by elementwise
    additions: a reduction kernel adds in an order of its own, different on a CPU and a GPU,
    while an addition of two floats rounds the same everywhere, so a row updated on a server's
    CPU equals the same row updated in a GPU cache."""
    s = g * g
    while s.shape[1] > 1:
        if s.shape[1] % 2:  # an odd column count: a zero column (x + 0 == x for squares)
            s = torch.cat([s, s.new_zeros(s.shape[0], 1)], dim=1)
        s = s[:, 0::2] + s[:, 1::2]
    return s / g.shape[1]

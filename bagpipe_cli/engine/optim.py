"""Embedding-row optimizers as pure functions over gathered rows.

Every system applies the same function to the same rows (gathered from a cache, a server or
a local table) in the same order, which is what makes Bagpipe's parameters bitwise equal to
synchronous training's. The state of a row (row-wise Adagrad's accumulator) is stored next
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
        new_state = state + grad.square().mean(dim=1, keepdim=True)
        return rows - self.lr * grad / (new_state.sqrt() + self.eps), new_state

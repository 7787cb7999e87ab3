"""Deep & Cross Network (Wang et al., "Deep & Cross Network for Ad Click Predictions", 2017)."""

from __future__ import annotations

import math

import torch
from torch import nn

from bagpipe_cli.models.common import ModelConfig, linear, mlp, mlp_footprint, register


@register("dcn")
class DCN(nn.Module):
    """DCN's dense part: forward(dense [B, D], emb [B, T, E]) -> logits [B].

    - x0 = concat(emb flattened [B, T*E], dense), width d = T*E + D;
    - cross network: x_{l+1} = x0 * (x_l . w_l) + b_l + x_l for l < cross_layers, with
      w_l, b_l vectors of width d;
    - deep network, in parallel: an MLP x0 -> top_mlp, ReLU after every layer;
    - logit = linear(concat(cross output, deep output)) -> 1.
    """

    first_order = False  # rows are E wide (see row_dim)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.num_tables * cfg.emb_dim + cfg.num_dense
        # Uniform like nn.Linear(d, 1)'s default for w; zero b, so each layer starts near
        # x_{l+1} = x_l + small correction.
        bound = 1.0 / math.sqrt(d)
        self.cross_w = nn.Parameter(torch.empty(cfg.cross_layers, d).uniform_(-bound, bound))
        self.cross_b = nn.Parameter(torch.zeros(cfg.cross_layers, d))
        self.deep = mlp(d, cfg.top_mlp)
        self.out = linear(d + (cfg.top_mlp[-1] if cfg.top_mlp else 0), 1)

    @classmethod
    def footprint(cls, cfg: ModelConfig) -> tuple[int, int]:
        """(parameters, floats kept per sample): every cross layer's input and its dot product,
        the deep MLP's activations (its input is x0, the first cross layer's), the output
        layer's input."""
        d, n = cfg.num_tables * cfg.emb_dim + cfg.num_dense, cfg.cross_layers
        params, kept = mlp_footprint(d, cfg.top_mlp)
        n_out = d + (cfg.top_mlp[-1] if cfg.top_mlp else 0)
        return 2 * n * d + params + n_out + 1, n * (d + 1) + kept + n_out

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        x0 = torch.cat([emb.flatten(1), dense], dim=1)
        x = x0
        # A loop over the (few) layers, not over tables: each step is whole-batch tensor ops.
        for w, b in zip(self.cross_w, self.cross_b, strict=True):
            x = torch.addcmul(x + b, x0, (x @ w).unsqueeze(1))
        parts = [x, self.deep(x0)] if self.cfg.top_mlp else [x]
        return self.out(torch.cat(parts, dim=1)).squeeze(1)

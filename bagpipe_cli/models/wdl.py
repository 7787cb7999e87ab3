"""Wide & Deep (Cheng et al., "Wide & Deep Learning for Recommender Systems", 2016)."""

from __future__ import annotations

import torch
from torch import nn

from bagpipe_cli.models.common import ModelConfig, dense_linear, mlp, mlp_footprint, register


@register("wdl")
class WideAndDeep(nn.Module):
    """Wide & Deep's dense part: forward(dense [B, D], emb [B, T, E+1]) -> logits [B].

    Each row is [v (E), w (1)]: w is the id's wide (linear) weight, kept in the embedding
    row so the engine caches and updates it with v.

    - wide: sum_t w_t + a linear term over the dense features;
    - deep: an MLP over concat(v flattened [B, T*E], dense) -> top_mlp -> 1;
    - logit = wide + deep (the deep output layer's bias is the model's bias).

    The paper's wide part also takes hand-made cross-product features; here it is the
    per-id linear part only, as in common CTR benchmarks.
    """

    first_order = True  # rows are E+1 wide (see row_dim)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wide_dense = dense_linear(cfg.num_dense)
        n_deep = cfg.num_tables * cfg.emb_dim + cfg.num_dense
        self.deep = mlp(n_deep, (*cfg.top_mlp, 1), relu_last=False)

    @classmethod
    def footprint(cls, cfg: ModelConfig) -> tuple[int, int]:
        """(parameters, floats kept per sample): the dense features (the wide term's input),
        the deep MLP's input and activations."""
        n_deep = cfg.num_tables * cfg.emb_dim + cfg.num_dense
        params, kept = mlp_footprint(n_deep, (*cfg.top_mlp, 1), relu_last=False)
        return params + cfg.num_dense, cfg.num_dense + n_deep + kept

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        e = self.cfg.emb_dim
        v, w = emb[..., :e], emb[..., e]
        wide = w.sum(1)
        if self.wide_dense is not None:
            wide = wide + self.wide_dense(dense).squeeze(1)
        deep = self.deep(torch.cat([v.flatten(1), dense], dim=1)).squeeze(1)
        return wide + deep

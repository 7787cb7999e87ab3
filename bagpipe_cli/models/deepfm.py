"""DeepFM (Guo et al., "DeepFM: A Factorization-Machine based Neural Network for CTR
Prediction", 2017)."""

from __future__ import annotations

import torch
from torch import nn

from bagpipe_cli.models.common import ModelConfig, dense_linear, mlp, register


def fm_second_order(v: torch.Tensor) -> torch.Tensor:
    """The FM pairwise term sum_{i<j} <v_i, v_j> of v [B, T, E] -> [B].

    Computed as 0.5 * sum_e ((sum_t v)^2 - sum_t v^2), which is O(T*E) instead of the
    O(T^2*E) explicit pairwise sum.
    """
    s = v.sum(1)
    return 0.5 * (s * s - (v * v).sum(1)).sum(1)


@register("deepfm")
class DeepFM(nn.Module):
    """DeepFM's dense part: forward(dense [B, D], emb [B, T, E+1]) -> logits [B].

    Each row is [v (E), w (1)]: v is the id's factor vector (shared by the FM and the deep
    part, as in the paper), w its first-order weight.

    - first order: sum_t w_t + a linear term over the dense features;
    - second order: the FM term over the T factor vectors (`fm_second_order`);
    - deep: an MLP over concat(v flattened [B, T*E], dense) -> top_mlp -> 1;
    - logit = the sum of the three (the deep output layer's bias is the model's bias).

    The paper has only categorical fields; dense features enter the first-order and deep
    parts but not the FM term (they have no factor vectors).
    """

    first_order = True  # rows are E+1 wide (see row_dim)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.linear_dense = dense_linear(cfg.num_dense)
        n_deep = cfg.num_tables * cfg.emb_dim + cfg.num_dense
        self.deep = mlp(n_deep, (*cfg.top_mlp, 1), relu_last=False)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        e = self.cfg.emb_dim
        v, w = emb[..., :e], emb[..., e]
        first = w.sum(1)
        if self.linear_dense is not None:
            first = first + self.linear_dense(dense).squeeze(1)
        deep = self.deep(torch.cat([v.flatten(1), dense], dim=1)).squeeze(1)
        return first + fm_second_order(v) + deep

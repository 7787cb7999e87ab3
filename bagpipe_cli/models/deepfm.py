"""DeepFM (Guo et al., "DeepFM: A Factorization-Machine based Neural Network for CTR
Prediction", 2017)."""

from __future__ import annotations

import torch

from bagpipe_cli.models.common import ModelConfig, register, row_dim
from bagpipe_cli.models.wdl import WideAndDeep


def fm_second_order(v: torch.Tensor) -> torch.Tensor:
    """The FM pairwise term sum_{i<j} <v_i, v_j> of v [B, T, E] -> [B].

    Computed as 0.5 * sum_e ((sum_t v)^2 - sum_t v^2), which is O(T*E) instead of the
    O(T^2*E) explicit pairwise sum.
    """
    s = v.sum(1)
    return 0.5 * (s * s - (v * v).sum(1)).sum(1)


@register("deepfm")
class DeepFM(WideAndDeep):
    """DeepFM's dense part: forward(dense [B, D], emb [B, T, E+1]) -> logits [B].

    Each row is [v (E), w (1)]: v is the id's factor vector (shared by the FM and the deep
    part, as in the paper), w its first-order weight. DeepFM is Wide & Deep (its wide part
    is DeepFM's first-order part: sum_t w_t + a linear term over the dense features; its
    deep part an MLP over concat(v flattened, dense)) plus the FM second-order term over
    the T factor vectors (`fm_second_order`).

    The paper has only categorical fields; dense features enter the first-order and deep
    parts but not the FM term (they have no factor vectors).
    """

    @classmethod
    def footprint(cls, cfg: ModelConfig) -> tuple[int, int]:
        """Wide & Deep's, and the FM term's: the rows (v * v) and their sum over tables."""
        params, kept = super().footprint(cfg)
        return params, kept + cfg.num_tables * row_dim(cfg) + cfg.emb_dim

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return super().forward(dense, emb) + fm_second_order(emb[..., : self.cfg.emb_dim])

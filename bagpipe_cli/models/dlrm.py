"""DLRM (Naumov et al., "Deep Learning Recommendation Model for Personalization and
Recommendation Systems", 2019): bottom MLP, dot interaction, top MLP."""

from __future__ import annotations

import torch
from torch import nn

from bagpipe_cli.models.common import ModelConfig, mlp, mlp_footprint, register


def tril_index(num_vectors: int) -> torch.Tensor:
    """Flat indices into a [F, F] matrix of its strictly lower triangle, row by row.

    The order (i, j) for i = 1..F-1, j < i is the DLRM reference code's, so the top MLP's
    input features line up with it.
    """
    i, j = torch.tril_indices(num_vectors, num_vectors, offset=-1)
    return i * num_vectors + j


def pairwise_dots(z: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Dot products of all distinct pairs of the F vectors in z [B, F, E] -> [B, F(F-1)/2].

    One batched matrix product computes all F*F dots at once; gathering the lower triangle
    afterwards is far cheaper than a Python loop over pairs.
    """
    gram = torch.bmm(z, z.transpose(1, 2))
    return gram.flatten(1).index_select(1, index)


@register("dlrm")
class DLRM(nn.Module):
    """DLRM's dense part: forward(dense [B, D], emb [B, T, E]) -> logits [B].

    - bottom MLP: D -> bottom_mlp -> E, ReLU after every layer (as the reference code does);
    - interaction: the bottom output and the T embeddings, F = T + 1 vectors, give
      F(F-1)/2 pairwise dot products, concatenated with the bottom output;
    - top MLP: -> top_mlp -> 1, ReLU between layers, the output a logit.

    Without dense features (D = 0, e.g. Avazu) there is no bottom MLP: only the T
    embeddings interact (T(T-1)/2 features) and nothing is concatenated.

    The paper's Criteo Kaggle setup is bottom 13-512-256-64-16, top 512-256-1, E = 16;
    ModelConfig's defaults keep that shape with smaller layers (bottom 64-32-E, top 64-32-1)
    so CPU benchmarks spend their time on embeddings, which is what they measure.
    """

    first_order = False  # rows are E wide (see row_dim)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        f, n_top = self.interaction(cfg)
        self.bottom: nn.Module | None = (mlp(cfg.num_dense, (*cfg.bottom_mlp, cfg.emb_dim))
                                         if cfg.num_dense else None)
        # Not persistent: it is derived from the config, so checkpoints need not carry it.
        self.register_buffer("tril", tril_index(f), persistent=False)
        self.top = mlp(n_top, (*cfg.top_mlp, 1), relu_last=False)

    @staticmethod
    def interaction(cfg: ModelConfig) -> tuple[int, int]:
        """(F, the top MLP's input): F = T + 1 vectors (T without dense features)."""
        if cfg.num_dense:
            f = cfg.num_tables + 1
            return f, cfg.emb_dim + f * (f - 1) // 2
        f = cfg.num_tables
        return f, f * (f - 1) // 2

    @classmethod
    def footprint(cls, cfg: ModelConfig) -> tuple[int, int]:
        """(parameters, floats kept per sample): the bottom MLP's input and activations, the
        F vectors the dot products read, the top MLP's input and activations."""
        f, n_top = cls.interaction(cfg)
        top = mlp_footprint(n_top, (*cfg.top_mlp, 1), relu_last=False)
        bottom = (mlp_footprint(cfg.num_dense, (*cfg.bottom_mlp, cfg.emb_dim))
                  if cfg.num_dense else (0, 0))
        return bottom[0] + top[0], cfg.num_dense + bottom[1] + f * cfg.emb_dim + n_top + top[1]

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        if self.bottom is None:
            features = pairwise_dots(emb, self.tril)
        else:
            x = self.bottom(dense)
            dots = pairwise_dots(torch.cat([x.unsqueeze(1), emb], dim=1), self.tril)
            features = torch.cat([x, dots], dim=1)
        return self.top(features).squeeze(1)

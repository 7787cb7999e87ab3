"""What every dense CTR model shares: its config, the MLP builder and the model registry.

A model here is only the *dense* part of a recommendation model. The embedding tables live
in the engine (caches and servers), which gathers one row per categorical feature and
sample and calls `model(dense, emb)` with

- `dense`: float [B, D] dense features (D may be 0),
- `emb`: float [B, T, row_dim(cfg)] the gathered embedding rows, one per table,

and gets back logits [B] (the engine applies BCEWithLogits). The forward is
differentiable with respect to `emb`: the engine turns `emb.grad` into sparse row
gradients. Models without a first-order term store rows of width E; models with a
per-id linear weight (Wide & Deep, DeepFM) store it as one extra column, [v (E), w (1)],
so that weight is cached, fetched and synchronised with the row it belongs to.

Models use no dropout or batch norm: training stays bitwise reproducible, which the
engine's "Bagpipe equals synchronous training" check relies on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.model_names import MODEL_NAMES

MODELS: dict[str, type[nn.Module]] = {}
"""Model name (as given to --model) -> class built as `cls(cfg)`; filled by `register`."""


def register(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator adding a model to MODELS under `name`: written `@register("name")`
    in a module of this package, so `bagpipe_cli/model_names.py` finds it without torch."""

    def add(cls: type[nn.Module]) -> type[nn.Module]:
        if name not in MODEL_NAMES:
            raise ValueError(f"model {name!r}: write its decorator as @register({name!r}) at the "
                             "start of a line, in a module of bagpipe_cli/models/")
        MODELS[name] = cls
        return cls

    return add


def _check_sizes(option: str, sizes: tuple[int, ...]) -> None:
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ConfigError(
                f"{option}: layer sizes must be positive integers (got {', '.join(map(str, sizes))})"
            )


@dataclass(frozen=True)
class ModelConfig:
    """The dense model to train and its sizes.

    Defaults follow the DLRM Criteo Kaggle configuration (bottom 512-256-64, top 512-256,
    E = 16) with the MLPs shrunk so CPU runs stay quick; the layer structure is the same.
    """

    name: str  # model: a name in MODELS
    num_dense: int  # D: dense features per sample (from the dataset; may be 0)
    num_tables: int  # T: categorical features (embedding tables) per sample
    emb_dim: int = 16  # E: embedding (factor) dimension
    bottom_mlp: tuple[int, ...] = (64, 32)  # DLRM bottom MLP hidden sizes (an output layer of E follows)
    top_mlp: tuple[int, ...] = (64, 32)  # top (DLRM) / deep (WDL, DeepFM, DCN) MLP hidden sizes
    cross_layers: int = 3  # DCN cross layers

    def __post_init__(self) -> None:
        # Lists (from YAML or JSON) become tuples so the config stays hashable.
        object.__setattr__(self, "bottom_mlp", tuple(self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(self.top_mlp))
        if self.name not in MODELS:
            raise ConfigError(f"--model {self.name!r}: unknown; choose one of {', '.join(MODELS)}")
        if self.num_dense < 0:
            raise ConfigError(f"the dataset's dense feature count must be >= 0 (got {self.num_dense})")
        if self.num_tables < 1:
            raise ConfigError(
                f"model {self.name!r} needs at least one categorical table (got {self.num_tables})"
            )
        if self.emb_dim < 1:
            raise ConfigError(f"--emb-dim must be >= 1 (got {self.emb_dim})")
        _check_sizes("--bottom-mlp", self.bottom_mlp)
        _check_sizes("--top-mlp", self.top_mlp)
        if self.cross_layers < 1:
            raise ConfigError(f"--cross-layers must be >= 1 (got {self.cross_layers})")
        if self.name == "dlrm" and self.num_dense == 0 and self.num_tables < 2:
            # Without dense features DLRM's only features are the pairwise dot products.
            raise ConfigError(
                "--model dlrm needs at least 2 tables on a dataset without dense features "
                f"(got {self.num_tables}); choose another --model"
            )


def row_dim(cfg: ModelConfig) -> int:
    """Width of one embedding row the engine stores for `cfg`: E, plus 1 for a first-order weight."""
    return row_width(cfg.name, cfg.emb_dim)


def row_width(model: str, emb_dim: int) -> int:
    """`row_dim` of a `model` at E = `emb_dim`, before the dataset's sizes are known."""
    return emb_dim + (1 if getattr(MODELS[model], "first_order", False) else 0)


def build_model(cfg: ModelConfig) -> nn.Module:
    """The dense model for `cfg`, initialised from torch's global RNG (seed it first)."""
    return MODELS[cfg.name](cfg)


def footprint(cfg: ModelConfig) -> tuple[int, int]:
    """(the dense model's parameters, the floats its forward keeps for the backward per
    sample), from the sizes alone: nothing is built, so a model too large for any machine
    is counted as fast as a small one. Each model class says its own (`footprint`);
    tests/test_models.py holds them equal to what autograd saves."""
    return MODELS[cfg.name].footprint(cfg)


def mlp_footprint(n_in: int, sizes: tuple[int, ...], relu_last: bool = True) -> tuple[int, int]:
    """`mlp(n_in, sizes, relu_last)`'s (parameters, floats kept per sample besides its input):
    every ReLU keeps its output (which the next layer keeps as its input)."""
    widths = (n_in, *sizes)
    params = sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))
    kept = sizes if relu_last else sizes[:-1]
    return params, sum(kept)


def linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    """A linear layer with DLRM's initialisation.

    Weights ~ N(0, sqrt(2 / (n_in + n_out))) (Xavier normal), biases ~ N(0, sqrt(1 / n_out)),
    as in the DLRM reference code, so our runs start where its runs do.
    """
    layer = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        layer.weight.normal_(0.0, math.sqrt(2.0 / (n_in + n_out)))
        if bias:
            layer.bias.normal_(0.0, math.sqrt(1.0 / n_out))
    return layer


def mlp(n_in: int, sizes: tuple[int, ...], relu_last: bool = True) -> nn.Sequential:
    """Linear layers n_in -> sizes[0] -> ... -> sizes[-1], each followed by ReLU.

    With `relu_last=False` the last layer is left linear (an output layer producing logits).
    An empty `sizes` gives the identity.
    """
    layers: list[nn.Module] = []
    for i, n_out in enumerate(sizes):
        layers.append(linear(n_in, n_out))
        if relu_last or i < len(sizes) - 1:
            layers.append(nn.ReLU())
        n_in = n_out
    return nn.Sequential(*layers)


def dense_linear(num_dense: int) -> nn.Linear | None:
    """A bias-free linear term over the dense features, or None when there are none.

    Bias-free because the deep part's output layer already carries the model's bias;
    None because a Linear over 0 inputs cannot be initialised.
    """
    if num_dense == 0:
        return None
    return linear(num_dense, 1, bias=False)

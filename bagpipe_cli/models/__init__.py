"""Dense parts of CTR models (DLRM, Wide & Deep, DeepFM, DCN); the engine owns the embeddings.

    model = build_model(ModelConfig("dlrm", num_dense=13, num_tables=26))
    logits = model(dense, emb)  # dense [B, D], emb [B, T, row_dim(cfg)] -> [B]
"""

from importlib import import_module

from bagpipe_cli.model_names import MODEL_MODULES
from bagpipe_cli.models.common import (
    MODELS,
    ModelConfig,
    build_model,
    footprint,
    row_dim,
    row_width,
)

# Importing the model modules (every one that `@register`s a model) fills the MODELS registry.
for _module in sorted(set(MODEL_MODULES.values())):
    import_module(f"bagpipe_cli.models.{_module}")

__all__ = ["MODELS", "ModelConfig", "build_model", "footprint", "row_dim", "row_width"]

"""Dense parts of CTR models (DLRM, Wide & Deep, DeepFM, DCN); the engine owns the embeddings.

    model = build_model(ModelConfig("dlrm", num_dense=13, num_tables=26))
    logits = model(dense, emb)  # dense [B, D], emb [B, T, row_dim(cfg)] -> [B]
"""

# Importing the model modules fills the MODELS registry.
from bagpipe_cli.models import dcn, deepfm, dlrm, wdl  # noqa: F401
from bagpipe_cli.models.common import (
    MODELS,
    ModelConfig,
    build_model,
    footprint,
    row_dim,
    row_width,
)

__all__ = ["MODELS", "ModelConfig", "build_model", "footprint", "row_dim", "row_width"]

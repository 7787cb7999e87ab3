"""`bagpipe preprocess`: Criteo, Avazu and any CSV/Parquet click log -> a dataset directory.

See `pipeline` for the stages, `reader` for block reading with line numbers and `vocab`
for value -> id mapping.
"""

from bagpipe_cli.data.preprocess.pipeline import (
    FORMATS,
    VOCAB_DIR,
    PreprocessConfig,
    PreprocessResult,
    TableStats,
    load_vocab,
    preprocess,
)
from bagpipe_cli.data.preprocess.vocab import Vocab

__all__ = [
    "FORMATS",
    "VOCAB_DIR",
    "PreprocessConfig",
    "PreprocessResult",
    "TableStats",
    "Vocab",
    "load_vocab",
    "preprocess",
]

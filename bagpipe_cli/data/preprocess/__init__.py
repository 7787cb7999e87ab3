"""`bagpipe preprocess`: Criteo, Avazu and any CSV/Parquet click log -> a dataset directory.

See `pipeline` for the stages, `config` for the options, `reader` (and `stream`) for block
reading with line numbers, `layout` for which columns become what, `decoder` for checks and
transforms, `vocab` for value -> id mapping and `manifest` for what the dataset records.
"""

from bagpipe_cli.data.preprocess.config import FORMATS, PreprocessConfig
from bagpipe_cli.data.preprocess.manifest import VOCAB_DIR, load_vocab
from bagpipe_cli.data.preprocess.pipeline import PreprocessResult, TableStats, preprocess
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

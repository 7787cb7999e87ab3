"""Datasets: the on-disk format, writing, batch iteration, and synthetic generation."""

from bagpipe_cli.data.format import (
    SCHEMA_VERSION,
    Batch,
    Dataset,
    DatasetMeta,
    TableSpec,
    iter_batches,
    open_dataset,
)
from bagpipe_cli.data.writer import DatasetWriter

__all__ = [
    "SCHEMA_VERSION",
    "Batch",
    "Dataset",
    "DatasetMeta",
    "DatasetWriter",
    "TableSpec",
    "iter_batches",
    "open_dataset",
]

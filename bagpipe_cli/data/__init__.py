"""Datasets: the on-disk format, batch iteration, and synthetic generation."""

from bagpipe_cli.data.format import (
    SCHEMA_VERSION,
    Batch,
    Dataset,
    DatasetMeta,
    DatasetWriter,
    TableSpec,
    iter_batches,
    open_dataset,
)

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

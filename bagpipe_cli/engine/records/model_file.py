"""Saving a trained model: the dense state_dict and one full tensor per embedding table."""

from __future__ import annotations

from pathlib import Path

from bagpipe_cli.engine.records.result import TrainResult
from bagpipe_cli.files.atomic import atomic_file, torch_save


def save_model(result: TrainResult, path: Path, table_names: list[str]) -> None:
    """Dense state_dict and one full tensor per embedding table (after all write-backs)."""
    obj = {"dense": result.model.state_dict(),
           "tables": dict(zip(table_names, result.tables, strict=True)),
           "config": result.config}
    with atomic_file(Path(path), "wb") as f:
        torch_save(obj, f)

"""Whose checkpoints a --checkpoint-dir holds: a run lineage's (torch-free, so that the
command line checks it before anything starts).

Every checkpoint records in its state.json the lineage of the run that wrote it: a new id
for a run that starts afresh, and the resumed checkpoint's for a run that resumes (the
lineage goes on). A checkpoint folder holds one lineage's checkpoints: a fresh run never
writes into a folder that holds checkpoints (its --checkpoint-keep would remove another
run's), and a resumed run only into one holding none or its own lineage's. Checkpoints made
before lineages were recorded belong to the run that resumes from their folder. Two runs of
one lineage never write one folder at once: the folder is claimed for the run's life
(`claims`, by the command line).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.records import load_record

NAME = re.compile(r"^ckpt-(\d{8})$")  # a checkpoint folder's name (engine/records/checkpoint.py)


def new_lineage() -> str:
    return uuid.uuid4().hex[:16]


def _lineage(checkpoint: Path) -> str | None:
    """The lineage a checkpoint's state.json records (None: none, or not readable)."""
    try:
        state = load_record(checkpoint / "state.json", "checkpoint state", error=ValueError)
    except (OSError, ValueError):
        return None
    return state.get("lineage") if isinstance(state, dict) else None


def lineages(root: Path) -> dict[str, str | None]:
    """Each checkpoint in `root` (newest first) -> its lineage."""
    root = Path(root)
    try:
        names = sorted((p.name for p in root.iterdir() if NAME.match(p.name) and p.is_dir()),
                       reverse=True)
    except OSError:
        return {}
    return {n: _lineage(root / n) for n in names}


def lineage_of(resume: Path) -> str | None:
    """The lineage a run resuming from `resume` (a checkpoint, or a folder of them) goes on:
    the newest checkpoint's that records one."""
    resume = Path(resume)
    if (resume / "state.json").exists():
        return _lineage(resume)
    return next((x for x in lineages(resume).values() if x), None)


def _real(p: Path) -> Path:
    return Path(os.path.realpath(Path(p).expanduser()))


def checkpoint_lineage(root: Path, resume: str | Path | None,
                       option: str = "--checkpoint-dir") -> str:
    """The lineage a run writes its checkpoints into `root` under: a new one for a fresh
    run, the resumed one's otherwise. ConfigError (one line) when `root` holds another
    run's checkpoints."""
    root = Path(root)
    held = lineages(root)
    if resume is None:
        if held:
            raise ConfigError(f"{option} {root} holds the checkpoints of another run ({root / next(iter(held))}); "
                              "a run that starts afresh never writes into it (nor removes them): "
                              f"continue that run with --resume {root}, or choose another folder")
        return new_lineage()
    mine = lineage_of(Path(resume))
    r, inside = _real(Path(resume)), _real(root)
    continuing = r == inside or inside in r.parents
    foreign = [n for n, x in held.items() if x != mine and not (x is None and continuing)]
    if foreign:
        raise ConfigError(f"{option} {root} holds the checkpoints of another run ({root / foreign[0]}); "
                          f"this run goes on from --resume {resume}, another run's: write its "
                          "checkpoints into another folder")
    return mine or new_lineage()

"""Run folders: config, environment, per-iteration metrics and a summary with a schema version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.environment import environment
from bagpipe_cli.io import atomic_dir, write_json

RUN_SCHEMA_VERSION = 1


def write_run(out: Path, config: dict[str, Any], metrics: pd.DataFrame, summary: dict[str, Any],
              overwrite: bool = False, extra_files: dict[str, Any] | None = None) -> Path:
    """Write one run folder atomically: config.json (with environment), metrics.csv, summary.json.

    `extra_files` maps file names to callables `fn(path)` that write more files into the folder.
    """
    env = environment()
    with atomic_dir(out, overwrite) as tmp:
        write_json(tmp / "config.json", {"schema_version": RUN_SCHEMA_VERSION, **config,
                                         "environment": env})
        metrics.to_csv(tmp / "metrics.csv", index=False)
        write_json(tmp / "summary.json", {"schema_version": RUN_SCHEMA_VERSION, **summary,
                                          "environment": env})
        for name, fn in (extra_files or {}).items():
            fn(tmp / name)
    return Path(out)

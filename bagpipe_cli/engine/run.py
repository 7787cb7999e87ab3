"""`run(cfg)`: the one entry point of a training run, whatever runs it.

- an external system (the registry names its runner: TorchRec) -> that runner;
- `--transport inproc` -> the in-process engine (`engine/local/runtime.py`: `train_in_process`);
- `--transport torch` with `--procs` -> every rank as a local process (`spawn_train`), or
  with `--master` this machine's share of them (the machine without rank 0 returns None);
- `--transport torch` without -> this process is one rank of a torchrun job (`run_rank`):
  rank 0 returns the result, the other ranks None.
"""

from __future__ import annotations

import importlib

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.distributed import run_rank, spawn_train
from bagpipe_cli.engine.local.runtime import train_in_process
from bagpipe_cli.engine.records.result import TrainResult
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.engine.trainer.loop import ProgressFn


def run(cfg: TrainConfig, progress: ProgressFn | None = None) -> TrainResult | None:
    """Train `cfg`; `progress(b, record)` is called as iterations finish."""
    s = spec(cfg.system)
    if s.external:
        module, fn = s.runner.split(":")
        return getattr(importlib.import_module(module), fn)(cfg, progress)
    if cfg.transport == "torch":
        return spawn_train(cfg, progress) if cfg.procs is not None else run_rank(cfg, progress)
    return train_in_process(cfg, progress)

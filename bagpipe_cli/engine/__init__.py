"""The caching, prefetching and synchronisation engine (docs/architecture.md maps every file).

The core, the same for every runtime:

    run       run(cfg): the one entry point      config    TrainConfig: every option of a run
    registry  the systems, and how each builds   setup     dataset, model, held-out rows
              its planner, system and volumes    memory    a run's memory, estimated and checked
    planning/ what rank 0 (the planner) decides: batches, the oracle, the policies' planners,
              the plan types
    trainer/  the trainer step: the loop, passes, staging, row cache, optimizers, evaluation
    systems/  where an iteration's rows live and where their updates go, one module a system
    comm/     transports, collectives, shards, the emulated network, traffic counts
    records/  metrics, the run's result, checkpoints, traces, --save-model

The runtimes, each with the same file names for the same roles (runtime, planner, server,
transport, collective) and the same class names but for the prefix (`LocalServer`,
`DistributedServer`, ...): `local/` (every role in one process) and `distributed/`
(torch.distributed ranks, launched by torchrun or `--procs`).

The package imports its parts when first asked for them, so `engine.config` (whose fields
the command line's options are) imports without torch.
"""

import importlib
from typing import Any

# name -> "module:attribute"; `train` is the name the library has always had for `run`
_EXPORTS = {"TrainConfig": "bagpipe_cli.engine.config:TrainConfig",
            "TrainResult": "bagpipe_cli.engine.records.result:TrainResult",
            "run": "bagpipe_cli.engine.run:run", "train": "bagpipe_cli.engine.run:run",
            "save_model": "bagpipe_cli.engine.records.model_file:save_model"}

__all__ = ["TrainConfig", "TrainResult", "run", "save_model", "train"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = _EXPORTS[name].partition(":")
    value = getattr(importlib.import_module(module), attr)
    # Importing engine.run set this package's `run` to that module; the export wins, as an
    # eager `from bagpipe_cli.engine.run import run` here would have made it.
    globals()[name] = value
    if name in ("run", "train"):
        globals().update(run=value, train=value)
    return value

"""The caching, prefetching and synchronisation engine (docs/architecture.md maps every file).

The core, the same for every runtime:

    run         run(cfg): the one entry point        config      TrainConfig: every option of a run
    registry    the systems, and how each builds     setup       dataset, model, held-out rows
                its planner, system and volumes      loop        the training loop (all runtimes)
    feed        batches and plans, round by round    oracle      Bagpipe's lookahead Oracle Cacher
    planner     plan builders; the baselines' plans  systems/    where rows live and updates go
    transport   trainers <-> servers (interface)     collective  sums among trainers (interface)
    shards      a server's shard of the tables       cache       the trainer's row cache
    trainer_set which trainers a process runs        optim       the row optimizers
    network     the emulated network's timing        records     metrics.csv and summary.json
    checkpoint  checkpoints and resuming             result      a finished run's TrainResult
    evaluation  held-out AUC and log loss            save        --save-model
    memory      a run's memory, estimated and checked before anything is allocated

The runtimes, each with the same file names for the same roles (runtime, loader, server,
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
            "TrainResult": "bagpipe_cli.engine.result:TrainResult",
            "run": "bagpipe_cli.engine.run:run", "train": "bagpipe_cli.engine.run:run",
            "save_model": "bagpipe_cli.engine.save:save_model"}

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

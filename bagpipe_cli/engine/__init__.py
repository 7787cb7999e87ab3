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

The runtimes, each with the same file names for the same roles (runtime, loader, server,
transport, collective): `local/` (every role in one process) and `distributed/`
(torch.distributed ranks, launched by torchrun or `--procs`).
"""

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.result import TrainResult
from bagpipe_cli.engine.run import run
from bagpipe_cli.engine.save import save_model

train = run  # the name the library has always had

__all__ = ["TrainConfig", "TrainResult", "run", "save_model", "train"]

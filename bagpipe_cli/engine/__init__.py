"""The caching, prefetching and synchronisation engine.

    config     TrainConfig: every option of a run        registry   the systems and what each is
    run        run(cfg): the one entry point              setup      dataset, model, planner, system
    feed       batches and plans, round by round          loop       the training loop (all runtimes)
    oracle     Bagpipe's lookahead Oracle Cacher          planner    the lru/lfu/fae baselines' plans
    systems    where rows live and updates go             cache      the trainer's row cache
    server     the embedding servers' shards              transport  trainer <-> servers, in-process
    collective sums among trainers, in-process            records    metrics.csv and summary.json
    inprocess  the in-process runtime                     distributed  the torch.distributed runtime
    checkpoint checkpoints and resuming                   result     a finished run's TrainResult
"""

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.records import TrainResult
from bagpipe_cli.engine.run import run
from bagpipe_cli.engine.save import save_model

train = run  # the name the library has always had

__all__ = ["TrainConfig", "TrainResult", "run", "save_model", "train"]

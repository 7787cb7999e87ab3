"""External systems measured side by side with the engine (optional installs).

- `torchrec_run`: TorchRec's sharded EmbeddingBagCollection + DistributedModelParallel with
  its train pipeline, on our data, batches and dense model (`make torchrec` installs it).
"""

from bagpipe_cli.external.torchrec_run import SHARDINGS, torchrec_available, train_torchrec

__all__ = ["SHARDINGS", "torchrec_available", "train_torchrec"]

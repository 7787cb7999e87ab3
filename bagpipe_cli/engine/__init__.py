"""The caching, prefetching and synchronisation engine (oracle, cache, server, trainer, transport)."""

from bagpipe_cli.engine.trainer import TrainConfig, TrainResult, save_model, train

__all__ = ["TrainConfig", "TrainResult", "save_model", "train"]

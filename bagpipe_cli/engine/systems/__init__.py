"""Embedding systems: where an iteration's rows come from and where their updates go.

    base     the interface every system implements (`EmbeddingSystem`) and what one is
             built from (`SystemParts`)
    cached   a trainer cache run by a plan, the oracle's or a policy's (`CacheSystem`)
    hotline  popular samples first, the rest once their rows land (`HotlineSystem`)
    slipstream  samples whose rows stopped changing skipped (`SlipstreamSystem`)
    tables   every table on the trainer: local (`LocalSystem`)
    pushing  parameter-server systems: sync (`SyncSystem`) and het (`HetSystem`)
"""

from bagpipe_cli.engine.systems.base import EmbeddingSystem, Rows, SystemParts
from bagpipe_cli.engine.systems.cached import CacheSystem
from bagpipe_cli.engine.systems.pushing import HetSystem, SyncSystem
from bagpipe_cli.engine.systems.tables import LocalSystem

__all__ = ["CacheSystem", "EmbeddingSystem", "HetSystem", "LocalSystem", "Rows", "SyncSystem",
           "SystemParts"]

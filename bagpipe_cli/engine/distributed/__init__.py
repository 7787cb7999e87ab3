"""Runs over torch.distributed: rank 0 is the data loader + oracle, ranks 1..K the embedding
servers, ranks K+1..K+N the trainers (world size 1 + K + N). Every system runs here, with
the same training loop as in-process (`engine/loop.py`).

    layout.py       which rank plays which role; every trainer's device
    wire.py         request codes, pickled objects, failures that name the peer
    transport.py    a trainer's requests to the servers (lockstep: the same sequence on every trainer)
    collectives.py  all-gathers among the trainers, summed in trainer order
    server.py       a server rank: its shard, served to the trainers in lockstep
    coordinator.py  rank 0: plans, feeds the trainers, checkpoints, assembles the result
    trainer.py      a trainer rank: the training loop over the above
    faults.py       fault injection for the failure tests
    launcher.py     local processes, one per rank (`--procs`, and the TorchRec runner)
    rank.py         one rank's entry point (`run_rank`) and the local job (`spawn_train`)

The schedule (who sends what to whom, and why it is exact) is in docs/architecture.md.
"""

from bagpipe_cli.engine.distributed.layout import Layout, trainer_devices
from bagpipe_cli.engine.distributed.runtime import run_rank, spawn_train

__all__ = ["Layout", "run_rank", "spawn_train", "trainer_devices"]

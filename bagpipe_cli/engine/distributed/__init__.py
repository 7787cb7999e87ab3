"""Runs over torch.distributed: rank 0 is the planner, ranks 1..K the embedding
servers, ranks K+1..K+N the trainers (world size 1 + K + N). Every system runs here, with
the same training loop as in-process (`engine/trainer/loop.py`).

    runtime     one rank's entry point (`run_rank`) and the local job (`spawn_train`)
    layout      which rank plays which role; every trainer's device
    wire        request codes, objects on the wire, failures that name the peer
    planner     rank 0: plans, feeds the trainers, checkpoints, assembles the result
    server      a server rank: its shard, served to the trainers in lockstep
    trainer     a trainer rank: the training loop over the parts below
    transport   a trainer's requests to the servers (lockstep: the same sequence on every trainer)
    collective  sums among the trainer ranks, in trainer order
    faults      fault injection for the failure tests
    time_sync   --trace: every rank's clock offset to rank 0's, measured at start-up

Local processes (`--procs`) are started by `bagpipe_cli/launch/`. The schedule (who sends
what to whom, and why it is exact) is in docs/architecture.md.
"""

from bagpipe_cli.engine.distributed.layout import Layout, trainer_devices
from bagpipe_cli.engine.distributed.runtime import run_rank, spawn_train

__all__ = ["Layout", "run_rank", "spawn_train", "trainer_devices"]

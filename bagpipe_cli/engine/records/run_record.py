"""A finished run as the runtimes hand it over, in types: what each trainer process and
each server reports (`TrainerReport`, `ServerReport`), how the run was laid out
(`RunLayout`), and everything its result is made of (`RunRecord`, which `finish_run` in
`result.py` takes).

The in-process runtime (`engine/local/runtime.py`) fills them for its one process; over
torch.distributed every trainer rank and server rank sends rank 0 its report (pickled, as
`wire.send_obj` sends objects) and rank 0 (`engine/distributed/planner.py`) fills the
record. One set of fields for both, so neither can leave out or misname what the other
records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
import torch

from bagpipe_cli.engine.comm.shards import Shard
from bagpipe_cli.engine.comm.traffic import Traffic
from bagpipe_cli.engine.planning.builders import Planning
from bagpipe_cli.engine.records.checkpoint import Checkpoint, Checkpointer
from bagpipe_cli.engine.records.metrics import role_figures
from bagpipe_cli.engine.setup import RunSetup


@dataclass
class TrainerReport:
    """What one trainer process hands back when training ends."""

    records: list[dict[str, Any]]  # its metrics records of this run (not a resumed run's before)
    device: str  # where it trained: "cpu", "cuda:0"
    device_info: dict[str, Any]  # the device described (`trainer.device.describe`)
    bytes_sent: int  # to the servers (`Transport.bytes_sent`)
    bytes_received: int  # from them
    collective: dict[str, float]  # its sums' bytes and seconds (`comm.collective.collective_figures`)
    traffic: Traffic  # bytes by kind (`comm/traffic.py`), its sums' included
    written_back_at_end: int  # rows still cached at the end, written back then
    peak_resident_rows: int | None = None  # a partitioned cache's own rows (`peak_held`)
    cpu_s: float | None = None  # CPU seconds of training (a process per trainer)
    peak_rss_mb: float | None = None  # its peak RSS (a process per trainer)
    sched: dict[str, Any] | None = None  # its threads' waits for a CPU (`launch/contention.py`)
    trace: Any = None  # its tracer's events (a trainer rank's)
    dense: dict[str, torch.Tensor] | None = None  # trainer 0's dense model (a trainer rank's)

    def role(self, iterations: int) -> dict[str, Any]:
        """Its figures in summary.json's `roles`, its traffic per iteration of `iterations`."""
        own = {k: v for k, v in (("cpu_s", self.cpu_s), ("peak_rss_mb", self.peak_rss_mb))
               if v is not None}
        held = {} if self.peak_resident_rows is None else {"peak_resident_rows": self.peak_resident_rows}
        return role_figures(pd.DataFrame(self.records), device=self.device, **own,
                            bytes_sent=self.bytes_sent, bytes_received=self.bytes_received,
                            **held, **self.collective, traffic=self.traffic.figures(iterations))


@dataclass
class ServerReport:
    """What one embedding server hands back when training ends: its shard's final rows and
    state, its figures (busy seconds, bytes, ...) and its traffic."""

    weight: torch.Tensor
    state: torch.Tensor
    figures: dict[str, Any]
    traffic: Traffic
    trace: Any = None  # its tracer's events (a server rank's)

    def shard(self, k: int, servers: int) -> Shard:
        return Shard.holding(k, servers, self.weight, self.state)

    def role(self, iterations: int) -> dict[str, Any]:
        """Its figures in summary.json's `roles`, its traffic per iteration of `iterations`."""
        return {**self.figures, "traffic": self.traffic.figures(iterations)}


@dataclass
class RunLayout:
    """Where a run's roles ran: config.json's `layout`."""

    world: int  # processes (1 in-process)
    servers: int
    trainers: int
    trainer_devices: list[str]  # every trainer's
    devices: list[dict[str, Any]]  # every trainer process's, described
    backend: str | None  # the trainers' collective backend (None in-process)
    placement: list[dict[str, Any]]  # every process's cores (`launch/placement.py`)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunRecord:
    """Everything a finished run's result is made of (`result.finish_run`)."""

    setup: RunSetup
    planning: Planning
    reports: list[TrainerReport]  # every trainer process's, in trainer order
    prior: list[list[dict[str, Any]]]  # per trainer process: a resumed run's earlier records
    wall: float  # seconds of training (evaluations during it left out)
    model: torch.nn.Module  # the dense model, on the CPU
    servers: list[Shard]  # the final shards
    layout: RunLayout
    runner: str  # "inproc" or "distributed"
    transport: str  # "inproc" or "torch"
    roles: dict[str, dict[str, Any]]  # summary.json's `roles`
    contention: dict[str, Any]  # how much of the machine the run had
    checkpointer: Checkpointer | None = None  # --checkpoint-every's
    resumed: Checkpoint | None = None  # the checkpoint --resume started from
    evals: list[dict[str, Any]] = field(default_factory=list)  # --eval-every's points
    eval_s: float = 0.0  # their seconds
    trace: dict[str, Any] | None = None  # --trace's document

    @property
    def frames(self) -> list[pd.DataFrame]:
        """Every trainer process's records, a resumed run's earlier ones first."""
        return [pd.DataFrame(list(p) + r.records)
                for p, r in zip(self.prior, self.reports, strict=True)]

    def facts(self) -> dict[str, Any]:
        """The runner's own summary keys."""
        return {"runner": self.runner, "transport": self.transport, "roles": self.roles,
                "contention": self.contention,
                "rows_written_back_at_end": int(sum(r.written_back_at_end for r in self.reports))}

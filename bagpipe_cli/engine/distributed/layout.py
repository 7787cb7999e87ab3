"""Which rank plays which role, and where every trainer computes.

Rank 0 is the planner, ranks 1..K the embedding servers, ranks K+1..K+N the
trainers (world size 1 + K + N).
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from bagpipe_cli.data.format import META_FILE, read_meta
from bagpipe_cli.engine.config import SHARED_DATA, TrainConfig
from bagpipe_cli.engine.trainer.device import cuda_count, pick
from bagpipe_cli.errors import BagpipeError, ConfigError
from bagpipe_cli.limits import machine_memory

ALL_RANKS, TRAINERS = -2, -1  # "peers" of a collective, for error messages


@dataclass(frozen=True)
class Layout:
    """Which rank plays which role."""

    servers: int
    trainers: int

    @classmethod
    def of(cls, cfg: TrainConfig) -> Layout:
        return cls(cfg.servers, cfg.trainers)

    @property
    def world(self) -> int:
        return 1 + self.servers + self.trainers

    def server_rank(self, k: int) -> int:
        return 1 + k

    def trainer_rank(self, i: int) -> int:
        return 1 + self.servers + i

    @property
    def trainer_ranks(self) -> list[int]:
        return [self.trainer_rank(i) for i in range(self.trainers)]

    def role(self, rank: int) -> tuple[str, int]:
        if rank == 0:
            return "planner", 0
        if rank <= self.servers:
            return "server", rank - 1
        return "trainer", rank - 1 - self.servers

    def name(self, rank: int) -> str:
        if rank == TRAINERS:
            return "the other trainers (collective)"
        if rank == ALL_RANKS:
            return "the other ranks (collective)"
        role, i = self.role(rank)
        return "planner (rank 0)" if role == "planner" else f"{role} {i} (rank {rank})"


def rank_facts() -> dict[str, Any]:
    """What a rank can offer a trainer: its host, CUDA devices, whether torch has NCCL, and
    its machine's memory (engine/memory.py's `check_hosts`)."""
    return {"host": socket.gethostname(), "memory": machine_memory(),
            "cuda": cuda_count(),
            "nccl": dist.is_available() and dist.is_nccl_available()}


def trainer_devices(cfg: TrainConfig, layout: Layout, facts: list[dict[str, Any]]) -> list[str]:
    """The device of every trainer, from every rank's `rank_facts()` (the same answer on every
    rank). `--device cuda` (and auto, where a host has GPUs) gives the trainers on a host its
    GPUs in turn; NCCL needs one GPU per trainer. Raises ConfigError naming the trainer that
    cannot run as asked."""
    out: list[str] = []
    taken: dict[tuple[str, str], str] = {}
    for i in range(layout.trainers):
        f = facts[layout.trainer_rank(i)]
        who = f"{layout.name(layout.trainer_rank(i))} on {f['host']}"
        before = sum(facts[layout.trainer_rank(j)]["host"] == f["host"] for j in range(i))
        dev = pick(cfg.device, f["cuda"], before, who)
        if cfg.backend == "nccl":
            if dev == "cpu":
                raise ConfigError(f"--backend nccl: NCCL connects GPUs, and {who} computes on "
                                  "the CPU; use --backend gloo or --device cuda")
            if not f["nccl"]:
                raise ConfigError(f"--backend nccl: the torch of {who} has no NCCL; use --backend gloo")
            if (f["host"], dev) in taken:
                raise ConfigError(f"--backend nccl: {who} and {taken[(f['host'], dev)]} would share "
                                  f"{dev}, and NCCL needs a GPU per trainer; use --backend gloo "
                                  "or fewer trainers per machine")
            taken[(f["host"], dev)] = who
        out.append(dev)
    return out


def dataset_fact(path: str) -> dict[str, str]:
    """What a rank sees of the dataset at `path`: its meta.json's digest, or why it cannot
    read it."""
    try:
        read_meta(Path(path))
        return {"meta_sha256": hashlib.sha256((Path(path) / META_FILE).read_bytes()).hexdigest()}
    except (BagpipeError, OSError) as e:
        return {"error": str(e)}


def check_datasets(cfg: TrainConfig, layout: Layout, facts: list[dict[str, Any]]) -> None:
    """Every rank reads the dataset itself (the trainers their own samples), so every rank
    must see the same one at --data's path. From every rank's `dataset_fact` (the same
    answer on every rank): a ConfigError naming the first rank that does not."""
    ours = facts[0]["dataset"]
    for r, f in enumerate(facts):
        d, who = f["dataset"], f"{layout.name(r)} on {f['host']}"
        if "error" in d:
            raise ConfigError(f"{who} cannot read the dataset {cfg.data}: {d['error']}; {SHARED_DATA}")
        if "error" not in ours and d != ours:
            raise ConfigError(f"{who} has another dataset at {cfg.data} than rank 0 (its "
                              f"{META_FILE} differs); {SHARED_DATA}")

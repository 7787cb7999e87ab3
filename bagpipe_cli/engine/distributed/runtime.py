"""One rank of a torch.distributed run: join the job, agree on devices, play the role.

`run_rank(cfg)` is what every rank runs (torchrun sets RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT); `spawn_train(cfg)` starts every rank as a local process (`--procs`) and
returns rank 0's result.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import socket
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.distributed.collective import DistributedCollective
from bagpipe_cli.engine.distributed.faults import Faults
from bagpipe_cli.engine.distributed.layout import (
    ALL_RANKS,
    Layout,
    check_datasets,
    dataset_fact,
    rank_facts,
    trainer_devices,
)
from bagpipe_cli.engine.distributed.planner import DistributedPlanner
from bagpipe_cli.engine.distributed.server import server_main
from bagpipe_cli.engine.distributed.time_sync import clock_offset
from bagpipe_cli.engine.distributed.trainer import trainer_main
from bagpipe_cli.engine.distributed.wire import comm
from bagpipe_cli.engine.memory import check_hosts
from bagpipe_cli.engine.records.result import TrainResult
from bagpipe_cli.engine.records.trace import NO_TRACE, NoTracer, Tracer
from bagpipe_cli.engine.setup import admit, estimate, prepare
from bagpipe_cli.engine.trainer.device import computing_on, cuda_count
from bagpipe_cli.engine.trainer.loop import ProgressFn
from bagpipe_cli.errors import BagpipeError, ConfigError, RankFailure
from bagpipe_cli.files.atomic import atomic_file, json_default, torch_save
from bagpipe_cli.launch import signals
from bagpipe_cli.launch.netshape import ShapedNetwork
from bagpipe_cli.launch.placement import (
    GPU_TRAINER_CORES,
    Placement,
    available_cores,
    pin,
    plan_rank,
)
from bagpipe_cli.launch.processes import Machine, rank_folder, spawn_local

RANK_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_rank(cfg: TrainConfig, progress: ProgressFn | None = None) -> TrainResult | None:
    """This process's rank of the job (from the environment). Returns the TrainResult on
    rank 0, None elsewhere."""
    layout = Layout.of(cfg)
    for var in RANK_VARS:
        if var not in os.environ:
            raise ConfigError(f"--transport torch: environment variable {var} is not set; launch "
                              "with torchrun or use --procs")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != layout.world:
        raise ConfigError(f"world size {world} does not match 1 oracle + --servers {cfg.servers} "
                          f"+ --trainers {cfg.trainers} = {layout.world} ranks")
    placement = _place(cfg, layout, rank, world)
    faults = Faults.for_rank(rank)
    faults.arm()
    if cfg.backend == "nccl":  # a timed-out NCCL wait raises (a one-line error), not an abort
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    _join(cfg, rank, world)
    try:
        return _play(cfg, layout, rank, placement, faults, progress)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def _join(cfg: TrainConfig, rank: int, world: int) -> None:
    """Meet every rank at MASTER_ADDR:MASTER_PORT within --timeout, or fail in one line."""
    if rank or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        _reach(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), cfg.timeout_s)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=cfg.timeout_s))
    except RuntimeError as e:  # the rendezvous timed out, or MASTER_ADDR cannot be reached
        m = re.search(r"(\d+)/(\d+) clients joined", str(e))
        joined = f"only {m[1]} of {m[2]} ranks joined" if m else "not every rank joined"
        raise RankFailure(
            f"the job did not start: {joined} within --timeout "
            f"{cfg.timeout_s:g} s at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}; start "
            f"all {world} ranks (1 oracle + --servers + --trainers) with the same options") from None


def _reach(addr: str, port: int, timeout_s: float) -> None:
    """Wait until something listens at addr:port (rank 0's store, or torchrun's), at most
    `timeout_s`: c10d's own client retries past its timeout (about twice it) and cannot be
    interrupted, while this loop stops at once on Ctrl-C or SIGTERM."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((addr, port), timeout=max(0.05, min(1.0, end - time.monotonic()))):
                return
        except OSError as e:
            if time.monotonic() >= end:
                why = e.strerror or type(e).__name__.lower()
                raise RankFailure(f"the job did not start: nothing answered at {addr}:{port} "
                                  f"within --timeout {timeout_s:g} s ({why}); start the machine "
                                  "with rank 0 first, at that address") from None
            time.sleep(0.2)


def _place(cfg: TrainConfig, layout: Layout, rank: int, world: int) -> Placement:
    """This rank's cores and torch threads among the ranks on its machine (torchrun's
    LOCAL_RANK / LOCAL_WORLD_SIZE; without them every rank is taken to be on this one),
    applied to the whole process before any thread starts."""
    local = int(os.environ.get("LOCAL_RANK", rank))
    here = range(rank - local, rank - local + int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    roles = [layout.role(r)[0] for r in here]
    gpu = cfg.device != "cpu" and cuda_count() > 0  # trainers here will be on GPUs
    p = plan_rank(cfg.placement, cfg.threads, roles, local, available_cores(),
                  GPU_TRAINER_CORES if gpu else None)
    pinned = p.policy != "off" and pin(p.compute)
    torch.set_num_threads(p.torch_threads)
    return replace(p, pinned=pinned)


def _play(cfg: TrainConfig, layout: Layout, rank: int, placement: Placement, faults: Faults,
          progress: ProgressFn | None) -> TrainResult | None:
    # Every rank learns every trainer's device and what every rank sees of the dataset (and
    # every rank fails alike if one cannot run as asked) before the trainers' group is made;
    # rank 0 also records every placement.
    facts: list[Any] = [None] * layout.world
    comm(layout, ALL_RANKS, dist.all_gather_object, facts,
         {**rank_facts(), "placement": placement.to_json(), "dataset": dataset_fact(cfg.data),
          "pid": os.getpid()})
    check_datasets(cfg, layout, facts)
    shape, memory = estimate(cfg)  # every machine's ranks fit its memory, before any allocates
    check_hosts(cfg, shape, memory, [f["host"] for f in facts], [f["memory"] for f in facts])
    devices = trainer_devices(cfg, layout, facts)
    role, idx = layout.role(rank)
    device = torch.device(devices[idx] if role == "trainer" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the trainers' group: NCCL binds to it
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    # The trainers' sums: one group for the critical path, one for each background thread
    # (dense buckets, sync_later sums); every rank takes part in making a group, in order.
    group, *lanes = [dist.new_group(layout.trainer_ranks, timeout=timeout, backend=cfg.backend)
                     for _ in range(3)]
    # The plans (rank 0 and the trainers: `relay.py`), a group of their own.
    plans = dist.new_group([0, *layout.trainer_ranks], timeout=timeout, backend="gloo")
    tracer = _tracer(cfg, layout, rank)
    s = prepare(cfg)
    if role == "planner":
        placements = [{"rank": r, "host": f["host"], "pid": f["pid"], **f["placement"]}
                      for r, f in enumerate(facts)]
        return DistributedPlanner(s, layout, devices, placements, faults, plans, progress, tracer).run()
    if role == "server":
        server_main(s, layout, idx, faults, tracer)
    else:
        comm_device = device if cfg.backend == "nccl" else torch.device("cpu")
        with computing_on(device, not cfg.nondeterministic):
            collective = DistributedCollective(group, tuple(lanes), layout, idx, device, comm_device,
                                         cfg.collective, tracer)
            trainer_main(s, layout, idx, collective, plans, device, faults, tracer)
    return None


def _tracer(cfg: TrainConfig, layout: Layout, rank: int) -> NoTracer:
    """With --trace: this rank's tracer, its clock's offset to rank 0's measured (every rank
    takes part at once, so no rank is left waiting)."""
    if not cfg.trace:
        return NO_TRACE
    tracer = Tracer()
    tracer.offset, tracer.rtt = clock_offset(layout, rank)
    return tracer


def spawn_train(cfg: TrainConfig, progress: ProgressFn | None = None) -> TrainResult | None:
    """Run `cfg` over torch.distributed as local processes, one per rank, and return rank 0's
    TrainResult. With --master, this machine's --procs ranks of a job on several, which meet
    at --master within --timeout; the machine without rank 0 returns None."""
    layout = Layout.of(cfg)
    machine = None
    if cfg.master is None:
        trainer_devices(cfg, layout, [rank_facts()] * layout.world)  # every rank runs here
        admit(cfg)  # every rank and this process fit this machine's memory, before any starts
    else:  # the ranks check every machine's devices and memory from its own facts
        machine = Machine(*cfg.master_address, cfg.node_rank * cfg.procs, cfg.procs)
    with rank_folder() as tmp:  # (a killed launcher's is removed by the next)
        conf, out = Path(tmp) / "config.json", Path(tmp) / "result.pt"
        conf.write_text(json.dumps(asdict(cfg), default=json_default))

        def on_line(line: str) -> None:  # rank 0 reports each planned round
            if progress and line.startswith("{"):
                progress(json.loads(line)["iteration"], {"loss": math.nan, "time": math.nan})

        entry = ("import sys; from bagpipe_cli.engine.distributed.runtime import rank_main; "
                 "sys.exit(rank_main(*sys.argv[1:]))")
        command = [sys.executable, "-c", entry, str(conf), str(out)]
        if cfg.net_shape:
            with ShapedNetwork(layout.world, cfg.net_gbps) as net:
                spawn_local(command, layout.world, layout.name, cfg.timeout_s, on_line, shaped=net)
        else:
            spawn_local(command, layout.world, layout.name, cfg.timeout_s, on_line, machine=machine)
        return torch.load(out, weights_only=False) if cfg.node_rank == 0 else None


def rank_main(conf: str, out: str) -> int:
    """One rank of `spawn_train`: rank 0 saves the TrainResult to `out`. Returns the exit code.
    SIGTERM and SIGHUP (the launcher stopping the job) end it as Ctrl-C does, with its
    temporaries removed."""
    signals.install()
    try:
        cfg = TrainConfig(**json.loads(Path(conf).read_text()))
        result = run_rank(cfg, lambda b, rec: print(json.dumps({"iteration": b}), flush=True))
        if result is not None:
            with atomic_file(Path(out), "wb") as f:
                torch_save(result, f)
        return 0
    except BagpipeError as e:
        print(f"Error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        return signals.exit_code(e)

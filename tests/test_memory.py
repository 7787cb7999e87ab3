"""Memory admission (engine/memory.py): a run, a profile or a simulation whose estimate
exceeds this machine's memory is refused in one line before anything is allocated, and a
run's estimate is within 2x of the peak it measures."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.data import open_dataset
from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import TrainConfig
from bagpipe_cli.engine import memory as mem
from bagpipe_cli.engine.registry import SIMULATED_SYSTEMS, spec
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.launch import forkserver
from bagpipe_cli.limits import machine_memory
from bagpipe_cli.models import MODELS, ModelConfig, build_model, footprint, row_dim

BAGPIPE = "from bagpipe_cli.__main__ import main; main()"
# `bagpipe`, then the process's peak resident memory (KiB, Linux's ru_maxrss) on stdout.
BAGPIPE_PEAK = ("import resource\nfrom bagpipe_cli.__main__ import main\ntry:\n    main()\n"
                "finally:\n    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)\n")
HANG_S = 300  # a hang guard only: a run here takes seconds, minutes on a loaded machine


def _bagpipe(args: list[str], fork: bool = True) -> tuple[int, str, int | None]:
    """(exit code, stderr, peak resident bytes or None) of `bagpipe ARGS` in a process of its
    own: forked from the session's fork server (torch already imported, as a --procs rank is;
    no peak) where there is one and `fork`, else started afresh (its peak measured)."""
    server = forkserver.connect() if fork else None
    if server is None:
        try:
            p = subprocess.run([sys.executable, "-c", BAGPIPE_PEAK, *args], capture_output=True,
                               text=True, timeout=HANG_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"bagpipe {' '.join(args)}: still running after {HANG_S} s "
                                 "(hung?)") from None
        return p.returncode, p.stderr, int(p.stdout.split()[-1]) * 1024
    proc = forkserver.ForkedProcess(server, BAGPIPE, ["bagpipe", *args], dict(os.environ),
                                    subprocess.DEVNULL)
    try:
        err = proc.stderr.read()
        return proc.wait(timeout=HANG_S), err, None
    finally:
        proc.stderr.close()
        if proc.poll() is None:
            proc.kill()


def _saved_per_sample(cfg: ModelConfig) -> tuple[int, int]:
    """(parameters, floats autograd saves per sample) of the built model, measured."""
    def saved(batch: int) -> int:
        kept = {}

        def pack(t):
            base = t._base if t._base is not None else t
            kept[id(base)] = base.numel()
            return t

        emb = torch.zeros(batch, cfg.num_tables, row_dim(cfg), requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(torch.zeros(batch, cfg.num_dense), emb)
        return sum(kept.values())

    model = build_model(cfg)
    return sum(p.numel() for p in model.parameters()), saved(2) - saved(1)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_models_footprint_is_what_autograd_keeps(name):
    for dense, tables, dim, bottom, top in [(4, 8, 16, (64, 32), (64, 32)), (0, 5, 8, (), ()),
                                            (13, 3, 4, (7,), (5,)), (0, 2, 3, (3,), (2, 6))]:
        cfg = ModelConfig(name, dense, tables, dim, bottom_mlp=bottom, top_mlp=top)
        assert footprint(cfg) == _saved_per_sample(cfg), cfg


def _shape(**kw) -> mem.RunShape:
    base = dict(cardinalities=(1000, 50, 5000, 20), dense=4, row_dim=16, state_dim=0,
                eval_rows=2000, dense_params=10_000, kept_per_sample=400)
    return mem.RunShape(**{**base, **kw})


def test_every_process_of_a_job_is_counted_and_a_torchrun_job_machine_by_machine():
    cfg = TrainConfig(data="unused", transport="torch", servers=2, trainers=2, procs=5, emb_dim=256)
    shape = _shape(cardinalities=(10**6, 50, 5000, 20), row_dim=256)
    local = mem.estimate_run(cfg, spec("bagpipe"), shape)
    assert [p.role for p in local.here] == ["planner", "server", "server", "trainer", "trainer",
                                            "launcher"]
    assert local.here_bytes > local.estimate_bytes >= 5 * mem.BASE_PROCESS_BYTES
    # A torchrun job: each machine's ranks against that machine's memory (from every rank's
    # facts, so every rank decides alike); the launcher is torchrun's, not counted.
    job = mem.estimate_run(replace(cfg, procs=None), spec("bagpipe"), shape)
    assert job.here == [] and job.estimate_bytes == local.estimate_bytes
    server = job.ranks[1].bytes
    hosts = ["a", "b", "b", "a", "a"]  # the oracle and the trainers on a, the servers on b
    on_a = sum(job.ranks[r].bytes for r in (0, 3, 4))
    mem.check_hosts(cfg, shape, job, hosts, [on_a, 2 * server, 2 * server, on_a, on_a])
    with pytest.raises(ConfigError, match=r"in 2 processes\), more than b's .*; lower --emb-dim"):
        mem.check_hosts(cfg, shape, job, hosts, [on_a, 2 * server - 1, 0, on_a, on_a])
    with pytest.raises(ConfigError, match="in 3 processes\\), more than a's"):
        mem.check_hosts(cfg, shape, job, hosts, [on_a - 1, 10**15, 0, 0, 0])
    # Rank 0 ends holding every shard; a server, its half.
    assert job.ranks[0].held["tables"] == 2 * job.ranks[1].held["tables"] == 4 * shape.total_rows * 256
    # The steps of a replicated trainer grow with its share of the batch.
    big = mem.estimate_run(replace(cfg, batch_size=4 * cfg.batch_size), spec("bagpipe"), shape)
    assert big.ranks[-1].transient["activations"] > 3 * local.ranks[-1].transient["activations"]
    # Rank 0 keeps each row's home where bagpipe's cache is partitioned (N > 1).
    one = mem.estimate_run(replace(cfg, trainers=1, procs=4), spec("bagpipe"), shape)
    assert (local.ranks[0].held["planner"] - one.ranks[0].held["planner"]
            == mem.PARTITION_BYTES_PER_ROW * shape.total_rows)
    lru = [mem.estimate_run(replace(cfg, trainers=n, procs=n + 3), spec("lru"), shape) for n in (1, 2)]
    assert lru[0].ranks[0].held["planner"] == lru[1].ranks[0].held["planner"]


@pytest.mark.slow
@pytest.mark.extended
def test_a_run_whose_activations_do_not_fit_is_refused_in_one_line_before_it_allocates(
        tiny_dataset, tmp_path):
    # Tables of a quarter of this machine's memory fit; the activations of 8,192 samples of
    # rows that wide do not.
    meta = json.loads((tiny_dataset / "meta.json").read_text())
    rows = sum(meta["tables"][t]["cardinality"] for t in range(8))
    assert len(meta["tables"]) == 8
    emb_dim = machine_memory() // 4 // (4 * rows)
    tables = 4 * rows * emb_dim  # float32 bytes the tables alone would take
    out = tmp_path / "run"
    # A process started afresh (what a user starts), its peak memory measured: nothing but
    # the interpreter and its imports, not the tables (how long it takes is not the point:
    # seconds on an idle machine, more on a loaded one).
    code, err, peak = _bagpipe(["train", str(tiny_dataset), "--emb-dim", str(emb_dim),
                                "--batch-size", "8192", "--out", str(out)], fork=False)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"Error: --batch-size 8192 --emb-dim {emb_dim}: a training step over "
                          "8,192 samples of 8 rows"), err
    assert "(activations " in err and err.rstrip().endswith("lower --batch-size or --emb-dim")
    print(f"refused at a peak of {peak / 2**20:.0f} MiB (tables: {tables / 2**20:.0f} MiB): {err}")
    assert peak < mem.BASE_PROCESS_BYTES + tables / 2, (peak, tables)
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def wide_dataset(tmp_path_factory) -> Path:
    """The tiny layout with 200x the rows per table (2,016,000 in all)."""
    out = tmp_path_factory.mktemp("data") / "wide"
    generate(SynthConfig(preset="tiny", rows=5_000, scale=200, seed=0), out)
    return out


# Three shapes, each dominated by another part of the estimate.
SHAPES = {
    "tables": ("wide", ["--emb-dim", "32", "--batch-size", "256", "--system", "sync"]),
    "activations": ("tiny", ["--emb-dim", "4000", "--batch-size", "512", "--system", "sync"]),
    "dense model": ("tiny", ["--batch-size", "64", "--bottom-mlp", "2048,2048", "--top-mlp",
                             "2048,2048", "--dense-optimizer", "adam", "--system", "sync"]),
}


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.parametrize("part", list(SHAPES))
def test_the_estimate_is_within_2x_of_the_measured_peak(part, tiny_dataset, wide_dataset, tmp_path):
    data, options = SHAPES[part]
    ds = {"tiny": tiny_dataset, "wide": wide_dataset}[data]
    out = tmp_path / "run"
    code, err, _ = _bagpipe(["train", str(ds), *options, "--iterations", "3", "--warmup", "1",
                             "--eval-rows", "500", "--placement", "off", "--out", str(out)])
    assert code == 0, err
    m = json.loads((out / "summary.json").read_text())["memory"]
    parts = m["parts"]
    assert max((k for k in parts if k != "processes"), key=parts.__getitem__) == part, parts
    assert parts[part] > 100 * 2**20  # the part is real memory, not the process's own
    assert m["processes"] == 1 and m["peak_bytes"] > mem.BASE_PROCESS_BYTES / 2
    print(f"{part}: estimate {m['estimate_bytes'] / 2**20:.0f} MiB, peak {m['peak_bytes'] / 2**20:.0f} MiB")
    assert 0.5 < m["estimate_bytes"] / m["peak_bytes"] < 2, m


def test_profile_and_simulate_refuse_what_does_not_fit_in_one_line(tiny_dataset, tmp_path,
                                                                  monkeypatch):
    """Before they read a batch: a batch read fails the test at once (the refused simulation
    of 10^8 iterations would otherwise run for hours)."""
    def no_batch(*args, **kwargs):
        raise AssertionError("a batch was read before the refusal")

    monkeypatch.setattr(type(open_dataset(tiny_dataset)), "keys_block", no_batch)
    runner = CliRunner()
    out = tmp_path / "sim"
    r = runner.invoke(cli, ["simulate", str(tiny_dataset), "--compute-ms", "5", "--iterations",
                            "100000000", "--out", str(out)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    cached = ", ".join(s for s in SIMULATED_SYSTEMS if spec(s).capacity_from_peak)
    assert cached.startswith("lru, lfu, fae")  # the systems that plan over the trace
    assert f"--iterations 100000000 --batch-size 1024: the trace {cached} plan over" in r.output
    assert r.output.rstrip().endswith(f"lower --iterations, or leave {cached} out of --systems")
    assert not out.exists()
    # A machine of half what the profile needs: refused before the skew pass.
    shape = json.loads((tiny_dataset / "meta.json").read_text())
    need = mem.estimate_profile([t["cardinality"] for t in shape["tables"]], shape["rows"], 4096,
                                True, 1 << 25).bytes
    monkeypatch.setattr(mem, "machine_memory", lambda: need // 2)
    r = runner.invoke(cli, ["profile", str(tiny_dataset), "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert f"{mem.human_bytes(need // 2)}; " in r.output
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("trainers,hot_sample", [(1, 1.0), (2, 1.0), (4, 0.5), (8, 0.1)])
def test_a_replicated_hot_set_is_counted_at_no_less_than_it_holds(tiny_dataset, trainers, hot_sample):
    """sharded-hot's trainers hold its hot rows (and their state) beside their shard: the
    estimate's caches are at least the hot set the run chooses (none at one trainer)."""
    from bagpipe_cli.engine.planning.feed import key_batches
    from bagpipe_cli.engine.setup import estimate, prepare
    from bagpipe_cli.engine.systems.sharded_hot import rows_that_pay

    cfg = TrainConfig(data=str(tiny_dataset), system="sharded-hot", trainers=trainers, batch_size=256,
                      iterations=20, eval_rows=2000, hot_sample=hot_sample, optimizer="adagrad")
    s = prepare(cfg)
    hot = int(rows_that_pay(lambda: key_batches(s.ds, cfg, s.train_rows, s.offsets), cfg.iterations,
                            hot_sample, trainers, s.row_dim, s.total_rows).sum())
    shape, m = estimate(cfg)
    held = m.here[0].held["caches"]
    assert held >= mem.FLOAT * hot * (shape.row_dim + shape.state_dim)
    assert (held == 0) == (trainers == 1) and (hot == 0 or trainers > 1)
    assert trainers == 1 or hot > 0  # the bound is tested against a real set

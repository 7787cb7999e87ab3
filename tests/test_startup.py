"""A fast start: `bagpipe --help` and every command's `--help` import no heavy library
(torch, pandas, matplotlib); the light constants the options are built from equal the heavy
registries they stand for; the registry's lazily named builders are the engine's own.
Timings are in benchmarks/bench_startup.py, not here."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from bagpipe_cli.cli import COMMANDS, cli
from bagpipe_cli.engine import registry
from bagpipe_cli.engine.registry import SYSTEMS, Lazy

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pandas", "matplotlib")

# Runs `bagpipe --help` and then every `bagpipe CMD --help` in one fresh interpreter, as
# `python -m bagpipe_cli` does, and prints which heavy modules got imported.
PROBE = """
import json, sys
from bagpipe_cli.__main__ import main
for args in [[]] + [[c] for c in sys.argv[1:]]:
    sys.argv = ["bagpipe", *args, "--help"]
    try:
        main()
    except SystemExit as e:
        assert e.code in (0, None), (args, e.code)
print(json.dumps([m for m in HEAVY if m in sys.modules]), file=sys.stderr)
""".replace("HEAVY", repr(HEAVY))


def test_help_imports_no_heavy_library():
    r = subprocess.run([sys.executable, "-c", PROBE, *COMMANDS], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stderr.strip().splitlines()[-1]) == []
    for name in COMMANDS:
        assert f"bagpipe {name} [OPTIONS]" in r.stdout


def test_module_help_imports_no_heavy_library():
    """`python -m bagpipe_cli --help` itself (the brief's check, by sys.modules at exit)."""
    code = ("import runpy, sys, json; sys.argv = ['bagpipe', '--help']\n"
            "try:\n    runpy.run_module('bagpipe_cli', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert "Commands:" in r.stdout and json.loads(r.stderr.strip().splitlines()[-1]) == []


def test_the_group_lists_every_command_with_its_own_first_sentence():
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0
    for name, (target, summary) in COMMANDS.items():
        cmd = cli.commands[name]
        assert cmd.name == name and target.endswith(":" + cmd.callback.__name__)
        assert cmd.get_short_help_str(300) == summary, name
        assert f"  {name} " in r.output
    assert list(cli.commands) == list(COMMANDS)


def test_light_constants_equal_the_heavy_registries():
    from bagpipe_cli.engine import config
    from bagpipe_cli.engine.trainer import optim
    from bagpipe_cli.launch import placement
    from bagpipe_cli.models import MODELS
    from bagpipe_cli.simulate import cluster, volumes

    assert config.MODEL_NAMES == tuple(sorted(MODELS))
    assert config.EMB_OPTIMIZERS == optim.EMB_OPTIMIZERS
    assert cluster.RUNTIMES == volumes.RUNTIMES
    assert config.PLACEMENTS is placement.PLACEMENTS


def test_registry_builders_are_the_engines_own():
    from bagpipe_cli.engine.planning import builders as planner
    from bagpipe_cli.engine.systems import (
        CacheSystem,
        HetSystem,
        LocalSystem,
        SyncSystem,
        partitioned,
    )

    assert SYSTEMS["sync"].plan.resolve() is planner.no_plan
    assert SYSTEMS["bagpipe"].plan.resolve() is planner.lookahead_plan
    assert SYSTEMS["sync"].build_system.resolve() == SyncSystem.build
    assert SYSTEMS["het"].build_system.resolve() == HetSystem.build
    assert SYSTEMS["local"].build_system.resolve() == LocalSystem.build
    built = SYSTEMS["lru"].build_system.resolve()
    assert built.func == CacheSystem.build and built.keywords == {"prefetch_ahead": False, "lrpp": False}
    # bagpipe: the replicated CacheSystem in-process, the partitioned cache on a trainer rank
    assert SYSTEMS["bagpipe"].build_system.resolve() is partitioned.bagpipe_system
    for s in SYSTEMS.values():  # every name resolves (the policy plans are made here)
        assert callable(s.plan.resolve())
        assert s.build_system is None or callable(s.build_system.resolve())


def test_lazy_binds_like_partial_and_pickles():
    f = Lazy("builtins:int", base=2)
    assert f("101") == 5 and "base=2" in repr(f)
    assert f("101") == 5
    again = pickle.loads(pickle.dumps(f))  # what it resolved to is not pickled: resolved anew
    assert again._fn is None and again("11") == 3 and again._fn is not None
    assert registry.PLANNER == "bagpipe_cli.engine.planning.builders"


def test_the_engine_package_exports_its_functions():
    import bagpipe_cli.engine as engine
    from bagpipe_cli.engine import TrainConfig, run, save_model, train

    assert callable(run) and run is train and engine.run is run
    assert save_model.__module__ == "bagpipe_cli.engine.records.model_file"
    assert TrainConfig.__module__ == "bagpipe_cli.engine.config"

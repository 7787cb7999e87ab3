import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Plots are written headless, and rich must not try to drive a terminal in tests.
os.environ.setdefault("MPLBACKEND", "Agg")

# Property tests check results, never speed: no per-example deadline and no "too slow" health
# check, which a loaded machine (the suite shares 2 cores) would trip. A test's own
# @settings inherits these (they are the default when the test modules are imported).
settings.register_profile("shared-machine", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-machine")

# Small real click logs (Criteo, Avazu, TalkingData), in the repository with their provenance
# and licences (tests/data/real/README.md), so no test skips for want of them.
REAL_DATA = Path(__file__).resolve().parent / "data" / "real"


@pytest.fixture
def real_data() -> Path:
    assert REAL_DATA.is_dir(), f"{REAL_DATA} is missing: it is part of the repository"
    return REAL_DATA


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """A small synthetic dataset shared by tests (do not modify it)."""
    from bagpipe_cli.data.synth import SynthConfig, generate

    out = tmp_path_factory.mktemp("data") / "tiny"
    generate(SynthConfig(preset="tiny", rows=20_000, seed=0), out)
    return out


@pytest.fixture(scope="session", autouse=True)
def fork_server(tmp_path_factory):
    """Every local job of the session (`--procs`, in this process or in a `bagpipe`
    subprocess) forks its ranks from one server that imported torch once
    (bagpipe_cli/launch/forkserver.py): about 2 CPU-seconds saved per rank.
    BAGPIPE_TEST_FORKSERVER=0 starts ranks as plain processes instead."""
    from bagpipe_cli.launch import forkserver

    if os.environ.get("BAGPIPE_TEST_FORKSERVER", "1") == "0":
        yield None
        return
    path = str(tmp_path_factory.mktemp("forkserver") / "socket")
    proc = forkserver.start(path)
    os.environ[forkserver.ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(forkserver.ENV, None)
        proc.terminate()
        proc.wait(timeout=30)

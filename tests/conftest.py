import os
from pathlib import Path

import pytest

# Plots are written headless, and rich must not try to drive a terminal in tests.
os.environ.setdefault("MPLBACKEND", "Agg")

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

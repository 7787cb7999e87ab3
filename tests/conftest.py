import os
from pathlib import Path

import pytest

# Plots are written headless, and rich must not try to drive a terminal in tests.
os.environ.setdefault("MPLBACKEND", "Agg")

REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "real"


@pytest.fixture
def real_data() -> Path:
    if not REAL_DATA.is_dir():
        pytest.skip(f"real sample data not present at {REAL_DATA}")
    return REAL_DATA


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """A small synthetic dataset shared by tests (do not modify it)."""
    from bagpipe_cli.data.synth import SynthConfig, generate

    out = tmp_path_factory.mktemp("data") / "tiny"
    generate(SynthConfig(preset="tiny", rows=20_000, seed=0), out)
    return out

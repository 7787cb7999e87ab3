# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# Installed before the package: a bare `torch` requirement with no torch present would
# pull a multi-GB CUDA build. Override e.g. TORCH_SPEC="torch==2.13.0+cu126 --index-url ...".
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-all test-fast lint clean torchrec

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# The main job on the embedded default: every system on a 1/100-scale Criteo-like synthetic
# dataset (generated on first use) with and without an emulated slow network, then the report.
DEMO_BENCH ?= results/bench-demo
demo: $(STAMP)
	rm -rf $(DEMO_BENCH)
	$(BIN)/bagpipe bench --quick --out $(DEMO_BENCH)
	$(BIN)/bagpipe report $(DEMO_BENCH) --out $(DEMO_BENCH)/report --format png,svg,html,md
	@echo "report: $(DEMO_BENCH)/report/report.html (Markdown: $(DEMO_BENCH)/report/report.md; figures and summary.csv next to them)"

# What CI runs (.ci/run holds it, install included, to 6 minutes on 2 cores): every test but
# the failure-handling ones that start processes and wait on them, and the largest size of a
# few tests whose smaller sizes run here (marked extended).
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not extended"

# Every test, the extended ones too (signals, kills, races, timeouts): run before a change to
# the launcher, the outputs or the engine's failure paths lands.
test-all: $(STAMP)
	$(BIN)/python -m pytest -q

# Everything but the tests that start real processes (marked slow).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check bagpipe_cli tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Optional: the TorchRec CPU baseline (`--system torchrec`), matched to torch 2.13. torchrec's
# metadata asks for the CUDA fbgemm-gpu, which would replace the CPU build: install it --no-deps.
torchrec: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check fbgemm-gpu-cpu==1.8.0 tensordict 'torchmetrics==1.0.3' tqdm pyre-extensions
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps torchrec==1.8.0
	$(BIN)/python -c "import torch, torchrec, fbgemm_gpu; print('torchrec', torchrec.__version__, 'with torch', torch.__version__)"

# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
# Installed before the package: a bare `torch` requirement with no torch present would
# pull a multi-GB CUDA build. Override e.g. TORCH_SPEC="torch==2.13.0+cu126 --index-url ...".
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= results/demo

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# The main job on the embedded default: a 1/100-scale Criteo-like dataset, its access
# profile, and Bagpipe vs synchronous training over an emulated slow network.
DEMO_TRAIN := --batch-size 2048 --iterations 100 --lookahead 16 --optimizer adagrad --lr 0.05 \
	--net-gbps 0.25 --net-latency-us 50 --overwrite
demo: $(STAMP)
	$(BIN)/bagpipe synth --out $(DEMO_DIR)/data --preset criteo-kaggle --scale 0.01 --rows 300000 --overwrite
	$(BIN)/bagpipe profile $(DEMO_DIR)/data --batch-size 2048 --lookahead 4,16,64 --out $(DEMO_DIR)/profile --overwrite
	$(BIN)/bagpipe train $(DEMO_DIR)/data --system sync $(DEMO_TRAIN) --out $(DEMO_DIR)/sync
	$(BIN)/bagpipe train $(DEMO_DIR)/data --system bagpipe $(DEMO_TRAIN) --out $(DEMO_DIR)/bagpipe
	@echo "demo outputs in $(DEMO_DIR)/: data, profile (profile.json, CSVs, PNGs), sync and bagpipe runs"

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check bagpipe_cli tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

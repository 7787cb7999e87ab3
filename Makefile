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

demo: $(STAMP)
	$(BIN)/bagpipe synth --out $(DEMO_DIR)/data --preset criteo-kaggle --scale 0.01 --rows 500000 --overwrite

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check bagpipe_cli tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

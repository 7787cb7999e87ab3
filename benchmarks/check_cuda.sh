#!/usr/bin/env bash
# The prepared GPU check (under 6 minutes on one GPU): the CUDA tests, which assert bitwise
# equality (torch.equal), then the engine against hand-written loops side by side
# (benchmarks/bench_gpu.py: hand, one-table, local, sync, bagpipe, in-process and --procs,
# B = 1,024 and 16,384) and the feed alone (benchmarks/bench_feed.py). Nothing is installed:
# the repository goes on PYTHONPATH (the machine's python3 has torch with CUDA, click, rich,
# pandas, pyarrow, matplotlib, pyyaml and pytest).
#
#     bash benchmarks/check_cuda.sh [cuda|cuda:K|cpu]
#
# `cpu` runs the same on the CPU (the CUDA tests skip), so the script can be tried anywhere;
# there the benchmark runs fewer iterations and only B = 1,024.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DEVICE=${1:-cuda}
PY=${PYTHON:-python3}
if [ "$DEVICE" = cpu ]; then
  SIZES=1024; ITERS=20; ROWS=200000
else
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name(0), torch.cuda.device_count(), 'GPU(s)')"
  SIZES=1024,16384; ITERS=60; ROWS=600000
fi
timeout 150 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_models.py -k cuda
timeout 240 "$PY" benchmarks/bench_gpu.py --device "$DEVICE" --batch-sizes "$SIZES" \
  --iterations "$ITERS" --rows "$ROWS" --repeat 1
timeout 120 "$PY" benchmarks/bench_feed.py --repeats 1 --rows 2000000 --iterations 120

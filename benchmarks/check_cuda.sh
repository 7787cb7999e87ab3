#!/usr/bin/env bash
# The engine's checks on a GPU, as one short script for a machine with CUDA (its python3 has
# torch with CUDA, click, rich, pandas, pyarrow, matplotlib, pyyaml, pytest and hypothesis;
# nothing is installed: the repository goes on PYTHONPATH). First the tests that skip without
# CUDA (distributed trainers on the GPU against the CPU engine, gloo and, with two GPUs, NCCL;
# the models on CUDA), then the distributed benchmark with the trainers on the GPU.
#
#     bash benchmarks/check_cuda.sh [cuda|cuda:K] [gloo|nccl]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DEVICE=${1:-cuda}
BACKEND=${2:-gloo}
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name(0), torch.cuda.device_count(), 'GPU(s)')"
python3 -m pytest -q -rs -p no:cacheprovider tests/test_distributed.py tests/test_models.py -k cuda
python3 benchmarks/bench_distributed.py --device "$DEVICE" --backend "$BACKEND" --repeat 2 --iterations 40

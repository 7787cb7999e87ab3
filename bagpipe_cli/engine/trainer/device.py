"""Where a trainer computes (`--device cpu|cuda|cuda:K|auto`), and what makes a GPU exact.

The model, the trainer cache and `local`'s tables live on the trainer's device; servers and
the oracle stay on the CPU. On a GPU, results stay bitwise those of `sync` and of a repeated
run because (a) torch runs its deterministic kernels (the sums of row gradients are a sorted
segment sum instead of atomic adds; cuBLAS with a fixed workspace), unless
`--nondeterministic` trades that away, and (b) the row optimizer is written in elementwise
operations that round the same on a CPU and a GPU (`engine/trainer/optim.py`), so a row updated on a
server's CPU (sync) equals the same row updated in a GPU cache (bagpipe).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from bagpipe_cli.errors import ConfigError


def cuda_count() -> int:
    """CUDA devices this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pick(device: str, gpus: int, nth: int = 0, where: str = "this machine") -> str:
    """The device `device` names for the `nth` trainer of a machine with `gpus` CUDA devices:
    auto is a GPU where there is one; cuda gives the trainers the GPUs in turn."""
    if device == "cpu" or (device == "auto" and gpus == 0):
        return "cpu"
    if gpus == 0:
        raise ConfigError(f"--device {device}: {where} has no CUDA device "
                          "(torch.cuda.is_available() is False); use --device cpu or auto")
    if device in ("auto", "cuda"):
        return f"cuda:{nth % gpus}"
    k = int(device.split(":", 1)[1])
    if k >= gpus:
        raise ConfigError(f"--device {device}: {where} has {gpus} CUDA device(s) (cuda:0.."
                          f"cuda:{gpus - 1})")
    return device


def describe(device: str | torch.device) -> dict[str, Any]:
    """What config.json records of a trainer's device: its name, and the GPU's model."""
    d = torch.device(device)
    if d.type != "cuda":
        return {"device": str(d), "gpu": None}
    return {"device": str(d), "gpu": torch.cuda.get_device_name(d)}


@contextlib.contextmanager
def computing_on(device: str | torch.device, deterministic: bool = True) -> Iterator[torch.device]:
    """Compute on `device` for a block: on a GPU, make it the current device and (when
    `deterministic`) switch torch to its deterministic kernels; both are restored after."""
    d = torch.device(device)
    if d.type != "cuda":
        yield d
        return
    torch.cuda.set_device(d)
    before = torch.are_deterministic_algorithms_enabled()
    if deterministic:
        # cuBLAS is deterministic only with a fixed workspace (read when a handle is made).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    try:
        yield d
    finally:
        torch.use_deterministic_algorithms(before)


def to_cpu(obj: Any) -> Any:
    """Tensors in (nested) dicts, lists and tuples moved to the CPU (for rank 0, checkpoints)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj

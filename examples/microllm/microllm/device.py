"""Where a rank's tensors live, and the compute dtype that follows the device.

``parallel.device`` is ``auto`` (CUDA when a GPU is visible, else CPU), ``cpu`` or ``cuda``.
The visible GPUs are whatever ``CUDA_VISIBLE_DEVICES`` leaves (FastCI's launcher sets it to the
GPUs it gave the test). Ranks simulated as threads of one process share the visible devices
round-robin (rank ``r`` on ``cuda:r % count``); process ranks do the same and talk over NCCL
when every process has a GPU of its own, over gloo (through host memory) otherwise.

``precision.dtype=auto`` computes in bf16 on CUDA and in fp32 on CPU; an explicit dtype is
what a test that validates a dtype freezes, and it is kept on every device.
"""

from __future__ import annotations

import os

import torch

from microllm import MicroLLMError

from microllm.config import DEVICES
_AUTO_DTYPE = {"cuda": "bf16", "cpu": "fp32"}


def cuda_count() -> int:
    """GPUs this process can see (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(spec: str, count: int | None = None) -> str:
    """The device kind a run uses: ``cpu`` or ``cuda``.

    Raises:
        MicroLLMError: ``cuda`` was asked for and no GPU is visible.
    """
    visible = cuda_count() if count is None else count
    if spec == "auto":
        return "cuda" if visible else "cpu"
    if spec == "cuda" and not visible:
        raise MicroLLMError("device=cuda but no CUDA device is visible "
                            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
    if spec not in DEVICES:
        raise MicroLLMError(f"device {spec!r} not in {DEVICES}")
    return spec


def rank_device(kind: str, rank: int, count: int | None = None) -> torch.device:
    """The device of global rank ``rank``: ranks share the visible GPUs round-robin."""
    if kind == "cpu":
        return torch.device("cpu")
    visible = cuda_count() if count is None else count
    return torch.device("cuda", rank % max(visible, 1))


def process_transport(kind: str, world_size: int, count: int | None = None) -> str:
    """``nccl`` when every process rank has a GPU of its own, else ``gloo``."""
    visible = cuda_count() if count is None else count
    return "nccl" if kind == "cuda" and visible >= world_size else "gloo"


def compute_dtype_name(dtype: str, kind: str) -> str:
    """The compute dtype a run uses: ``auto`` follows the device, anything else is kept."""
    return _AUTO_DTYPE[kind] if dtype == "auto" else dtype


def prepare(kind: str) -> None:
    """Process-wide settings for reproducible CUDA runs (call before the first CUDA kernel).

    Deterministic cuBLAS needs a fixed workspace; TF32 off keeps fp32 matmuls fp32, so parity
    and golden checks compare fp32 against fp32.
    """
    if kind != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

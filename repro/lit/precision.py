"""The suite's precision policy: bf16-mixed on a CUDA GPU that has bf16, full fp32 everywhere else.

A GPU without bf16 (before Ampere) gets ``32-true``, not ``16-mixed``: fp16 needs a loss scaler,
which the pipeline strategy cannot share across stages and refuses, so one policy serves both
single-process runs and pipelines."""

from __future__ import annotations

import torch


def default_precision(accelerator: object) -> str:
    """Lightning precision for an accelerator name ('cpu', 'gpu', 'cuda', 'auto') or object."""
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    uses_gpu = name in ("gpu", "cuda") or "cuda" in name or (name == "auto" and torch.cuda.is_available())
    if uses_gpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"

"""The suite's precision policy: bf16-mixed where a CUDA GPU is used, full fp32 on a CPU."""

from __future__ import annotations

import torch


def default_precision(accelerator: object) -> str:
    """Lightning precision for an accelerator name ('cpu', 'gpu', 'cuda', 'auto') or object."""
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    uses_gpu = name in ("gpu", "cuda") or "cuda" in name or (name == "auto" and torch.cuda.is_available())
    if uses_gpu:
        return "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "16-mixed"
    return "32-true"

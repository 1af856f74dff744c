"""Partial rotary position embedding with per-layer width.

The rotated slice of a head is always its first ``width`` dims, rotated GPT-NeoX style
(pairs ``(i, i + width/2)``); the remaining dims carry no position (NoPE).
Frequencies (PROTOCOL.md §R1):
  - ``neox``:  theta_i = base^(-2i / width),          i < width/2
  - ``prope``: theta_i = base^(-2i / reference_dim),  i < width/2
    (p-RoPE keeps the width/2 highest frequencies of a full-width RoPE over reference_dim;
    the pairs it drops are the NoPE dims). Placing the kept pairs in the first dims instead of
    their full-width positions is a fixed permutation of the head dims, which the learned
    projections absorb.

cos/sin tables are computed once per (width, convention, reference_dim, base, length, device)
and cached; forward passes slice them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_TABLE_BUILDS = 0  # how many tables were computed (tests read it to check the cache)


def rope_frequencies(width: int, convention: str, reference_dim: int, base: float) -> torch.Tensor:
    """Angular frequencies theta_i (float64, shape (width/2,)) of a rotated slice of ``width`` dims."""
    if width % 2 != 0 or width < 0:
        raise ValueError(f"rope width={width}: must be an even integer >= 0")
    half = width // 2
    exponents = torch.arange(half, dtype=torch.float64) * 2.0
    if convention == "neox":
        return base ** (-exponents / width) if width > 0 else torch.zeros(0, dtype=torch.float64)
    if convention == "prope":
        if width > reference_dim:
            raise ValueError(
                f"rope width={width}: p-RoPE cannot keep more than reference_dim={reference_dim} dims"
            )
        return base ** (-exponents / reference_dim)
    raise ValueError(f"rope_convention={convention!r}: allowed values are ('neox', 'prope')")


class RopeTable(NamedTuple):
    cos: torch.Tensor  # (length, width), float32
    sin: torch.Tensor  # (length, width), float32


def rope_table(
    width: int,
    length: int,
    convention: str = "neox",
    reference_dim: int | None = None,
    base: float = 10000.0,
    device: torch.device | str | None = None,
) -> RopeTable:
    """Cached cos/sin of shape (length, width) laid out for rotate-half (each frequency twice)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    reference_dim = width if reference_dim is None else reference_dim
    key = (width, length, convention, reference_dim, float(base), device)
    table = _TABLES.get(key)
    if table is None:
        global _TABLE_BUILDS
        # Tables are shared between training and evaluation: build them as ordinary tensors even
        # when the first call comes from inside torch.inference_mode (Lightning's validation).
        with torch.inference_mode(False), torch.no_grad():
            freqs = rope_frequencies(width, convention, reference_dim, base)
            positions = torch.arange(length, dtype=torch.float64)
            angles = torch.outer(positions, freqs)  # (length, width/2)
            angles = torch.cat([angles, angles], dim=-1)  # (length, width)
            table = (angles.cos().float().to(device), angles.sin().float().to(device))
        _TABLES[key] = table
        _TABLE_BUILDS += 1
    return RopeTable(*table)


def rope_table_builds() -> int:
    """Number of cos/sin tables computed so far in this process."""
    return _TABLE_BUILDS


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of x.

    x: (B, T, H, D); cos, sin: (T, width) or broadcastable to (B, T, H, width). Returns x's dtype.
    """
    width = cos.shape[-1]
    if width == 0:
        return x
    if cos.dim() == 2:  # (T, width) -> (T, 1, width): broadcast over batch and heads
        cos, sin = cos[:, None, :], sin[:, None, :]
    rot, rest = x[..., :width], x[..., width:]
    rot32 = rot.float()
    rotated = (rot32 * cos + rotate_half(rot32) * sin).to(x.dtype)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


def apply_rope_with_phase_off(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads_off: torch.Tensor | None
) -> torch.Tensor:
    """Rotate x except that heads flagged in ``heads_off`` (bool, (H,)) get angle 0 (cos=1, sin=0).

    ``heads_off=None`` means every head is phase-off, i.e. x is returned unchanged.
    """
    if heads_off is None:
        return x
    rotated = apply_rope(x, cos, sin)
    return torch.where(heads_off.view(1, 1, -1, 1).to(x.device), x, rotated)

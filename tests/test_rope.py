"""Facts about partial RoPE: zero width, equality with standard RoPE, relative positions, p-RoPE."""

from __future__ import annotations

import math

import pytest
import torch

from repro.models.rope import apply_rope, rope_frequencies, rope_table, rope_table_builds


def reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Standard (GPT-NeoX / Llama-HF) RoPE written independently with complex numbers:
    pair (x_i, x_{i+d/2}) is the complex number z_i, multiplied by exp(1j * pos * base^(-2i/d))."""
    d = x.shape[-1]
    half = d // 2
    theta = torch.tensor([base ** (-2 * i / d) for i in range(half)], dtype=torch.float64)
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    angle = positions.double()[:, None] * theta[None, :]  # (T, d/2)
    z = z * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    return torch.cat([z.real, z.imag], dim=-1).float()


def rotate(
    x: torch.Tensor, width: int, convention: str = "neox", reference_dim: int | None = None
) -> torch.Tensor:
    table = rope_table(width, x.shape[1], convention, reference_dim or x.shape[-1])
    return apply_rope(x, table.cos, table.sin)


def test_zero_width_leaves_queries_and_keys_unchanged():
    x = torch.randn(2, 16, 3, 32)
    assert torch.equal(rotate(x, 0), x)


def test_full_width_neox_equals_standard_rope():
    torch.manual_seed(0)
    x = torch.randn(2, 40, 3, 32)
    expected = reference_rope(x[0:1].expand(2, -1, -1, -1), torch.arange(40))
    got = rotate(x[0:1].expand(2, -1, -1, -1).contiguous(), 32)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", [8, 16])
def test_partial_width_rotates_only_the_first_dims(width):
    torch.manual_seed(1)
    x = torch.randn(1, 24, 2, 32)
    out = rotate(x, width)
    assert torch.equal(out[..., width:], x[..., width:])
    # the rotated slice is a standard RoPE of width `width`
    torch.testing.assert_close(
        out[..., :width], reference_rope(x[..., :width], torch.arange(24)), rtol=1e-5, atol=1e-5
    )
    # rotation preserves the norm of every (position, head) vector
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("convention", ["neox", "prope"])
@pytest.mark.parametrize("width", [4, 16, 32])
def test_scores_depend_only_on_relative_position(convention, width):
    """q at position m and k at n: the score of the rotated vectors depends on n - m only."""
    torch.manual_seed(2)
    T, d = 48, 32
    q = torch.randn(d).expand(1, T, 1, d).contiguous()  # the same query at every position
    k = torch.randn(d).expand(1, T, 1, d).contiguous()  # the same key at every position
    qr, kr = rotate(q, width, convention, d)[0, :, 0], rotate(k, width, convention, d)[0, :, 0]
    scores = qr @ kr.T  # (T, T): scores[m, n]
    for shift in (1, 7, 20):
        torch.testing.assert_close(scores[shift:, shift:], scores[:-shift, :-shift], rtol=1e-4, atol=1e-4)
    # and the rotated dims really carry position: scores vary along a diagonal offset
    assert scores[0].std() > 1e-3


def test_prope_keeps_the_highest_frequencies():
    d_h, r = 32, 8
    full = rope_frequencies(d_h, "neox", d_h, 10000.0)  # all d_h/2 frequencies, decreasing
    kept = rope_frequencies(r, "prope", d_h, 10000.0)
    assert torch.equal(kept, full[: r // 2])
    assert kept.min() >= full.sort(descending=True).values[r // 2 - 1]
    # neox re-spreads its r/2 frequencies down to base^(-(r-2)/r), far lower than p-RoPE's lowest
    neox = rope_frequencies(r, "neox", d_h, 10000.0)
    assert neox[0] == kept[0] == 1.0
    assert neox[-1] < kept[-1]
    assert math.isclose(float(neox[-1]), 10000.0 ** (-(r - 2) / r))


def test_rope_tables_are_built_once_per_width_and_length():
    before = rope_table_builds()
    a = rope_table(12, 333, "neox", 12, 10000.0)
    b = rope_table(12, 333, "neox", 12, 10000.0)
    assert a.cos is b.cos and rope_table_builds() == before + 1
    rope_table(12, 333, "prope", 32, 10000.0)
    assert rope_table_builds() == before + 2


def test_rope_table_built_in_inference_mode_can_be_used_for_training():
    with torch.inference_mode():
        table = rope_table(6, 77, "neox", 6, 10000.0)
    x = torch.randn(1, 77, 1, 6, requires_grad=True)
    apply_rope(x, table.cos, table.sin).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()

"""Compressors: payload sizes, special cases, error bounds, bit-packing, spec parsing."""

from __future__ import annotations

import math

import pytest
import torch

from repro.pipeline.bitpack import pack_bits, packed_nbytes, unpack_bits
from repro.pipeline.compressors import Quantize, build_compressor

SPECS = [
    "identity",
    "fp16",
    "bf16",
    "topk(0.05)",
    "topk(1.0)",
    "randk(0.1)",
    "quant(2)",
    "quant(4)",
    "quant(8)",
    "quant(3,stochastic)",
    "quant(5,scale=bf16)",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("shape", [(2, 8, 16), (3, 5, 7), (1, 1, 300)])
def test_payload_size_is_what_payload_nbytes_says_and_decodes_to_the_shape(spec, shape):
    comp = build_compressor(spec)
    x = torch.randn(shape)
    payload = comp.compress(x, seed=7)
    assert payload.data.dtype == torch.uint8 and payload.data.dim() == 1
    assert payload.nbytes == comp.payload_nbytes(shape, x.dtype)
    x_hat = comp.decompress(payload, shape, x.dtype, seed=7)
    assert x_hat.shape == x.shape and x_hat.dtype == x.dtype


def test_identity_and_topk_full_ratio_are_exact():
    x = torch.randn(4, 16, 32)
    for spec in ("identity", "topk(1.0)"):
        comp = build_compressor(spec)
        assert torch.equal(comp.decompress(comp.compress(x), x.shape, x.dtype), x)


def test_topk_keeps_the_largest_entries_and_sends_values_plus_smallest_indices():
    x = torch.randn(2, 8, 16)  # 256 entries: uint8 indices
    comp = build_compressor("topk(0.1)")
    k = math.ceil(0.1 * x.numel())
    assert comp.payload_nbytes(x.shape, torch.float32) == k * (4 + 1)
    x_hat = comp.decompress(comp.compress(x), x.shape, x.dtype)
    kept = x_hat != 0
    assert int(kept.sum()) == k
    assert float(x.abs()[~kept].max()) <= float(x.abs()[kept].min())
    assert torch.equal(x_hat[kept], x[kept])
    assert comp.payload_nbytes((4, 64, 64), torch.float32) == math.ceil(0.1 * 16384) * (
        4 + 2
    )  # int16 indices


def test_randk_both_ends_pick_the_same_entries_from_the_seed():
    x = torch.randn(2, 8, 16)
    comp = build_compressor("randk(0.25)")
    payload = comp.compress(x, seed=123)
    x_hat = comp.decompress(payload, x.shape, x.dtype, seed=123)
    kept = x_hat != 0
    assert int(kept.sum()) == math.ceil(0.25 * x.numel())
    assert torch.equal(x_hat[kept], x[kept])  # not rescaled
    other = comp.decompress(payload, x.shape, x.dtype, seed=124)
    assert not torch.equal(other != 0, kept)


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("grid", ["fixed", "span"])
def test_quant_error_is_bounded_per_channel(bits, grid):
    """span: half of its 2 / (2**bits - 1) level spacing; fixed: one step s / 2**(bits-1) (half a step
    inside the grid, a whole one where its top code clips)."""
    torch.manual_seed(bits)
    x = torch.randn(4, 16, 32) * torch.linspace(0.01, 10, 32)  # channels of very different scales
    comp = Quantize(bits, grid=grid)
    x_hat = comp.decompress(comp.compress(x), x.shape, x.dtype)
    scale = x.abs().amax(dim=(0, 1)).to(torch.float16).float()
    bound = scale / (2**bits - 1) if grid == "span" else scale / 2 ** (bits - 1)
    err = (x_hat - x).abs().amax(dim=(0, 1))
    assert torch.all(err <= bound * 1.001 + 1e-7)


def test_the_fixed_grid_has_a_zero_level_and_the_span_grid_has_none_by_hand():
    # one channel with absmax 1.0; 2 bits. fixed: step 1/2, codes -2..1; span: levels -1, -1/3, 1/3, 1
    x = torch.tensor([1.0, 0.6, 0.2, 0.0, -0.3, -1.0]).reshape(6, 1)
    fixed, span = Quantize(2), Quantize(2, grid="span")
    s = torch.ones(1)
    assert fixed.codes(x, s).flatten().tolist() == [3, 3, 2, 2, 1, 0]
    assert fixed.values(fixed.codes(x, s), s).flatten().tolist() == [0.5, 0.5, 0.0, 0.0, -0.5, -1.0]
    assert span.codes(x, s).flatten().tolist() == [3, 2, 2, 2, 1, 0]
    third = pytest.approx(1 / 3)
    assert span.values(span.codes(x, s), s).flatten().tolist() == [
        1.0,
        third,
        third,
        third,
        pytest.approx(-1 / 3),
        -1.0,
    ]
    for comp in (fixed, span):  # the decoded message is exactly these values, at the same payload size
        payload = comp.compress(x.reshape(1, 6, 1))
        assert (
            payload.nbytes == 2 + 2 == comp.payload_nbytes((1, 6, 1), torch.float32)
        )  # fp16 scale + 12 bits
        assert comp.decompress(payload, (1, 6, 1), torch.float32).flatten().tolist() == pytest.approx(
            comp.values(comp.codes(x, s), s).flatten().tolist()
        )
    assert (
        build_compressor("quant(2)").grid == "fixed"
        and build_compressor("quant(2,grid=span)").spec == "quant(2,grid=span)"
    )


def test_on_heavy_tailed_data_only_the_zero_level_grid_is_contractive_at_2_bits():
    torch.manual_seed(0)
    x = torch.distributions.StudentT(torch.tensor(2.0)).sample((8, 64, 32))
    rel = {}
    for grid in ("fixed", "span"):
        comp = Quantize(2, grid=grid)
        rel[grid] = float((comp.decompress(comp.compress(x), x.shape, x.dtype) - x).norm() / x.norm())
    assert rel["fixed"] < 1.0 < rel["span"]


def test_quant8_on_smooth_data_is_close_and_bytes_are_a_quarter_plus_scales():
    t = torch.linspace(0, 6.28, 64)
    x = torch.stack([torch.sin(t + c) for c in torch.linspace(0, 1, 48)], dim=-1).unsqueeze(0).repeat(2, 1, 1)
    comp = build_compressor("quant(8)")
    x_hat = comp.decompress(comp.compress(x), x.shape, x.dtype)
    assert float((x_hat - x).norm() / x.norm()) < 0.005
    assert comp.payload_nbytes(x.shape, torch.float32) == x.numel() + 48 * 2


def test_quant_scale_is_never_below_the_channel_absmax_even_for_tiny_gradients():
    x = torch.randn(2, 8, 16) * 3e-6  # fp16 subnormal range
    comp = Quantize(4)
    x_hat = comp.decompress(comp.compress(x), x.shape, x.dtype)
    scale = comp._scale(x.reshape(-1, 16).float()).float()
    assert torch.all(scale >= x.abs().reshape(-1, 16).amax(0))
    assert float((x_hat - x).norm() / x.norm()) < 0.5


def test_stochastic_quant_is_unbiased_on_average():
    x = torch.full((1, 4, 1), 0.3)  # one channel (the last dimension) of four values
    x[0, 0, 0] = 1.0  # sets the channel's scale
    for grid in ("fixed", "span"):
        comp = build_compressor(f"quant(2,stochastic,grid={grid})")
        mean = torch.stack(
            [comp.decompress(comp.compress(x, seed=s), x.shape, x.dtype, seed=s) for s in range(400)]
        ).mean(0)
        assert abs(float(mean[0, 1, 0]) - 0.3) < 0.05, grid


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1001])
def test_bit_packing_round_trips_for_every_width(bits, n):
    values = torch.randint(0, 2**bits, (n,), dtype=torch.uint8)
    packed = pack_bits(values, bits)
    assert packed.numel() == packed_nbytes(n, bits) == math.ceil(n * bits / 8)
    assert torch.equal(unpack_bits(packed, bits, n), values)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("quant(1)", "2..8"),
        ("quant(9)", "2..8"),
        ("quant", "number of bits"),
        ("topk(0)", "(0, 1]"),
        ("topk(1.5)", "(0, 1]"),
        ("randk(-0.1)", "(0, 1]"),
        ("zip", "unknown compressor"),
        ("quant(4,fast)", "fast"),
    ],
)
def test_bad_compressor_specs_fail_with_the_field_and_the_allowed_values(spec, fragment):
    with pytest.raises(ValueError) as info:
        build_compressor(spec, "strategy fwd_compressor")
    assert "strategy fwd_compressor" in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize("grid", ["fixed", "span"])
def test_quant_clips_a_channel_beyond_the_fp16_scale_range_instead_of_sending_inf(grid):
    """A gradient spike of 4e5 (measured in a cpu-scale run) is out of fp16's range: the channel is
    clipped to 65504, the others are untouched, and nothing decodes to inf or NaN."""
    comp = build_compressor(f"quant(8,grid={grid})")
    x = torch.tensor([[[4.0e5, 0.5], [-1.0e3, -0.25]]])
    y = comp.decompress(comp.compress(x), x.shape, x.dtype)
    assert torch.isfinite(y).all()
    assert float(y[0, 0, 0]) == pytest.approx(65504.0, rel=0.01)
    assert float(y[0, 0, 1]) == pytest.approx(0.5, rel=0.01) and float(y[0, 1, 1]) == pytest.approx(
        -0.25, abs=0.01
    )
    fp32 = build_compressor(f"quant(8,scale=fp32,grid={grid})")
    assert float(fp32.decompress(fp32.compress(x), x.shape, x.dtype)[0, 0, 0]) == pytest.approx(
        4.0e5, rel=0.01
    )

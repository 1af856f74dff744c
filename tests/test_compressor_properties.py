"""Property-based checks of the compressors (hypothesis): for any shape and any finite values,
the payload has the analytical size, decodes to the same shape and dtype, and each compressor
keeps its promise (exact, largest entries, shared random entries, bounded quantization error)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.pipeline.compressors import build_compressor

shapes = st.lists(st.integers(1, 12), min_size=1, max_size=3).map(tuple)
ratios = st.sampled_from([0.01, 0.1, 0.3, 0.5, 1.0])
specs = st.one_of(
    st.sampled_from(["identity", "fp16", "bf16"]),
    ratios.map(lambda r: f"topk({r})"),
    ratios.map(lambda r: f"randk({r})"),
    st.tuples(st.integers(2, 8), st.booleans(), st.sampled_from(["fixed", "span"])).map(
        lambda t: f"quant({t[0]}{',stochastic' if t[1] else ''},grid={t[2]})"
    ),
)


@st.composite
def messages(draw):
    shape = draw(shapes)
    n = math.prod(shape)
    values = draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=n, max_size=n))
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


@settings(max_examples=150, deadline=None)
@given(spec=specs, x=messages(), seed=st.integers(0, 2**31 - 1))
def test_any_message_round_trips_within_the_compressors_promise(spec, x, seed):
    comp = build_compressor(spec)
    payload = comp.compress(x, seed=seed)
    assert payload.data.dtype == torch.uint8 and payload.data.dim() == 1
    assert payload.nbytes == comp.payload_nbytes(tuple(x.shape), x.dtype)
    x_hat = comp.decompress(payload, tuple(x.shape), x.dtype, seed=seed)
    assert x_hat.shape == x.shape and x_hat.dtype == x.dtype
    assert torch.isfinite(x_hat).all()
    # the same message and seed give the same bytes (both ends rebuild the same x_hat)
    assert torch.equal(comp.compress(x, seed=seed).data, payload.data)
    n = x.numel()
    kind = spec.split("(")[0]
    if kind == "identity" or spec in ("topk(1.0)", "randk(1.0)"):
        assert torch.equal(x_hat, x)
    elif kind in ("fp16", "bf16"):
        eps = 2.0**-11 if kind == "fp16" else 2.0**-8
        assert torch.allclose(x_hat, x, rtol=eps, atol=1e-4)
    elif kind == "topk":
        k = max(1, min(n, math.ceil(comp.ratio * n)))
        kept = x_hat.reshape(-1) != 0
        assert int(kept.sum()) <= k
        assert torch.equal(x_hat.reshape(-1)[kept], x.reshape(-1)[kept])  # kept entries are exact
        dropped = x.reshape(-1)[~kept].abs()
        if dropped.numel() and int(kept.sum()):
            assert dropped.max() <= x.reshape(-1)[kept].abs().min()  # the largest ones were kept
    elif kind == "randk":
        k = max(1, min(n, math.ceil(comp.ratio * n)))
        nonzero = x_hat.reshape(-1) != 0
        assert int(nonzero.sum()) <= k
        assert torch.equal(x_hat.reshape(-1)[nonzero], x.reshape(-1)[nonzero])
    else:  # quant: within half a level (deterministic) or one level (stochastic, or the fixed grid's clipped top)
        rows = x.reshape(-1, x.shape[-1])
        scale = rows.abs().amax(dim=0) * (
            1 + 2.0**-10
        )  # the fp16 scale is rounded up, by at most one fp16 step
        if comp.grid == "span":
            step = 2 * scale / (2**comp.bits - 1)
            bound = step if comp.stochastic else step / 2
        else:
            bound = step = scale / 2 ** (comp.bits - 1)
        err = (x_hat.reshape(-1, x.shape[-1]) - rows).abs()
        assert (err <= bound + 1e-3 * scale + 1e-6).all()


@settings(max_examples=60, deadline=None)
@given(x=messages(), seed=st.integers(0, 2**31 - 1), ratio=ratios)
def test_randk_draws_its_entries_from_the_shared_seed_only(x, seed, ratio):
    """The receiver rebuilds randk's positions from the seed alone: the same seed on another
    message keeps the same positions."""
    comp = build_compressor(f"randk({ratio})")
    ones = torch.ones_like(x)
    a = comp.decompress(comp.compress(ones, seed=seed), tuple(x.shape), x.dtype, seed=seed) != 0
    b = comp.decompress(comp.compress(ones * 2, seed=seed), tuple(x.shape), x.dtype, seed=seed) != 0
    assert torch.equal(a, b)

"""Property-based checks of the allocation and transfer functions (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from repro.alloc.allocation import BUDGET_MATCHED, allocate, random_allocations
from repro.alloc.budget import BudgetLevels, num_high_layers
from repro.alloc.profile import LayerProfile
from repro.alloc.transfer import interpolate_profile
from repro.models.config import GPTConfig

finite = st.floats(min_value=-10, max_value=10, allow_nan=False, allow_infinity=False)


@st.composite
def budget_cases(draw):
    """A model (MHA or MLA), levels, a feasible budget (any k in 0..L) and profiles of the right length."""
    n_layer = draw(st.integers(1, 24))
    attention = draw(st.sampled_from(["mha", "mla"]))
    if attention == "mha":
        head_dim = draw(st.sampled_from([8, 16, 32, 64]))
        cfg = GPTConfig(vocab_size=1, n_layer=n_layer, n_embd=head_dim * 2, n_head=2)
        low_dims = draw(st.integers(0, head_dim // 2 - 1)) * 2
        high_dims = draw(st.integers(low_dims // 2 + 1, head_dim // 2)) * 2
        high, low, unit = high_dims / head_dim, low_dims / head_dim, "coverage"
    else:
        d_nope = draw(st.sampled_from([8, 16, 32]))
        cfg = GPTConfig(
            vocab_size=1, n_layer=n_layer, n_embd=32, n_head=2, attention="mla", qk_nope_head_dim=d_nope
        )
        low = float(draw(st.integers(0, 15)) * 2)
        high = low + float(draw(st.integers(1, 16)) * 2)
        unit = "width"
    k = draw(st.integers(0, n_layer))
    budget = low + k * (high - low) / n_layer
    profiles = {
        kind: LayerProfile(kind, draw(st.lists(finite, min_size=n_layer, max_size=n_layer)))
        for kind in ("coverage_benefit", "phase_off", "transferred")
    }
    return cfg, BudgetLevels(high, low, budget, unit), k, profiles


@settings(max_examples=150, deadline=None)
@given(budget_cases(), st.integers(0, 10_000))
def test_budget_matched_allocations_pick_exactly_k_layers(case, seed):
    cfg, levels, k, profiles = case
    assert num_high_layers(cfg.n_layer, levels) == k
    totals = set()
    for method in BUDGET_MATCHED:
        if method == "uniform":
            continue  # every layer at B: the same total only when B is a whole number of dims
        a = allocate(
            method,
            cfg,
            levels,
            benefit=profiles["coverage_benefit"],
            phase_off=profiles["phase_off"],
            transferred=profiles["transferred"],
            seed=seed,
        )
        assert len(a.high_layers) == k == len(set(a.high_layers))
        assert all(0 <= i < cfg.n_layer for i in a.high_layers) and a.high_layers == sorted(a.high_layers)
        totals.add(sum(a.widths))
    assert len(totals) == 1  # every budget-matched method spends the same rotary width


@settings(max_examples=100, deadline=None)
@given(st.lists(finite, min_size=1, max_size=30), st.integers(1, 60), st.sampled_from(["linear", "nearest"]))
def test_transfer_stays_within_the_source_range(values, n_target, method):
    out = interpolate_profile(values, n_target, method)
    assert len(out) == n_target
    assert all(min(values) - 1e-9 <= v <= max(values) + 1e-9 for v in out)
    if n_target == len(values):  # the same depths give the same values
        assert all(abs(a - b) < 1e-9 for a, b in zip(out, values))


@settings(max_examples=50, deadline=None)
@given(budget_cases(), st.integers(1, 6), st.integers(0, 1000))
def test_random_draws_are_reproducible(case, draws, seed):
    cfg, levels, k, _ = case
    a = [x.high_layers for x in random_allocations(cfg, levels, draws, seed)]
    assert a == [x.high_layers for x in random_allocations(cfg, levels, draws, seed)]
    assert all(len(h) == k for h in a)

"""Budget arithmetic, allocation methods, transfer, analysis and accounting (no training)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from repro.alloc.accounting import FixedWidthShape, MLAShape, account_fixed_width, account_mla, account_model
from repro.alloc.allocation import (
    BUDGET_MATCHED,
    METHODS,
    allocate,
    bottom_k_layers,
    random_allocations,
    spaced_layers,
    top_k_layers,
)
from repro.alloc.analysis import (
    average_ranks,
    calibration,
    interaction_terms,
    jaccard,
    seed_stability,
    spearman,
    transfer_fidelity,
)
from repro.alloc.budget import (
    BudgetLevels,
    default_levels,
    feasible_budgets,
    level_to_width,
    levels_for,
    num_high_layers,
)
from repro.alloc.profile import LayerProfile
from repro.alloc.transfer import interpolate_profile, normalized_depths, transfer_profile
from repro.models.config import GPTConfig

MHA12 = GPTConfig(vocab_size=1, n_layer=12, n_embd=128, n_head=4)  # head dim 32
MLA12 = GPTConfig(vocab_size=1, n_layer=12, n_embd=128, n_head=4, attention="mla", qk_nope_head_dim=32)


def profile(values, kind="coverage_benefit", **kw) -> LayerProfile:
    return LayerProfile(kind=kind, values=list(values), **kw)


# ------------------------------------------------------------------ budget
def test_default_budgets_make_a_third_of_the_layers_high():
    for cfg in (MHA12, MLA12):
        assert num_high_layers(12, default_levels(cfg)) == 4
    assert default_levels(MLA12) == BudgetLevels(high=32.0, low=8.0, budget=16.0, unit="width")
    assert num_high_layers(6, default_levels(MHA12)) == 2


def test_coverage_to_dims_rounds_to_even():
    assert level_to_width(0.25, MHA12, "coverage") == 8
    assert level_to_width(1.0, MHA12, "coverage") == 32
    assert level_to_width(0.3, MHA12, "coverage") == 10  # 0.3 * 32 = 9.6 -> 2 * round(4.8)
    with pytest.raises(ValueError, match="even integer"):
        level_to_width(7.0, MLA12, "width")


def test_infeasible_budget_lists_the_feasible_ones():
    with pytest.raises(
        ValueError, match=r"k=1.4 high layers.*k=0: B=0.25, k=1: B=0.5, k=2: B=0.75, k=3: B=1"
    ):
        num_high_layers(3, BudgetLevels(1.0, 0.25, 0.6, "coverage"))
    assert feasible_budgets(4, BudgetLevels(1.0, 0.25, 0.5, "coverage")) == [0.25, 0.4375, 0.625, 0.8125, 1.0]


@pytest.mark.parametrize(
    "high,low,budget,message",
    [
        (0.5, 0.5, 0.5, "high=0.5 must be greater than low=0.5"),
        (0.25, 1.0, 0.5, "must be greater than low"),
        (1.0, 0.25, 1.5, r"outside \[low, high\]"),
        (1.0, 0.25, 0.1, r"outside \[low, high\]"),
        (1.5, 0.25, 0.5, "a coverage is at most 1.0"),
        (1.0, float("nan"), 0.5, "finite number"),
    ],
)
def test_bad_levels_are_rejected(high, low, budget, message):
    with pytest.raises(ValueError, match=message):
        BudgetLevels(high, low, budget, "coverage")


# ------------------------------------------------------------------ allocation
@pytest.mark.parametrize("cfg", [MHA12, MLA12], ids=["mha", "mla"])
def test_every_budget_matched_method_spends_the_same_budget(cfg):
    levels = default_levels(cfg)
    benefit = profile([0.1 * ((7 * i) % 12) for i in range(12)])
    phase = profile([float((5 * i) % 12) for i in range(12)], kind="phase_off")
    transferred = profile([float(i % 5) for i in range(12)], kind="transferred")
    totals = set()
    for method in BUDGET_MATCHED:
        a = allocate(method, cfg, levels, benefit=benefit, phase_off=phase, transferred=transferred, seed=3)
        assert a.budget_matched and len(a.widths) == 12
        totals.add(sum(a.widths))
        if method != "uniform":
            assert len(a.high_layers) == 4 and a.widths.count(max(a.widths)) == 4
    assert totals == {sum(level_to_width(levels.budget, cfg, levels.unit) for _ in range(12))}
    assert allocate("uniform", cfg, levels).mean_level == levels.budget


def test_allocation_methods_pick_the_right_layers():
    benefit = profile([0.5, 0.9, 0.1, 0.9, 0.3, 0.0, 0.7, 0.2, 0.6, 0.05, 0.4, 0.8])
    levels = default_levels(MHA12)
    pick = lambda m, **kw: allocate(m, MHA12, levels, benefit=benefit, **kw).high_layers
    assert pick("profiled") == [1, 3, 6, 11]
    assert pick("inverse") == [2, 5, 7, 9]
    assert pick("first-k") == [0, 1, 2, 3] and pick("last-k") == [8, 9, 10, 11]
    assert pick("spaced-k") == [1, 4, 7, 10]
    assert pick("phase-off-k", phase_off=profile(benefit.values[::-1], kind="phase_off")) == [0, 5, 8, 10]
    assert allocate("all-high", MHA12, levels).widths == [32] * 12
    assert allocate("all-low", MHA12, levels).widths == [8] * 12
    assert (
        allocate("nope", MHA12, levels).widths == [0] * 12
        and not allocate("nope", MHA12, levels).budget_matched
    )


def test_ties_go_to_the_shallower_layer():
    assert top_k_layers([1.0, 2.0, 2.0, 2.0, 0.0], 2) == [1, 2]
    assert bottom_k_layers([0.0, 1.0, 0.0, 0.0], 2) == [0, 2]
    assert allocate("profiled", MHA12, default_levels(MHA12), benefit=profile([0.0] * 12)).high_layers == [
        0,
        1,
        2,
        3,
    ]


def test_random_draws_are_seeded_and_distinct():
    a = random_allocations(MHA12, default_levels(MHA12), draws=4, seed=7)
    b = random_allocations(MHA12, default_levels(MHA12), draws=4, seed=7)
    assert [x.high_layers for x in a] == [x.high_layers for x in b]
    assert len({tuple(x.high_layers) for x in a}) > 1
    assert all(len(x.high_layers) == 4 for x in a)


def test_spaced_layers_are_even():
    assert spaced_layers(12, 4) == [1, 4, 7, 10]
    assert spaced_layers(6, 2) == [1, 4]
    assert spaced_layers(3, 3) == [0, 1, 2]


def test_profile_must_match_the_model():
    with pytest.raises(ValueError, match="profile has 6 layers but the model has 12"):
        allocate("profiled", MHA12, default_levels(MHA12), benefit=profile([0.1] * 6))
    with pytest.raises(ValueError, match="needs a coverage-benefit profile"):
        allocate("profiled", MHA12, default_levels(MHA12))
    with pytest.raises(ValueError, match="got a phase_off profile"):
        allocate("profiled", MHA12, default_levels(MHA12), benefit=profile([0.1] * 12, kind="phase_off"))
    assert set(METHODS) >= {"all-high", "all-low", "nope"}


@pytest.mark.parametrize("values,message", [([], "no layers"), ([0.1, float("nan")], "not finite")])
def test_empty_or_nan_profile_is_rejected(values, message):
    with pytest.raises(ValueError, match=message):
        profile(values)


def test_profile_json_round_trip_and_bad_files(tmp_path):
    p = profile(
        [0.1, 0.2, 0.3], std=[0.01, 0.02, 0.03], per_seed={"0": [0.1, 0.2, 0.3]}, model={"n_layer": 3}
    )
    p.save(tmp_path / "p.json")
    assert LayerProfile.load(tmp_path / "p.json") == p
    (tmp_path / "bad.json").write_text('{"kind": "coverage_benefit", "values": [0.1, NaN]}')
    with pytest.raises(ValueError, match="bad.json.*not finite"):
        LayerProfile.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="is it a profile"):
        LayerProfile.load(tmp_path / "other.json")
    with pytest.raises(ValueError, match="3 values but its model has n_layer=4"):
        profile([0.1, 0.2, 0.3], model={"n_layer": 4})


# ------------------------------------------------------------------ transfer
def test_normalized_depths():
    assert normalized_depths(1) == [0.5]
    assert normalized_depths(5) == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError, match="at least one layer"):
        normalized_depths(0)


def test_transfer_maps_identical_depths_to_identical_values():
    src = [0.3, -0.1, 0.8, 0.2, 0.5, 0.0]  # 6 layers at u = 0, .2, .4, .6, .8, 1
    out = interpolate_profile(src, 11)  # 11 layers at u = 0, .1, ..., 1: even layers coincide with the source
    for j in range(0, 11, 2):
        assert out[j] == pytest.approx(src[j // 2])
    assert out[1] == pytest.approx((src[0] + src[1]) / 2)
    assert interpolate_profile(src, 6) == pytest.approx(src)
    assert interpolate_profile(src, 6, "nearest") == src
    assert interpolate_profile([0.4], 3) == [0.4, 0.4, 0.4]
    assert interpolate_profile(src, 1) == pytest.approx([(src[2] + src[3]) / 2])


@pytest.mark.parametrize("method", ["linear", "nearest"])
def test_transfer_preserves_the_order_of_a_monotone_profile(method):
    src = [0.0, 0.1, 0.15, 0.4, 0.9, 1.0]
    out = interpolate_profile(src, 12, method)
    assert all(a <= b for a, b in zip(out, out[1:]))
    assert out[0] == src[0] and out[-1] == src[-1]


def test_transfer_profile_record_and_zero_layers():
    src = profile([0.1, 0.5, 0.2], std=[0.0, 0.1, 0.2])
    t = transfer_profile(src, 5, "nearest", source_path="src.json")
    assert t.kind == "transferred" and t.n_layer == 5 and t.meta["source_layers"] == 3 and len(t.std) == 5
    with pytest.raises(ValueError, match="at least one layer"):
        transfer_profile(src, 0)


# ------------------------------------------------------------------ analysis
def test_spearman_and_ranks():
    assert average_ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert jaccard([1, 2, 3], [2, 3, 4]) == 0.5


def test_calibration_fit():
    predicted = [0.0, 1.0, 2.0, 3.0]
    result = calibration(predicted, [0.5 + 2 * x for x in predicted])
    assert result["slope"] == pytest.approx(2.0) and result["intercept"] == pytest.approx(0.5)
    assert result["spearman"] == pytest.approx(1.0) and result["n"] == 4


def test_interactions_and_fidelity_and_stability():
    terms = interaction_terms([0.1, 0.2, 0.3], {(0, 2): 0.5, (1, 2): 0.4})
    assert [t["interaction"] for t in terms] == pytest.approx([0.1, -0.1])
    fid = transfer_fidelity([0.1, 0.4, 0.3, 0.2], [0.0, 0.5, 0.4, 0.1], k=2)
    assert fid["spearman"] == pytest.approx(1.0) and fid["jaccard"] == 1.0
    stab = seed_stability({"0": [1, 2, 3], "1": [1, 2, 3], "2": [3, 2, 1]})
    assert stab["pairs"] == {
        "0-1": pytest.approx(1.0),
        "0-2": pytest.approx(-1.0),
        "1-2": pytest.approx(-1.0),
    }


# ------------------------------------------------------------------ accounting
def test_deepseek_v2_cache_is_34560_elements_per_token():
    shape = MLAShape(n_layer=60, n_head=128, kv_lora_rank=512, n_embd=5120, q_lora_rank=1536)
    result = account_mla(shape, [64] * 60, context=1)
    assert result["total"]["kv_cache_elements"] == (512 + 64) * 60 == 34_560
    assert result["total"]["kv_cache_bytes"] == 69_120  # bf16
    assert result["per_layer"]["rotary_parameters"][0] == 1536 * 128 * 64 + 5120 * 64


def test_accounting_matches_hand_computed_values():
    # fixed width: n_h=4, n_kv=2, d_h=8, widths [8, 2, 0], T=10
    fw = account_fixed_width(FixedWidthShape(3, 4, 2, 8), [8, 2, 0], context=10, bytes_per_elem=4)
    assert fw["per_layer"]["kv_cache_elements"] == [32, 32, 32]  # 2 * 2 * 8
    assert fw["per_layer"]["rope_flops"] == [144, 36, 0]  # 3 * (4 + 2) * r
    assert fw["per_layer"]["attention_flops"] == [1280] * 3  # 4 * 4 * 8 * 10
    assert fw["total"]["kv_cache_bytes"] == 96 * 4 and fw["total"]["rotary_parameters"] == 0
    # MLA: n_h=2, d_c=16, d_model=32, full-rank q, widths [8, 0], T=10
    mla = account_mla(MLAShape(2, 2, 16, 32), [8, 0], context=10)
    assert mla["per_layer"]["kv_cache_elements"] == [24, 16]
    assert mla["per_layer"]["attention_flops"] == [2 * 2 * 24 * 10 + 2 * 2 * 16 * 10, 2 * 2 * 16 * 10 * 2]
    assert mla["per_layer"]["rope_flops"] == [3 * 3 * 8, 0]
    assert mla["per_layer"]["rotary_parameters"] == [32 * 2 * 8 + 32 * 8, 0]
    assert mla["total"]["kv_cache_bytes"] == 80


def test_account_model_uses_the_config_widths():
    cfg = GPTConfig(vocab_size=1, n_layer=3, n_embd=64, n_head=4, rope_dims=[16, 4, 4], block_size=64)
    result = account_model(cfg)
    assert result["context"] == 64 and result["per_layer"]["rope_width"] == [16, 4, 4]
    with pytest.raises(ValueError, match="3 entries but the model has 2 layers"):
        account_mla(MLAShape(2, 2, 16, 32), [8, 0, 0], context=10)


def test_accounting_imports_no_torch():
    code = "import sys, repro.alloc.accounting, repro.alloc.budget; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_levels_for_overrides():
    levels = levels_for(MLA12, budget=20.0)
    assert (levels.high, levels.low, levels.budget) == (32.0, 8.0, 20.0)
    assert num_high_layers(12, levels) == 6  # 12 * (20 - 8) / (32 - 8)


def test_nope_budgets_remove_the_same_number_of_layers_worth_of_pairs_and_refuse_an_empty_or_full_one():
    """Every zero-shot NoPE allocation takes k layers' phase (uniform: 1 - k/L of each layer's pairs
    kept); the profile's takes the k least dependent layers, the inverse the k most."""
    from repro.alloc.pretrained_nope import nope_allocations

    profile = LayerProfile(kind="phase_off", values=[0.5, 0.01, 0.3, 0.02, 0.2])
    plans = nope_allocations(profile, 2, draws=2, seed=0)
    assert plans["profile"] == {1: 0.0, 3: 0.0} and plans["inverse"] == {0: 0.0, 2: 0.0}
    assert plans["first-k"] == {0: 0.0, 1: 0.0} and plans["last-k"] == {3: 0.0, 4: 0.0}
    assert plans["uniform"] == dict.fromkeys(range(5), 0.6)
    for fractions in plans.values():  # each removes two layers' worth of rotary pairs
        assert sum(1.0 - f for f in fractions.values()) == pytest.approx(2.0)
    for k in (0, 5):
        with pytest.raises(ValueError, match=r"--layers=.*between 1 and 4"):
            nope_allocations(profile, k)

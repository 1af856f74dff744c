"""The paired statistics of the tables, against values worked out by hand (and by scipy in the
test only, where a closed form would be long)."""

from __future__ import annotations

import math

import pytest
from scipy import stats as sp

from repro.stats import detectable_difference, holm, paired_comparison, pooled_std, seeds_needed, with_holm


def test_a_paired_comparison_of_three_seeds_by_hand():
    # differences 0.1, 0.2, 0.3: mean 0.2, std 0.1, t = 0.2 / (0.1 / sqrt 3) = 2 sqrt 3, df = 2
    c = paired_comparison([1.1, 1.2, 1.3], [1.0, 1.0, 1.0])
    assert c.n == 3 and c.mean == pytest.approx(0.2) and c.std == pytest.approx(0.1)
    t = 2 * math.sqrt(3)
    assert c.p == pytest.approx(
        1 - t / math.sqrt(2 + t * t)
    )  # Student t with 2 df: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t_{0.975, 2}, from the textbook table
    assert (c.ci_low, c.ci_high) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    assert c.p_wilcoxon is None and c.p_sign is None  # fewer than 6 seeds


def test_rank_tests_join_from_six_seeds():
    c = paired_comparison([1.0 + 0.01 * i for i in range(1, 7)], [1.0] * 6)
    assert c.p_sign == pytest.approx(2 * 0.5**6)  # all six above: two-sided exact sign test
    assert c.p_wilcoxon == pytest.approx(2 / 64)  # all ranks positive: 1 of the 64 sign patterns, two-sided


def test_one_seed_or_no_spread():
    one = paired_comparison([2.0], [1.5])
    assert one.mean == 0.5 and one.p is None and one.ci_low is None and not one.resolved
    same = paired_comparison([1.0, 2.0], [1.0, 2.0])
    assert same.p == 1.0 and same.mean == 0.0


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    marked = with_holm(
        {"a": paired_comparison([1.1, 1.2, 1.3, 1.25], [1.0] * 4), "b": paired_comparison([1.0], [1.0])}
    )
    assert marked["a"].p_holm == pytest.approx(marked["a"].p) and marked["a"].resolved
    assert marked["b"].p_holm is None and not marked["b"].resolved


def test_power_figures_agree_with_the_normal_approximation_and_with_scipy():
    # large n: the detectable difference tends to (z_{0.975} + z_{0.8}) sigma / sqrt(n)
    assert detectable_difference(1.0, 2000) == pytest.approx(
        (1.959964 + 0.841621) / math.sqrt(2000), rel=2e-3
    )
    n = seeds_needed(0.02, 0.01)
    crit = lambda k: sp.t.ppf(0.975, k - 1)
    ncp = lambda k: 0.01 * math.sqrt(k) / 0.02
    achieved = lambda k: sp.nct.sf(crit(k), k - 1, ncp(k)) + sp.nct.cdf(-crit(k), k - 1, ncp(k))
    assert achieved(n) >= 0.8 > achieved(n - 1)  # the smallest n with 80 % power
    assert 30 <= n <= 36  # about ((1.96 + 0.84) * 2)^2 = 31.4, plus the t correction


def test_pooled_std_by_hand():
    # groups (1, 3) and (2, 4, 6): squares about the means 2 + 8 = 10 over 1 + 2 degrees of freedom
    assert pooled_std([[1, 3], [2, 4, 6]]) == pytest.approx(math.sqrt(10 / 3))
    assert pooled_std([[5]]) is None

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


def test_the_power_has_no_nan_anywhere_and_matches_a_quadrature():
    """scipy's nct.cdf(-c, df, ncp) is NaN for large ncp at small df; the power never is."""
    import numpy as np
    from scipy import integrate

    from repro.stats import _power

    for n in range(2, 41):
        values = [_power(ncp / math.sqrt(n), 1.0, n, 0.05) for ncp in np.linspace(0.0, 40.0, 161)]
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values), n
        assert all(b >= a - 1e-12 for a, b in zip(values, values[1:])), n  # more difference, more power

    def quadrature(delta: float, n: int) -> float:  # P(|Z + ncp| > c sqrt(V / df)), V chi-square(df)
        df, ncp = n - 1, delta * math.sqrt(n)
        c = sp.t.ppf(0.975, df)
        inner = lambda v: (
            sp.chi2.pdf(v, df)
            * (sp.norm.sf(c * math.sqrt(v / df) - ncp) + sp.norm.cdf(-c * math.sqrt(v / df) - ncp))
        )
        return integrate.quad(inner, 0, math.inf, limit=200)[0]

    for delta, n in ((5.47, 2), (11.55, 2), (3.0, 3), (1.0, 10), (0.5, 40)):
        assert _power(delta, 1.0, n, 0.05) == pytest.approx(quadrature(delta, n), abs=1e-9)


def test_two_seeds_detect_11_55_std_and_the_seeds_needed_at_the_boundary():
    assert detectable_difference(1.0, 2) == pytest.approx(11.55, abs=0.01)  # not 5.47 (a NaN taken as power)
    assert seeds_needed(1.0, 11.6) == 2
    for delta in (5.3, 5.5, 8.0, 11.5):  # where the NaN answered 2
        assert seeds_needed(1.0, delta) == 3


def test_seeds_needed_searches_up_to_its_limit_and_says_none_beyond_it():
    delta = 2.8 / math.sqrt(97_000)  # needs about 97,000 seeds
    n = seeds_needed(1.0, delta)
    from repro.stats import _power

    assert n is not None and 90_000 < n <= 100_000
    assert _power(delta, 1.0, n, 0.05) >= 0.8 > _power(delta, 1.0, n - 1, 0.05)
    assert seeds_needed(1.0, delta, limit=n - 1) is None and seeds_needed(1.0, delta, limit=n) == n


def test_the_wilcoxon_p_with_ties_is_the_exact_enumeration():
    from repro.stats import wilcoxon_p

    # differences 1, 1, 1, 1, 1, -2: the five 1s share ranks 1..5 (average 3), the -2 has rank 6;
    # T+ = 15 against a centre of 21 / 2 = 10.5, so |T+ - 10.5| >= 4.5 means T+ <= 6 or T+ >= 15.
    # T+ = 3k + 6m (k of the five 1s and m of the 2 positive): m = 0 gives k in {0, 1, 2, 5}, that is
    # 1 + 5 + 10 + 1 = 17 of the patterns; m = 1 gives k in {0, 3, 4, 5}, 1 + 10 + 5 + 1 = 17: 34 / 64
    assert wilcoxon_p([1, 1, 1, 1, 1, -2]) == pytest.approx(34 / 64)
    assert float(sp.wilcoxon([1, 1, 1, 1, 1, -2], method="exact").pvalue) == pytest.approx(
        28 / 64
    )  # no-ties law
    assert paired_comparison([2, 2, 2, 2, 2, -1], [1] * 6).p_wilcoxon == pytest.approx(34 / 64)
    for diffs in ([0.3, -0.1, 0.25, 0.4, 0.05, -0.2, 0.15], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]):  # no ties
        assert wilcoxon_p(diffs) == pytest.approx(float(sp.wilcoxon(diffs, method="exact").pvalue))
    assert wilcoxon_p([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

"""Paired statistics of the tables: is a row's difference to its reference resolved by the seeds?

Each row is compared with its reference (``uniform`` in Table 1, ``none`` in the Clapping table)
seed by seed: the differences ``row(seed) - reference(seed)`` remove the part of the seed spread
that both share. For them: the mean, its 95 % confidence interval (Student t), a two-sided paired
t-test, and with 6 or more seeds the Wilcoxon signed-rank and sign tests. The Wilcoxon test drops
zero differences (Wilcoxon's own rule) and gives tied ones their average rank; its p-value is
exact, counted over all 2^n sign patterns of those ranks, up to 20 nonzero differences, and the
normal approximation with scipy's tie correction above that. Holm's method
corrects the t-test p-values across the rows of a table; a row is *resolved* when its corrected
p-value is below ``alpha``. The power figures say what the seeds could have seen: the smallest
difference a paired t-test detects with 80 % power, and the seeds needed for a given difference.
Everything is computed with ``scipy.stats``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from scipy import stats as sp

ALPHA = 0.05  # significance level of the tests (two-sided) and of Holm's correction
CONFIDENCE = 0.95  # level of the confidence intervals
CI_LABEL = f"{CONFIDENCE * 100:g}% CI"  # how the tables head their interval columns
POWER = 0.8  # power of the detectable-difference and seeds-needed figures
RANK_TESTS_FROM = 6  # seeds from which the exact Wilcoxon and sign tests are added


@dataclass(frozen=True)
class PairedComparison:
    """A row against its reference over paired seeds."""

    n: int  # paired seeds
    mean: float  # mean of row - reference
    std: float | None  # sample std of the differences (None with one seed)
    ci_low: float | None  # 95 % confidence interval of the mean difference
    ci_high: float | None
    p: float | None  # two-sided paired t-test (None with one seed)
    p_wilcoxon: float | None = None  # Wilcoxon signed-rank test, exact with ties (6 seeds or more)
    p_sign: float | None = None  # exact sign test (6 seeds or more)
    p_holm: float | None = None  # p after Holm's correction across the table's rows
    resolved: bool | None = False  # p_holm < alpha: the seeds tell this row from its reference

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# the reference row against itself, in a table's columns: difference 0.0, no interval, nothing tested
ITSELF = PairedComparison(0, 0.0, None, None, None, None, resolved=None)


def paired_comparison(
    row: Sequence[float], reference: Sequence[float], confidence: float = CONFIDENCE
) -> PairedComparison:
    """Row against reference, seed by seed (the two sequences are in the same seed order)."""
    if len(row) != len(reference) or not row:
        raise ValueError(
            f"paired comparison needs as many row values as reference values ({len(row)} vs {len(reference)})"
        )
    diffs = [float(a) - float(b) for a, b in zip(row, reference)]
    n = len(diffs)
    mean = statistics.fmean(diffs)
    if n < 2:
        return PairedComparison(n, mean, None, None, None, None)
    std = statistics.stdev(diffs)
    if std == 0.0:  # every seed moved by the same amount: no spread to test against
        p = 1.0 if mean == 0.0 else 0.0
        return PairedComparison(n, mean, 0.0, mean, mean, p, *_rank_tests(diffs))
    half = sp.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    p = float(sp.ttest_rel(row, reference).pvalue)
    return PairedComparison(n, mean, std, mean - half, mean + half, p, *_rank_tests(diffs))


def _rank_tests(diffs: list[float]) -> tuple[float | None, float | None]:
    if len(diffs) < RANK_TESTS_FROM:
        return None, None
    nonzero = [d for d in diffs if d != 0.0]
    if not nonzero:
        return 1.0, 1.0
    sign = float(sp.binomtest(sum(d > 0 for d in nonzero), len(nonzero), 0.5).pvalue)
    return wilcoxon_p(nonzero), sign


EXACT_WILCOXON_UP_TO = 20  # nonzero differences: 2^20 sign patterns are counted exactly


def wilcoxon_p(diffs: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value: zeros dropped, ties at their average rank; exact
    (every sign pattern of the ranks counted) up to ``EXACT_WILCOXON_UP_TO`` differences."""
    nonzero = np.asarray([float(d) for d in diffs if d != 0.0])
    n = len(nonzero)
    if n == 0:
        return 1.0
    if n > EXACT_WILCOXON_UP_TO:
        return float(sp.wilcoxon(nonzero, method="approx").pvalue)
    ranks = sp.rankdata(np.abs(nonzero))  # ties get their average rank
    center = ranks.sum() / 2  # the mean of the rank sum of the positive ones under the null
    observed = abs(ranks[nonzero > 0].sum() - center)
    patterns = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(float)  # every sign pattern
    spread = np.abs(patterns @ ranks - center)
    return float(np.mean(spread >= observed - 1e-9 * ranks.sum()))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def with_holm(
    comparisons: Mapping[str, PairedComparison], alpha: float = ALPHA
) -> dict[str, PairedComparison]:
    """The comparisons with Holm-corrected p-values and the resolved mark (rows without a p-value
    are left unresolved and do not count in the correction)."""
    tested = [name for name, c in comparisons.items() if c.p is not None]
    adjusted = dict(zip(tested, holm([comparisons[name].p for name in tested])))
    out = {}
    for name, c in comparisons.items():
        p_holm = adjusted.get(name)
        out[name] = replace(c, p_holm=p_holm, resolved=p_holm is not None and p_holm < alpha)
    return out


def _power(delta: float, std: float, n: int, alpha: float) -> float:
    """Power of a two-sided paired t-test with n pairs to see a true mean difference delta:
    P(T > c) + P(T < -c) for T noncentral t with n - 1 degrees of freedom and noncentrality
    delta sqrt(n) / std. The lower tail is taken as ``nct.sf(c, df, -ncp)`` (the same by symmetry):
    scipy's ``nct.cdf(-c, df, ncp)`` returns NaN for large ncp at small df."""
    df = n - 1
    crit = sp.t.ppf(1 - alpha / 2, df)
    ncp = delta * math.sqrt(n) / std
    value = float(sp.nct.sf(crit, df, ncp) + sp.nct.sf(crit, df, -ncp))
    if not math.isfinite(value):
        raise ArithmeticError(f"the t-test power is not finite (n={n}, noncentrality {ncp:g})")
    return min(1.0, max(0.0, value))


def detectable_difference(std: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest true difference a paired t-test over n seeds detects with the given power,
    when the paired differences have standard deviation ``std`` (None below 2 seeds)."""
    if n < 2 or std is None:
        return None
    if std == 0.0:
        return 0.0
    lo, hi = 0.0, std
    while _power(hi, std, n, alpha) < power:
        hi *= 2
    for _ in range(60):  # bisection to float precision of the answer
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _power(mid, std, n, alpha) < power else (lo, mid)
    return hi


def seeds_needed(
    std: float, delta: float, alpha: float = ALPHA, power: float = POWER, limit: int = 100_000
) -> int | None:
    """Paired seeds a t-test needs to detect ``delta`` with the given power: the smallest such n,
    searched up to ``limit`` seeds (None when even ``limit`` seeds are not enough)."""
    if std == 0.0:
        return 2
    if _power(delta, std, limit, alpha) < power:
        return None
    n = 2
    while _power(delta, std, n, alpha) < power:
        n = min(limit, n * 2 if n < 64 else n + max(1, n // 8))
    lo = max(2, n // 2)
    while lo < n:  # the smallest n with enough power
        mid = (lo + n) // 2
        lo, n = (mid + 1, n) if _power(delta, std, mid, alpha) < power else (lo, mid)
    return n


def pooled_std(groups: Sequence[Sequence[float]]) -> float | None:
    """The pooled sample standard deviation of several groups (each with its own mean)."""
    ss = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups if len(g) > 1)
    df = sum(len(g) - 1 for g in groups if len(g) > 1)
    return math.sqrt(ss / df) if df else None


def power_figures(
    paired_diffs: Sequence[Sequence[float]],
    seed_groups: Sequence[Sequence[float]],
    n: int,
    target: float = 0.01,
    alpha: float = ALPHA,
    power: float = POWER,
) -> dict[str, Any]:
    """What the seeds of a table can resolve: the seed-to-seed std (pooled over rows), the std of
    the paired differences (pooled), the smallest difference detectable with ``n`` seeds, and the
    seeds needed to detect ``target``."""
    seed_std = pooled_std(seed_groups)
    diff_std = pooled_std(paired_diffs)
    return {
        "seeds": n,
        "seed_std": seed_std,
        "paired_diff_std": diff_std,
        "alpha": alpha,
        "power": power,
        "detectable_difference": detectable_difference(diff_std, n, alpha, power)
        if diff_std is not None
        else None,
        "target_difference": target,
        "seeds_for_target": seeds_needed(diff_std, target, alpha, power) if diff_std is not None else None,
    }


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation of seeds' values (no std of a single value)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return float("nan"), None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t confidence interval of a mean (low = high = mean for one value)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, mean, mean
    half = sp.t.ppf(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def probe_noise(
    losses: Mapping[str, Sequence[float]], reference: str, targets: Sequence[float], holm_rows: int
) -> dict[str, Any]:
    """A noise probe's statistics: every row against ``reference`` paired by seed (mean, std of
    the differences, p), their pooled std, and the seeds each target difference needs at 80 %
    power at alpha and at alpha / ``holm_rows`` (Holm's strictest step)."""
    ref = losses[reference]
    rows, diffs = {}, []
    for method, values in losses.items():
        if method == reference:
            continue
        c = paired_comparison(values, ref)
        diffs.append([a - b for a, b in zip(values, ref)])
        rows[method] = {"mean": c.mean, "std": c.std, "p": c.p}
    sd = pooled_std(diffs)
    return {
        "rows": rows,
        "paired_diff_std": sd,
        "seeds_needed": {
            f"{t:g}": {
                "alpha": seeds_needed(sd, t) if sd else None,
                "alpha_over_m": seeds_needed(sd, t, alpha=ALPHA / holm_rows) if sd else None,
            }
            for t in targets
        },
    }


def probe_cells(probe: Mapping[str, Any], others: Sequence[str], targets: Sequence[float]) -> list[str]:
    """A probe's table cells after its own first columns: each row's paired difference, the seeds
    each target needs, and the seconds per run."""
    cells = []
    for m in others:
        r = probe["rows"].get(m)
        if r is None:
            cells.append("-")
            continue
        pv = "-" if r["p"] is None else f"{r['p']:.3g}"
        cells.append(f"{r['mean']:+.4f} (sd {r['std'] or 0:.4f}, p {pv})")
    for t in targets:
        need = probe["seeds_needed"][f"{t:g}"]
        cells.append(f"{need['alpha']}; {need['alpha_over_m']}")
    cells.append(f"{probe['run_wall_s']:.0f}")
    return cells

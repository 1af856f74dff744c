"""The spec's "brief analysis" (section 5): calibration, interactions, transfer fidelity, stability.

Plain Python (no scipy): Spearman is the Pearson correlation of average ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import combinations
from typing import Any

from .allocation import top_k_layers


def average_ranks(values: list[float]) -> list[float]:
    """Ranks 1..n, ties sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def pearson(x: list[float], y: list[float]) -> float:
    if len(x) != len(y):
        raise ValueError(f"correlation of sequences of different lengths ({len(x)} and {len(y)})")
    if len(x) < 2:
        raise ValueError("a correlation needs at least 2 points")
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return float("nan")  # a constant sequence has no rank order
    return sxy / math.sqrt(sxx * syy)


def spearman(x: list[float], y: list[float]) -> float:
    return pearson(average_ranks(list(x)), average_ranks(list(y)))


def jaccard(a: Iterable[int], b: Iterable[int]) -> float:
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else 1.0


def linear_fit(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of y on x."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        return float("nan"), my
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    return slope, my - slope * mx


def calibration(predicted: list[float], realized: list[float]) -> dict[str, Any]:
    """Does the profile predict the gain? predicted[i] = sum of the chosen layers' benefit of
    allocation i; realized[i] = its measured loss change. Slope, intercept, Spearman, Pearson."""
    slope, intercept = linear_fit(predicted, realized)
    return {
        "n": len(predicted),
        "slope": slope,
        "intercept": intercept,
        "spearman": spearman(predicted, realized),
        "pearson": pearson(predicted, realized),
    }


def predicted_gain(benefit: list[float], high_layers: Iterable[int]) -> float:
    return float(sum(benefit[i] for i in high_layers))


def interaction_terms(single: list[float], pairs: dict[tuple[int, int], float]) -> list[dict[str, Any]]:
    """For each measured pair (i, j): benefit[i,j] - (benefit[i] + benefit[j])."""
    out = []
    for (i, j), both in sorted(pairs.items()):
        additive = single[i] + single[j]
        out.append(
            {"layers": [i, j], "pair_benefit": both, "additive": additive, "interaction": both - additive}
        )
    return out


def transfer_fidelity(transferred: list[float], direct: list[float], k: int) -> dict[str, Any]:
    """Spearman and top-k Jaccard of a transferred profile against one measured on the target."""
    if len(transferred) != len(direct):
        raise ValueError(
            f"transferred profile has {len(transferred)} layers but the direct profile has {len(direct)}"
        )
    top_t, top_d = top_k_layers(transferred, k), top_k_layers(direct, k)
    return {
        "spearman": spearman(transferred, direct),
        "top_k": k,
        "jaccard": jaccard(top_t, top_d),
        "top_k_transferred": top_t,
        "top_k_direct": top_d,
    }


def seed_stability(per_seed: dict[str, list[float]]) -> dict[str, Any]:
    """Rank correlation of the profiles of every pair of seeds, and their mean."""
    seeds = sorted(per_seed)
    pairs = {f"{a}-{b}": spearman(per_seed[a], per_seed[b]) for a, b in combinations(seeds, 2)}
    finite = [v for v in pairs.values() if math.isfinite(v)]
    return {"pairs": pairs, "mean_spearman": sum(finite) / len(finite) if finite else float("nan")}

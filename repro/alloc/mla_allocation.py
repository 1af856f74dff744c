"""Per-layer rotary pairs and latent ranks of an MLA conversion under a KV-cache budget
(PROTOCOL.md §R4 applied to physical widths). Pure functions.

A layer of a converted model caches ``R_l + n_kv * 2 N_l`` elements per token (``mla_conversion``).
A budget is a fraction of the source's ``2 n_kv d`` per layer, spent as a *split*: ``N`` pairs per
key/value head and the latent rank ``R`` the rest buys, on average over layers. Allocations of one
split (the same mean N and mean R, so the same cache):
  - ``uniform``: every layer N and R (MHA2MLA's conversion);
  - ``profiled``: the k = L/3 layers with the largest coverage benefit get 2N pairs, the others N/2
    (the coverage-benefit profile at coverage levels N/2 and 2N of d/2 pairs); the k layers with the
    largest rank benefit get 2R, the others R/2 (the rank-benefit profile at those ranks);
  - ``profiled-rotary`` / ``profiled-rank``: one lever by its profile, the other uniform;
  - ``inverse``: both by the bottom k of their profiles; ``random-k``: both drawn (seeded).
With L layers, k = L/3 high layers keep the mean exactly when L is a multiple of 3 (else the budget
check names the k that fit).
"""

from __future__ import annotations

from dataclasses import dataclass

from .allocation import bottom_k_layers, random_layers, top_k_layers
from .budget import BudgetLevels, num_high_layers

METHODS = ("uniform", "profiled", "profiled-rotary", "profiled-rank", "inverse", "random-k")


@dataclass(frozen=True)
class Split:
    """A budget spent as N rotary pairs per key/value head and a latent rank R in every layer."""

    pairs: int
    rank: int

    def cache_elements(self, n_kv: int) -> int:
        return self.rank + n_kv * 2 * self.pairs


def split_for(budget: float, pairs: int, n_kv: int, head_dim: int, full_rank: int) -> Split:
    """The split of ``budget`` (a fraction of the source's 2 n_kv d elements per layer) that keeps
    ``pairs`` pairs per key/value head; one line names a split the budget cannot buy and the pairs
    it can."""
    source = 2 * n_kv * head_dim
    if not 0 < budget <= 1:
        raise ValueError(f"cache budget {budget!r}: a fraction of the source's KV cache in (0, 1]")
    elements = budget * source
    if abs(elements - round(elements)) > 1e-9:
        raise ValueError(
            f"cache budget {budget:g} is {elements:g} elements per layer, not a whole number; budgets are "
            f"multiples of 1/{source} of the source's {source}"
        )
    elements = round(elements)
    possible = [n for n in range(head_dim // 2 + 1) if 1 <= elements - n_kv * 2 * n <= full_rank]
    rank = elements - n_kv * 2 * pairs
    if pairs not in possible:
        allowed = f"{possible[0]}..{possible[-1]}" if possible else "none"
        raise ValueError(
            f"cache budget {budget:g} ({elements} elements per layer) with {pairs} rotary pairs per key/value head "
            f"({n_kv * 2 * pairs} elements) leaves a latent rank of {rank}, outside 1..{full_rank}; pairs this "
            f"budget allows: {allowed}"
        )
    return Split(pairs, rank)


def level_split(split: Split) -> tuple[tuple[int, int], tuple[int, int]]:
    """((low, high) pairs, (low, high) ranks) of the per-layer allocations: half and twice the split."""
    if split.pairs % 2 or split.rank % 2:
        raise ValueError(
            f"split of {split.pairs} pairs and rank {split.rank}: per-layer levels are half and twice them, "
            "so both must be even"
        )
    return (split.pairs // 2, split.pairs * 2), (split.rank // 2, split.rank * 2)


def high_count(n_layer: int) -> int:
    """k: the layers at the high level when the levels are half and twice the mean (k = L/3)."""
    return num_high_layers(n_layer, BudgetLevels(high=2.0, low=0.5, budget=1.0, unit="width"))


def mla_allocation(
    method: str,
    n_layer: int,
    split: Split,
    coverage: list[float] | None = None,
    rank_benefit: list[float] | None = None,
    seed: int = 0,
) -> tuple[list[int], list[int]]:
    """(pairs per layer, ranks per layer) of ``method`` for ``split``."""
    if method not in METHODS:
        raise ValueError(f"MLA allocation {method!r}: allowed {METHODS}")
    if method == "uniform":
        return [split.pairs] * n_layer, [split.rank] * n_layer
    (p_low, p_high), (r_low, r_high) = level_split(split)
    k = high_count(n_layer)

    def need(profile, what):
        if profile is None or len(profile) != n_layer:
            raise ValueError(f"MLA allocation {method!r} needs a {what} profile of {n_layer} layers")
        return profile

    if method in ("profiled", "profiled-rotary", "inverse"):
        pick = top_k_layers if method != "inverse" else bottom_k_layers
        rot_high = pick(need(coverage, "coverage-benefit"), k)
    elif method == "random-k":
        rot_high = random_layers(n_layer, k, seed)
    else:
        rot_high = None
    if method in ("profiled", "profiled-rank", "inverse"):
        pick = top_k_layers if method != "inverse" else bottom_k_layers
        rank_high = pick(need(rank_benefit, "rank-benefit"), k)
    elif method == "random-k":
        rank_high = random_layers(n_layer, k, seed + 1000)
    else:
        rank_high = None
    pairs = (
        [split.pairs] * n_layer
        if rot_high is None
        else [p_high if i in rot_high else p_low for i in range(n_layer)]
    )
    ranks = (
        [split.rank] * n_layer
        if rank_high is None
        else [r_high if i in rank_high else r_low for i in range(n_layer)]
    )
    return pairs, ranks

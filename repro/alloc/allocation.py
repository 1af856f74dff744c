"""Allocations (PROTOCOL.md §R4): which layers get the high level under a budget.

Budget-matched methods pick exactly k high layers (the rest low): ``profiled`` (top-k of the
coverage-benefit profile, ties to the shallower layer), ``transferred`` (top-k of a profile
transferred from a smaller family member), ``first-k``, ``last-k``, ``spaced-k``,
``random-k`` (seeded draws), ``inverse`` (bottom-k of the profile) and ``phase-off-k`` (top-k of
the phase-off profile). ``uniform`` puts every layer at B (rounded to even dims; the mean actually
used is recorded). Reference points, not budget-matched: ``all-high``, ``all-low``, ``nope``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from repro.models.config import GPTConfig, width_field_of

from .budget import BudgetLevels, level_to_width, num_high_layers, width_to_level
from .profile import LayerProfile

BUDGET_MATCHED = (
    "profiled",
    "transferred",
    "uniform",
    "first-k",
    "last-k",
    "spaced-k",
    "random-k",
    "inverse",
    "phase-off-k",
)
REFERENCE_POINTS = ("all-high", "all-low", "nope")
METHODS = BUDGET_MATCHED + REFERENCE_POINTS


@dataclass
class Allocation:
    method: str  # how the layers were chosen
    widths: list[int]  # rotated dims (MHA) or rotary width d_R (MLA) per layer
    high_layers: list[int]  # layers at the high level (empty for uniform and nope)
    budget_matched: bool  # False for the reference points
    attention: str  # 'mha' or 'mla': which config list the widths go into
    levels: dict[str, Any]  # high, low, budget, unit
    k: int  # number of high layers the budget asks for
    mean_width: float  # mean of widths over layers (what is actually used)
    mean_level: float  # mean in the budget's unit (coverage for MHA, width for MLA)
    record: dict[str, Any] = field(default_factory=dict)  # inputs: profile source, seed, draw index

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def config_field(self) -> str:
        return width_field_of(self.attention)


def top_k_layers(values: list[float], k: int) -> list[int]:
    """The k layers with the largest values; ties go to the shallower layer. Sorted by depth."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return sorted(order[:k])


def bottom_k_layers(values: list[float], k: int) -> list[int]:
    """The k layers with the smallest values; ties go to the shallower layer. Sorted by depth."""
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    return sorted(order[:k])


def spaced_layers(n_layer: int, k: int) -> list[int]:
    """k layers spread evenly over depth: floor((i + 1/2) * L / k) for i < k."""
    return [int((i + 0.5) * n_layer / k) for i in range(k)]


def random_layers(n_layer: int, k: int, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(n_layer), k))


def allocate(
    method: str,
    config: GPTConfig,
    levels: BudgetLevels,
    benefit: LayerProfile | None = None,
    phase_off: LayerProfile | None = None,
    seed: int = 0,
    transferred: LayerProfile | None = None,
) -> Allocation:
    """One allocation of ``method`` for the model ``config`` under ``levels``."""
    if method not in METHODS:
        raise ValueError(f"allocation method={method!r}: allowed methods are {METHODS}")
    L = config.n_layer
    k = num_high_layers(L, levels)
    high_w = level_to_width(levels.high, config, levels.unit)
    low_w = level_to_width(levels.low, config, levels.unit)
    record: dict[str, Any] = {}

    def profile_values(profile: LayerProfile | None, kind: str) -> list[float]:
        if profile is None:
            raise ValueError(f"allocation method={method!r} needs a {kind} profile")
        if profile.kind != kind.replace("-", "_"):
            raise ValueError(
                f"allocation method={method!r} needs a {kind} profile, got a {profile.kind} profile"
            )
        profile.check_matches(L)
        record["profile_kind"] = profile.kind
        record["profile_meta"] = {
            key: profile.meta[key] for key in ("source", "steps", "seeds") if key in profile.meta
        }
        return profile.values

    if method == "uniform":
        width = level_to_width(levels.budget, config, levels.unit)
        widths, high = [width] * L, []
    elif method in ("all-high", "all-low", "nope"):
        width = {"all-high": high_w, "all-low": low_w, "nope": 0}[method]
        widths, high = [width] * L, (list(range(L)) if method == "all-high" else [])
    else:
        if method == "profiled":
            high = top_k_layers(profile_values(benefit, "coverage-benefit"), k)
        elif method == "transferred":
            high = top_k_layers(profile_values(transferred, "transferred"), k)
        elif method == "inverse":
            high = bottom_k_layers(profile_values(benefit, "coverage-benefit"), k)
        elif method == "phase-off-k":
            high = top_k_layers(profile_values(phase_off, "phase-off"), k)
        elif method == "first-k":
            high = list(range(k))
        elif method == "last-k":
            high = list(range(L - k, L))
        elif method == "spaced-k":
            high = spaced_layers(L, k)
        else:  # random-k
            high = random_layers(L, k, seed)
            record["seed"] = seed
        widths = [high_w if layer in high else low_w for layer in range(L)]
    mean_width = sum(widths) / L
    return Allocation(
        method=method,
        widths=widths,
        high_layers=high,
        budget_matched=method in BUDGET_MATCHED,
        attention=config.attention,
        levels=levels.to_dict(),
        k=k,
        mean_width=mean_width,
        mean_level=width_to_level(mean_width, config, levels.unit),
        record=record,
    )


def random_allocations(
    config: GPTConfig, levels: BudgetLevels, draws: int, seed: int = 0
) -> list[Allocation]:
    """R seeded random-k draws (draw r uses seed + r)."""
    if not isinstance(draws, int) or draws <= 0:
        raise ValueError(f"random-k draws={draws!r}: must be a positive integer")
    out = []
    for r in range(draws):
        alloc = allocate("random-k", config, levels, seed=seed + r)
        alloc.record["draw"] = r
        out.append(alloc)
    return out

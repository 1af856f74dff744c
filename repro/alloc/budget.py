"""The coverage budget (PROTOCOL.md §R2): two levels, high and low, and how many layers are high.

Fixed width (MHA): levels are coverages c in [0, 1]; a coverage becomes rotated dims
``r = 2 * round(c * d_h / 2)``. MLA: levels are physical rotary widths d_R (even integers).
With L layers and budget B (mean coverage or mean width), ``k = L * (B - low) / (high - low)``
layers are high; k must come out an integer in [0, L].
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from repro.models.config import GPTConfig

K_TOLERANCE = 1e-6


@dataclass(frozen=True)
class BudgetLevels:
    high: float  # the high level (coverage in [0, 1] for MHA; rotary width for MLA)
    low: float  # the low level, same unit
    budget: float  # B: mean coverage (MHA) or mean rotary width (MLA) over layers
    unit: Literal["coverage", "width"]  # coverage = fraction of d_h (MHA); width = d_R dims (MLA)

    def __post_init__(self) -> None:
        for name in ("high", "low", "budget"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"budget {name}={value!r}: must be a finite number")
        if self.unit not in ("coverage", "width"):
            raise ValueError(f"budget unit={self.unit!r}: allowed values are ('coverage', 'width')")
        if self.high <= self.low:
            raise ValueError(f"budget high={self.high} must be greater than low={self.low}")
        if self.low < 0:
            raise ValueError(f"budget low={self.low}: must be >= 0")
        if self.unit == "coverage" and self.high > 1.0:
            raise ValueError(f"budget high={self.high}: a coverage is at most 1.0")
        if not self.low <= self.budget <= self.high:
            raise ValueError(f"budget B={self.budget} is outside [low, high] = [{self.low}, {self.high}]")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_levels(config: GPTConfig) -> BudgetLevels:
    """The spec's defaults: MHA high=1.0, low=0.25, B=0.5; MLA high=d_nope, low=d_nope/4, B=d_nope/2."""
    if config.attention == "mha":
        return BudgetLevels(high=1.0, low=0.25, budget=0.5, unit="coverage")
    d_nope = config.qk_nope_head_dim
    return BudgetLevels(high=float(d_nope), low=d_nope / 4, budget=d_nope / 2, unit="width")


def levels_for(
    config: GPTConfig, high: float | None = None, low: float | None = None, budget: float | None = None
) -> BudgetLevels:
    """Default levels of the config's attention kind, with any of high/low/budget overridden."""
    base = default_levels(config)
    return BudgetLevels(
        high=base.high if high is None else float(high),
        low=base.low if low is None else float(low),
        budget=base.budget if budget is None else float(budget),
        unit=base.unit,
    )


def feasible_budgets(n_layer: int, levels: BudgetLevels) -> list[float]:
    """Budgets that give an integer k: low + j * (high - low) / L for j = 0..L."""
    step = (levels.high - levels.low) / n_layer
    return [round(levels.low + j * step, 10) for j in range(n_layer + 1)]


def num_high_layers(n_layer: int, levels: BudgetLevels) -> int:
    """k = L * (B - low) / (high - low); an error (listing the feasible budgets) unless an integer in [0, L]."""
    if not isinstance(n_layer, int) or n_layer <= 0:
        raise ValueError(f"n_layer={n_layer!r}: must be a positive integer")
    exact = n_layer * (levels.budget - levels.low) / (levels.high - levels.low)
    k = round(exact)
    if abs(exact - k) > K_TOLERANCE or not 0 <= k <= n_layer:
        options = ", ".join(f"k={j}: B={b:g}" for j, b in enumerate(feasible_budgets(n_layer, levels)))
        raise ValueError(
            f"budget B={levels.budget:g} with high={levels.high:g}, low={levels.low:g} and {n_layer} layers gives "
            f"k={exact:.4g} high layers, not an integer in 0..{n_layer}; feasible budgets are {options}"
        )
    return k


def level_to_width(value: float, config: GPTConfig, unit: str) -> int:
    """A level in its unit -> rotated dims of one layer (even, within the head for MHA)."""
    if unit == "coverage":
        d_h = config.head_dim
        return int(2 * round(value * d_h / 2))
    width = int(round(value))
    if abs(width - value) > K_TOLERANCE or width % 2 != 0 or width < 0:
        raise ValueError(f"MLA rotary width {value:g}: must be an even integer >= 0")
    return width


def width_to_level(width: int, config: GPTConfig, unit: str) -> float:
    return width / config.head_dim if unit == "coverage" else float(width)

"""Normalized-depth transfer (PROTOCOL.md §R4): a profile of an L_s-layer model guides an L_t-layer model.

Layer j of an L-layer model sits at u_j = j / (L - 1) (u = 0.5 when L = 1). The target profile
is the source profile read at the target's depths: linear interpolation (default) or the
nearest source layer (ties to the shallower one).
"""

from __future__ import annotations

from typing import Literal

from .profile import LayerProfile

TRANSFER_METHODS = ("linear", "nearest")


def normalized_depths(n_layer: int) -> list[float]:
    if not isinstance(n_layer, int) or n_layer <= 0:
        raise ValueError(f"target layers={n_layer!r}: a transfer needs a model with at least one layer")
    if n_layer == 1:
        return [0.5]
    return [j / (n_layer - 1) for j in range(n_layer)]


def interpolate_profile(values: list[float], n_target: int, method: str = "linear") -> list[float]:
    """Source values (one per source layer) read at the normalized depths of n_target layers."""
    if method not in TRANSFER_METHODS:
        raise ValueError(f"transfer method={method!r}: allowed methods are {TRANSFER_METHODS}")
    if not values:
        raise ValueError("cannot transfer an empty profile")
    src_u = normalized_depths(len(values))
    out = []
    for u in normalized_depths(n_target):
        if len(values) == 1:
            out.append(float(values[0]))
        elif method == "nearest":
            nearest = min(range(len(values)), key=lambda i: (abs(src_u[i] - u), i))
            out.append(float(values[nearest]))
        else:
            x = u * (len(values) - 1)  # fractional source layer index
            lo = min(int(x), len(values) - 2)
            frac = x - lo
            out.append(float(values[lo] * (1.0 - frac) + values[lo + 1] * frac))
    return out


def transfer_profile(
    source: LayerProfile,
    n_target: int,
    method: Literal["linear", "nearest"] = "linear",
    target_model: dict | None = None,
    source_path: str | None = None,
) -> LayerProfile:
    """The source profile mapped to an n_target-layer model, as a 'transferred' profile."""
    if target_model is not None and target_model.get("n_layer", n_target) != n_target:
        raise ValueError(f"target model has n_layer={target_model['n_layer']} but n_target={n_target}")
    values = interpolate_profile(source.values, n_target, method)
    std = interpolate_profile(source.std, n_target, method) if source.std is not None else None
    return LayerProfile(
        kind="transferred",
        values=values,
        std=std,
        model=dict(target_model or {"n_layer": n_target}),
        meta={
            "transfer_method": method,
            "source_kind": source.kind,
            "source_layers": source.n_layer,
            "target_layers": n_target,
            "source": source_path,
            "source_meta": source.meta,
        },
    )

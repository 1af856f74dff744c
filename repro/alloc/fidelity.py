"""Does an early profile predict the late one? (the profile study of the Table 1 fidelity work)

A coverage-benefit profile whose runs were evaluated along the way can be read at any evaluation
step: ``benefit_s[l] = loss_base(s) - loss_up(l)(s)`` with each loss the mean of the last ``n``
evaluations up to step ``s``. When the runs follow the full run's learning-rate schedule and are
trained to its end, the profile at ``s`` is exactly the profile an early run of ``s`` steps would
measure. For every evaluation step this module reports

- ``vs_final``: Spearman between the profile at ``s`` and at the final step (seed means), and
  the top-k Jaccard of their high layers;
- ``seed_stability``: the mean Spearman between the seeds' profiles at ``s``;

and, for phase-off profiles of checkpoints of the all-high reference taken along its training,
their Spearman with the final coverage-benefit profile and with the final phase-off profile.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .allocation import top_k_layers
from .analysis import jaccard, seed_stability, spearman
from .coverage_profile import layer_groups, run_name
from .profile import LayerProfile


def curve_loss(curve: Sequence[Sequence[float]], step: int, last_n: int) -> float:
    """Mean of the last ``last_n`` evaluations at or before ``step``."""
    points = [loss for s, loss in curve if s <= step]
    if len(points) < last_n:
        raise ValueError(f"only {len(points)} evaluations by step {step}; fewer than last_n={last_n}")
    return statistics.fmean(points[-last_n:])


def profile_at(profile: LayerProfile, step: int, last_n: int | None = None) -> dict[str, list[float]]:
    """Per seed, the coverage-benefit profile read at ``step`` from its runs' curves."""
    meta = profile.meta
    curves = meta.get("run_curves")
    if not curves:
        raise ValueError(
            "the profile has no run curves (measured before they were recorded); measure it again"
        )
    last_n = last_n or meta["last_n"]
    groups = layer_groups(profile.n_layer, meta.get("group_size", 1))
    out = {}
    for seed in meta["seeds"]:
        base = curve_loss(curves[run_name([], seed)], step, last_n)
        values = [0.0] * profile.n_layer
        for group in groups:
            gain = base - curve_loss(curves[run_name(group, seed)], step, last_n)
            for layer in group:
                values[layer] = gain / len(group) if meta.get("group_spread", "divide") == "divide" else gain
        out[str(seed)] = values
    return out


def evaluation_steps(profile: LayerProfile, last_n: int) -> list[int]:
    steps = sorted({int(s) for curve in profile.meta["run_curves"].values() for s, _ in curve})
    return steps[last_n - 1 :]


def mean_profile(per_seed: Mapping[str, list[float]]) -> list[float]:
    return [statistics.fmean(column) for column in zip(*per_seed.values())]


def coverage_fidelity(profile: LayerProfile, k: int, last_n: int | None = None) -> list[dict[str, Any]]:
    """For every evaluation step: the profile there against the final one, and across seeds."""
    last_n = last_n or profile.meta["last_n"]
    steps = evaluation_steps(profile, last_n)
    final = mean_profile(profile_at(profile, steps[-1], last_n))
    rows = []
    for step in steps:
        per_seed = profile_at(profile, step, last_n)
        mean = mean_profile(per_seed)
        rows.append(
            {
                "step": step,
                "fraction": step / steps[-1],
                "values": mean,
                "vs_final_spearman": spearman(mean, final),
                "vs_final_top_k_jaccard": jaccard(top_k_layers(mean, k), top_k_layers(final, k)),
                "seed_stability": seed_stability(per_seed)["mean_spearman"] if len(per_seed) > 1 else None,
            }
        )
    return rows


def phase_off_fidelity(
    phase_off: Sequence[tuple[int, LayerProfile]], final_benefit: list[float]
) -> list[dict[str, Any]]:
    """Phase-off profiles of reference checkpoints at several steps: each against the final
    coverage-benefit profile and against the last phase-off profile."""
    ordered = sorted(phase_off, key=lambda item: item[0])
    last = ordered[-1][1].values
    return [
        {
            "step": step,
            "values": p.values,
            "vs_final_benefit_spearman": spearman(p.values, final_benefit),
            "vs_final_phase_off_spearman": spearman(p.values, last),
        }
        for step, p in ordered
    ]


def format_fidelity(coverage: list[dict[str, Any]], phase_off: list[dict[str, Any]] | None = None) -> str:
    """The study as a small text table."""
    lines = ["step  fraction  Spearman vs final  top-k Jaccard vs final  seed stability"]
    for r in coverage:
        stab = "-" if r["seed_stability"] is None else f"{r['seed_stability']:+.2f}"
        lines.append(
            f"{r['step']:>4}  {r['fraction']:8.2f}  {r['vs_final_spearman']:+17.2f}  "
            f"{r['vs_final_top_k_jaccard']:22.2f}  {stab:>14}"
        )
    if phase_off:
        lines += [
            "",
            "phase-off of the reference at step: Spearman vs final coverage benefit, vs final phase-off",
        ]
        lines += [
            f"{r['step']:>4}  {r['vs_final_benefit_spearman']:+.2f}  {r['vs_final_phase_off_spearman']:+.2f}"
            for r in phase_off
        ]
    return "\n".join(lines)

"""Summaries of repeated measurements and the rows of bench.json (the one step clock is
:class:`repro.experiments.kit.step_time.StepClock`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from repro.stats import mean_interval


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and the relative spread (max - min) / median of repeated measurements."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("summary of no measurements")
    med = statistics.median(vals)
    return {
        "median": med,
        "min": min(vals),
        "max": max(vals),
        "spread": (max(vals) - min(vals)) / abs(med) if med else 0.0,
        "repeats": len(vals),
        "values": vals,
    }


def row(
    section: str,
    name: str,
    metric: str,
    unit: str,
    values: Sequence[float],
    *,
    reference: str | None = None,
    ratios: Sequence[float] | None = None,
    ratio_meaning: str | None = None,
    goal: float | None = None,
    goal_kind: str = "min",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One row: the measurement's summary and, against a reference, the summary of the ratios
    (one ratio per interleaved repeat, so drift of the shared machine cancels within a pair) with
    the 95 % confidence interval of their mean (Student t; two repeats or more).
    ``goal`` is met when the median ratio is >= goal (goal_kind 'min') or <= goal ('max'); it is
    resolved when the whole interval lies on one side of the goal (None without an interval)."""
    out: dict[str, Any] = {
        "section": section,
        "name": name,
        "metric": metric,
        "unit": unit,
        **summary(values),
    }
    out["reference"] = reference
    out["ratio"] = None
    if ratios is not None:
        r = summary(ratios)
        out["ratio"] = r["median"]
        out["ratio_min"], out["ratio_max"] = r["min"], r["max"]
        out["ratio_meaning"] = ratio_meaning
        if len(r["values"]) > 1:
            _, out["ratio_ci_low"], out["ratio_ci_high"] = mean_interval(r["values"])
    out["goal"] = goal
    out["goal_kind"] = goal_kind if goal is not None else None
    out["goal_met"] = None
    out["goal_resolved"] = None
    if goal is not None and out["ratio"] is not None:
        out["goal_met"] = bool(out["ratio"] >= goal) if goal_kind == "min" else bool(out["ratio"] <= goal)
        if "ratio_ci_low" in out:
            out["goal_resolved"] = bool(out["ratio_ci_low"] > goal or out["ratio_ci_high"] < goal)
    if extra:
        out.update(extra)
    return out


def pairwise(ours: Sequence[float], ref: Sequence[float]) -> list[float]:
    """Ratios ours[i] / ref[i] of interleaved repeats."""
    if len(ours) != len(ref):
        raise ValueError(f"pairwise ratios need as many repeats on both sides ({len(ours)} vs {len(ref)})")
    return [a / b for a, b in zip(ours, ref)]


def all_finite(value: Any) -> bool:
    """True when every number inside (dicts, lists) is finite; None and strings are skipped."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(all_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(all_finite(v) for v in value)
    return True

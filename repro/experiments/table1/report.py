"""Table 1 from finished runs: rows, analysis, and the md/csv/json files (written atomically).

A row's loss for a seed is the run's final validation loss (its last evaluation, at the final
step). Delta vs uniform is paired by seed: the mean and std over seeds of loss(row) - loss(uniform)
(random-k pairs every draw with the uniform run of its seed).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from repro.alloc.accounting import account_model
from repro.alloc.allocation import REFERENCE_POINTS
from repro.alloc.analysis import calibration, predicted_gain, seed_stability, spearman, transfer_fidelity
from repro.alloc.budget import num_high_layers
from repro.runs import RunResult
from repro.runs.provenance import display_path, git_commit, machine, now
from repro.stats import ITSELF, PairedComparison, mean_std, paired_comparison, power_figures, with_holm

from .plan import ROW_METHODS, widths_name
from .results import ArchOutcome
from .rows import ArchCells, Table1Row
from .settings import Table1Settings


def _accounting(o: ArchOutcome, widths: list[int]) -> dict[str, Any]:
    return account_model(o.plan.target.gpt_config(1, **{o.plan.target.width_field: list(widths)}))["total"]


def seed_losses(o: ArchOutcome, method: str, seeds: tuple[int, ...]) -> list[float]:
    """A row's loss for every seed (random-k: the mean over its draws of that seed)."""
    allocs = [a for a in o.allocations if a.method == method]
    return [statistics.fmean(o.run(a.widths, seed).final_val_loss for a in allocs) for seed in seeds]


def comparisons(
    o: ArchOutcome, seeds: tuple[int, ...], uniform: list[float] | None = None
) -> dict[str, PairedComparison]:
    """Every row against ``uniform`` (its runs, or the losses given), paired by seed, Holm-corrected
    across the rows."""
    uniform = seed_losses(o, "uniform", seeds) if uniform is None else uniform
    return with_holm(
        {m: paired_comparison(seed_losses(o, m, seeds), uniform) for m in ROW_METHODS if m != "uniform"}
    )


def marks_under_float_spread(
    o: ArchOutcome, seeds: tuple[int, ...], table: dict[str, PairedComparison], spread: dict[str, Any]
) -> dict[str, dict[str, bool]]:
    """{method: {variant: resolved}} with the uniform row's losses of each float-spread variant in
    place of the table's (the rows' own runs unchanged): which resolved marks a rerun elsewhere
    could flip through the reference alone."""
    out: dict[str, dict[str, bool]] = {m: {"table": c.resolved} for m, c in table.items()}
    for variant, v in spread.items():
        by_seed = dict(zip(v["seeds"], v["variant_loss"]))
        moved = comparisons(o, seeds, [by_seed[s] for s in seeds])
        for m, c in moved.items():
            out[m][variant] = c.resolved
    return out


def _row_label(method: str, settings: Table1Settings) -> str:
    """A row's name in the table: its method, with the number of draws for random-k."""
    return method + (f" (R={settings.random_draws})" if method == "random-k" else "")


def arch_columns(
    o: ArchOutcome, method: str, seeds: tuple[int, ...], vs_uniform: PairedComparison | None
) -> ArchCells:
    """The columns of one architecture for one method (random-k: every draw)."""
    allocs = [a for a in o.allocations if a.method == method]
    losses = [o.run(a.widths, seed).final_val_loss for a in allocs for seed in seeds]
    mean, std = mean_std(losses)
    cost = _accounting(o, allocs[0].widths)
    c = vs_uniform or ITSELF
    return ArchCells(
        "; ".join(",".join(map(str, a.high_layers)) or "-" for a in allocs),
        "; ".join(" ".join(map(str, a.widths)) for a in allocs),
        allocs[0].mean_level,
        mean,
        std,
        *(c.mean, c.std, c.ci_low, c.ci_high, c.p, c.p_holm, c.p_wilcoxon, c.p_sign, c.resolved),
        runs=len(losses),
        kv_elements_per_token=cost["kv_cache_elements"],
        rope_flops_per_token=cost["rope_flops"],
        attention_flops_per_token=cost["attention_flops"],
    )


def power(o: ArchOutcome, seeds: tuple[int, ...], target: float) -> dict[str, Any]:
    """What the seeds of this half can resolve (paired against uniform, budget-matched rows)."""
    uniform = seed_losses(o, "uniform", seeds)
    matched = [m for m in ROW_METHODS if m not in REFERENCE_POINTS and m != "uniform"]
    diffs = [[a - b for a, b in zip(seed_losses(o, m, seeds), uniform)] for m in matched]
    groups = [seed_losses(o, m, seeds) for m in ROW_METHODS]
    return power_figures(diffs, groups, len(seeds), target)


def calibration_points(o: ArchOutcome, seeds: tuple[int, ...]) -> list[dict[str, Any]]:
    """Budget-matched allocations with chosen layers: predicted (sum of benefit) vs realized gain over all-low."""
    all_low = next(a for a in o.allocations if a.method == "all-low")
    points: dict[tuple[int, ...], dict[str, Any]] = {}
    for a in o.allocations:
        if not a.budget_matched or not a.high_layers:
            continue
        key = tuple(a.high_layers)
        if key in points:
            points[key]["methods"].append(a.method)
            continue
        gains = [o.run(all_low.widths, s).final_val_loss - o.run(a.widths, s).final_val_loss for s in seeds]
        points[key] = {
            "high_layers": list(key),
            "methods": [a.method],
            "predicted_gain": predicted_gain(o.benefit.values, key),
            "realized_gain": statistics.fmean(gains),
        }
    return list(points.values())


def storage_points(o: ArchOutcome, settings: Table1Settings) -> list[dict[str, Any]]:
    """Every trained allocation of one architecture as (KV bytes, attention FLOPs, loss) per token."""
    out: dict[tuple[int, ...], dict[str, Any]] = {}
    for a in o.allocations + o.sweep:
        key = tuple(a.widths)
        label = (
            a.method
            + (f" r{a.record['draw']}" if "draw" in a.record else "")
            + (f" (k={a.record['sweep_k']})" if "sweep_k" in a.record else "")
        )
        if key in out:
            if label not in out[key]["methods"]:
                out[key]["methods"].append(label)
            continue
        seeds = sorted(
            {s for s in settings.seeds + settings.sweep_seeds if widths_name(a.widths, s) in o.runs}
        )
        losses = [o.run(a.widths, s).final_val_loss for s in seeds]
        mean, std = mean_std(losses)
        total = _accounting(o, a.widths)
        out[key] = {
            "widths": list(a.widths),
            "methods": [label],
            "k": len(a.high_layers) if a.method != "uniform" else None,
            "budget": a.levels["budget"] if a.budget_matched else None,
            "mean_width": a.mean_width,
            "kv_bytes_per_token": total["kv_cache_bytes"],
            "kv_elements_per_token": total["kv_cache_elements"],
            "attention_flops_per_token": total["attention_flops"],
            "rope_flops_per_token": total["rope_flops"],
            "loss_mean": mean,
            "loss_std": std,
            "seeds": len(losses),
        }
    return list(out.values())


def pareto_front(points: list[dict[str, Any]]) -> list[int]:
    """Indices of the points not dominated in (KV bytes, loss): no other point is at most as large in both
    and smaller in one."""
    front = []
    for i, p in enumerate(points):
        dominated = any(
            q["kv_bytes_per_token"] <= p["kv_bytes_per_token"]
            and q["loss_mean"] <= p["loss_mean"]
            and (q["kv_bytes_per_token"] < p["kv_bytes_per_token"] or q["loss_mean"] < p["loss_mean"])
            for j, q in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i]["kv_bytes_per_token"])


def analysis(o: ArchOutcome, seeds: tuple[int, ...]) -> dict[str, Any]:
    k = num_high_layers(o.plan.shape.n_layer, o.plan.levels)
    points = calibration_points(o, seeds)
    out: dict[str, Any] = {
        "phase_off_vs_benefit_spearman": spearman(o.phase_off.values, o.benefit.values),
        "transfer_fidelity": transfer_fidelity(o.transferred.values, o.benefit.values, k),
        "calibration_points": points,
        "calibration": calibration(
            [p["predicted_gain"] for p in points], [p["realized_gain"] for p in points]
        )
        if len(points) >= 2
        else None,
        "interactions": list(o.interactions),
    }
    if len(o.benefit.per_seed) > 1:
        out["profile_seed_stability"] = seed_stability(o.benefit.per_seed)
    return out


def _run_record(o: ArchOutcome, name: str, r: RunResult) -> dict[str, Any]:
    spec_widths = r.overrides.get(f"model.gpt.{o.plan.target.width_field}")
    return {
        "widths": spec_widths,
        "seed": r.seed,
        "final_loss": r.final_val_loss,
        "result": str(o.plan.runs_dir / f"{name}.json"),
        "tensorboard": str(o.plan.runs_dir / "tb" / name),
        "wall_s": r.wall_s,
    }


def build_table(
    settings: Table1Settings,
    outcomes: list[ArchOutcome],
    wall_s: float,
    trained: int,
    reused: int,
    all_runs: list[RunResult],
    float_spread: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The table document (``all_runs``: every run of this call, trained or reused)."""
    seeds = tuple(settings.seeds)
    vs_uniform = {o.plan.arch: comparisons(o, seeds) for o in outcomes}
    marks = {
        o.plan.arch: marks_under_float_spread(o, seeds, vs_uniform[o.plan.arch], float_spread[o.plan.arch])
        for o in outcomes
        if float_spread and o.plan.arch in float_spread
    }
    rows = []
    for method in ROW_METHODS:
        cells = {}
        for o in outcomes:
            held = marks.get(o.plan.arch, {}).get(method)
            cells[o.plan.arch] = replace(
                arch_columns(o, method, seeds, vs_uniform[o.plan.arch].get(method)),
                mark_holds_under_float_spread=None if held is None else len(set(held.values())) == 1,
            )
        rows.append(Table1Row(_row_label(method, settings), method not in REFERENCE_POINTS, cells))
    archs: dict[str, Any] = {}
    for o in outcomes:
        plan = o.plan
        points = storage_points(o, settings)
        archs[plan.arch] = {
            "target_config": display_path(plan.target.path),
            "source_config": display_path(plan.source.path),
            "target_layers": plan.shape.n_layer,
            "source_layers": plan.source.shape_config().n_layer,
            "levels": plan.levels.to_dict(),
            "k": num_high_layers(plan.shape.n_layer, plan.levels),
            "steps": plan.steps,
            "eval_every": plan.eval_every,
            "tokens_per_run": plan.steps * plan.target.batch_size * plan.target.block_size,
            "profile_steps": o.benefit.meta["steps"],
            "profiles": {
                name: str(plan.profiles_dir / f"{name}.json")
                for name in ("coverage_target", "coverage_source", "transferred", "phase_off_target")
            },
            "row_runs": {
                _row_label(method, settings): [
                    widths_name(a.widths, seed) for a in o.allocations if a.method == method for seed in seeds
                ]
                for method in ROW_METHODS
            },
            "profiled_high_layers": next(a.high_layers for a in o.allocations if a.method == "profiled"),
            "analysis": analysis(o, seeds),
            "storage_points": points,
            "pareto_front": pareto_front(points),
            "context": plan.target.block_size,
            "bytes_per_elem": 2,
            "runs": {name: _run_record(o, name, r) for name, r in sorted(o.runs.items())},
            "statistics": power(o, seeds, settings.target_difference),
        }
    return {
        "scale": settings.scale,
        "git_commit": git_commit(),
        "created": now(),
        "machine": machine(),
        "wall_s": wall_s,
        "runs_trained": trained,
        "runs_reused": reused,
        "runs_total": len(all_runs),
        "training_s_summed": sum(
            r.wall_s for r in all_runs
        ),  # every run's own wall time (workers overlap them)
        "seeds": list(seeds),
        "steps": settings.steps,
        "settings": {
            **settings.to_dict(),
            "target": {k: display_path(v) for k, v in settings.target.items()},
            "source": {k: display_path(v) for k, v in settings.source.items()},
            "path": display_path(settings.path),
        },
        "architectures": archs,
        "float_spread": float_spread,
        "rows": [row.record() for row in rows],  # flat records at the file boundary
    }

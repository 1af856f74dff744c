"""Table 1 from finished runs: rows, analysis, and the md/csv/json files (written atomically).

A row's loss for a seed is the run's final validation loss (its last evaluation, at the final
step). Delta vs uniform is paired by seed: the mean and std over seeds of loss(row) - loss(uniform)
(random-k pairs every draw with the uniform run of its seed).
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

from repro.alloc.accounting import account_model
from repro.alloc.analysis import calibration, predicted_gain, seed_stability, spearman, transfer_fidelity
from repro.alloc.budget import num_high_layers
from repro.files import write_text_atomic
from repro.runs import RunResult
from repro.runs.provenance import display_path, git_commit, machine, now

from .plan import REFERENCE_POINTS, ROW_METHODS, widths_name
from .results import ArchOutcome
from .settings import Table1Settings

ARCH_TITLE = {"mha": "fixed width (MHA)", "mla": "MLA"}


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _accounting(o: ArchOutcome, widths: list[int]) -> dict[str, Any]:
    return account_model(o.plan.target.gpt_config(1, **{o.plan.target.width_field: list(widths)}))["total"]


def arch_columns(o: ArchOutcome, method: str, seeds: tuple[int, ...]) -> dict[str, Any]:
    """The columns of one architecture for one method (random-k: every draw)."""
    allocs = [a for a in o.allocations if a.method == method]
    uniform = next(a for a in o.allocations if a.method == "uniform")
    losses, deltas = [], []
    for a in allocs:
        for seed in seeds:
            loss = o.run(a.widths, seed).final_val_loss
            losses.append(loss)
            deltas.append(loss - o.run(uniform.widths, seed).final_val_loss)
    mean, std = _mean_std(losses)
    dmean, dstd = _mean_std(deltas)
    cost = _accounting(o, allocs[0].widths)
    p = o.plan.arch
    return {
        f"{p}_high_layers": "; ".join(",".join(map(str, a.high_layers)) or "-" for a in allocs),
        f"{p}_widths": "; ".join(" ".join(map(str, a.widths)) for a in allocs),
        f"{p}_mean_level": allocs[0].mean_level,
        f"{p}_loss_mean": mean,
        f"{p}_loss_std": std,
        f"{p}_delta_vs_uniform": dmean,
        f"{p}_delta_std": dstd,
        f"{p}_runs": len(losses),
        f"{p}_kv_elements_per_token": cost["kv_cache_elements"],
        f"{p}_rope_flops_per_token": cost["rope_flops"],
        f"{p}_attention_flops_per_token": cost["attention_flops"],
    }


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
        mean, std = _mean_std(losses)
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
) -> dict[str, Any]:
    """The table document (``all_runs``: every run of this call, trained or reused)."""
    seeds = tuple(settings.seeds)
    rows = []
    for method in ROW_METHODS:
        row: dict[str, Any] = {
            "method": method + (f" (R={settings.random_draws})" if method == "random-k" else ""),
            "budget_matched": method not in REFERENCE_POINTS,
        }
        for o in outcomes:
            row.update(arch_columns(o, method, seeds))
        rows.append(row)
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
                row["method"]: [
                    widths_name(a.widths, seed)
                    for a in o.allocations
                    if a.method == row["method"].split(" (")[0]
                    for seed in seeds
                ]
                for row in rows
            },
            "profiled_high_layers": next(a.high_layers for a in o.allocations if a.method == "profiled"),
            "analysis": analysis(o, seeds),
            "storage_points": points,
            "pareto_front": pareto_front(points),
            "context": plan.target.block_size,
            "bytes_per_elem": 2,
            "runs": {name: _run_record(o, name, r) for name, r in sorted(o.runs.items())},
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
        "rows": rows,
    }


# ------------------------------------------------------------------------------------------- files
def _fmt(value: float | None, digits: int = 4, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _pm(mean: float, std: float | None, signed: bool = False) -> str:
    return _fmt(mean, signed=signed) + (f" ± {std:.4f}" if std is not None else "")


def to_markdown(doc: dict[str, Any]) -> str:
    archs = list(doc["architectures"])
    a0 = doc["architectures"][archs[0]]
    lines = [
        "# Table 1: validation loss of budget-matched RoPE allocations trained from scratch",
        "",
        f"Scale `{doc['scale']}`, commit `{doc['git_commit']}`, created {doc['created']}, "
        f"wall time of this call {doc['wall_s'] / 60:.1f} min ({doc['runs_trained']} runs trained, "
        f"{doc['runs_reused']} reused); the {doc['runs_total']} runs took {doc['training_s_summed'] / 60:.1f} min "
        f"of training summed over runs ({doc['settings']['workers']} side by side).",
        f"Every row trained for seeds {doc['seeds']} ({a0['steps']} steps, {a0['tokens_per_run']:,} tokens per run); "
        "loss = final validation loss (mean ± std over seeds); "
        "Δ = paired difference to `uniform` (mean ± std over seeds).",
    ]
    for arch in archs:
        a = doc["architectures"][arch]
        lv = a["levels"]
        lines.append(
            f"{ARCH_TITLE[arch]}: target `{a['target_config']}` ({a['target_layers']} layers), source "
            f"`{a['source_config']}` ({a['source_layers']} layers); high={lv['high']:g}, low={lv['low']:g}, "
            f"B={lv['budget']:g} ({lv['unit']}), k={a['k']} high layers; profiles of {a['profile_steps']} steps."
        )
    lines.append("")
    head = ["method"]
    for arch in archs:
        t = "MHA" if arch == "mha" else "MLA"
        head += [f"{t} high layers", f"{t} val loss", "Δ vs uniform"]
    if "mla" in archs:
        head += ["MLA KV elems/token"]
    head += ["RoPE FLOPs/token (" + " / ".join(a.upper() for a in archs) + ")"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in doc["rows"]:
        cells = [row["method"] + ("" if row["budget_matched"] else " †")]
        for arch in archs:
            cells += [
                row[f"{arch}_high_layers"],
                _pm(row[f"{arch}_loss_mean"], row[f"{arch}_loss_std"]),
                "-"
                if row["method"] == "uniform"
                else _pm(row[f"{arch}_delta_vs_uniform"], row[f"{arch}_delta_std"], True),
            ]
        if "mla" in archs:
            cells.append(f"{row['mla_kv_elements_per_token']:,}")
        cells.append(" / ".join(f"{row[f'{arch}_rope_flops_per_token']:,}" for arch in archs))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "† reference point, not budget-matched (different total rotary width).",
        "",
        "## Analysis",
        "",
    ]
    for arch in archs:
        an = doc["architectures"][arch]["analysis"]
        tf = an["transfer_fidelity"]
        parts = [
            f"phase-off vs coverage-benefit Spearman {_fmt(an['phase_off_vs_benefit_spearman'], 2)}",
            f"transfer fidelity: Spearman {_fmt(tf['spearman'], 2)}, "
            f"top-{tf['top_k']} Jaccard {_fmt(tf['jaccard'], 2)} "
            f"(transferred {tf['top_k_transferred']} vs direct {tf['top_k_direct']})",
        ]
        if an.get("profile_seed_stability"):
            parts.append(
                f"profile seed stability (Spearman) {_fmt(an['profile_seed_stability']['mean_spearman'], 2)}"
            )
        if an.get("calibration"):
            c = an["calibration"]
            parts.append(
                f"calibration over {c['n']} allocations: slope {_fmt(c['slope'], 2)}, "
                f"Spearman {_fmt(c['spearman'], 2)}"
            )
        if an["interactions"]:
            parts.append(
                "interactions: "
                + ", ".join(f"{t['layers']} {t['interaction']:+.4f}" for t in an["interactions"])
            )
        lines.append(f"- {ARCH_TITLE[arch]}: " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def to_csv(doc: dict[str, Any]) -> str:
    rows = [{"scale": doc["scale"], "git_commit": doc["git_commit"], **r} for r in doc["rows"]]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(
            {k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in r.items()}
        )
    return buf.getvalue()


def write_table(doc: dict[str, Any], out: Path) -> None:
    """table1.json, .csv, .md, each atomically (the json last: it marks a finished table)."""
    write_text_atomic(out / "table1.md", to_markdown(doc))
    write_text_atomic(out / "table1.csv", to_csv(doc))
    write_text_atomic(out / "table1.json", json.dumps(doc, indent=2, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")

"""Budgeted coverage allocations of a pretrained model, tested: each allocation of ``repro allocate``
(profiled, phase-off-k, uniform, first-k, last-k, spaced-k, random-k, inverse, ...; one file per
budget) becomes a rotation (layer l keeps its rotated dims / head width of its pairs), evaluated on
the test chunks zero-shot or after a short fine-tune of each (``pretrained_rotations``), paired over
the chunks against a reference allocation of the same budget (``uniform`` by default) and reported
beside the model with every pair rotating (full RoPE, fine-tuned the same way when the rows are).
"""

from __future__ import annotations

import os
from typing import Any

from repro.stats import mean_interval

from .pretrained_profile import pretrained_model_and_data, token_mean
from .pretrained_rotations import Chunks, Finetune, Rotation, finetuned_losses, zero_shot_losses

FULL = "full RoPE"


def allocation_name(budget: float, record: dict[str, Any]) -> str:
    draw = record.get("record", {}).get("draw")
    return f"B{budget:g} {record['method']}" + ("" if draw is None else f" #{int(draw) + 1}")


def allocation_rotations(docs: list[dict[str, Any]], head_dim: int) -> tuple[dict[str, Rotation], dict]:
    """Every allocation of every file as a rotation (by name ``B<budget> <method>``) and its record."""
    rotations: dict[str, Rotation] = {}
    records: dict[str, dict[str, Any]] = {}
    for doc in docs:
        budget = float(doc["levels"]["budget"])
        for a in doc["allocations"]:
            name = allocation_name(budget, a)
            if name in rotations:
                raise ValueError(f"allocation {name!r} appears twice; give one file per budget")
            rotations[name] = {i: w / head_dim for i, w in enumerate(a["widths"])}
            records[name] = {"budget": budget, **a}
    return rotations, records


def evaluate_allocations(
    config_path: str | os.PathLike,
    docs: list[dict[str, Any]],
    reference: str = "uniform",
    finetune: Finetune | None = None,
    order: str | None = None,
    cache_dir: str | None = None,
    progress=None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Every allocation's test loss, paired over the chunks against ``reference`` of its budget."""
    model, datamodule = pretrained_model_and_data(config_path, cache_dir)
    rotations, records = allocation_rotations(docs, model.head_dim)
    budgets = sorted({r["budget"] for r in records.values()})
    for b in budgets:
        if f"B{b:g} {reference}" not in rotations:
            raise ValueError(f"--reference {reference!r}: the budget {b:g} file has no such allocation")
    for name, r in records.items():
        if len(r["widths"]) != model.n_layer:
            raise ValueError(f"allocation {name!r}: {len(r['widths'])} layers, the model has {model.n_layer}")
    split = "test" if datamodule.test_set is not datamodule.val_set else "validation (no test split)"
    everything = {FULL: {}} | rotations
    curves = None
    if finetune is None:
        losses = zero_shot_losses(model, list(datamodule.test_dataloader()), everything, order, progress)
    else:
        losses, curves = finetuned_losses(
            config_path,
            finetune,
            everything,
            model.n_layer,
            "test",
            order,
            cache_dir,
            quiet,
            "allocation fine-tune",
        )
    full = losses[FULL]
    rows = []
    for name, r in records.items():
        chunks = losses[name]
        ref_name = f"B{r['budget']:g} {reference}"
        row = {
            "name": name,
            "budget": r["budget"],
            "method": r["method"],
            "draw": r.get("record", {}).get("draw"),
            "pairs_per_layer": [int(w) // 2 for w in r["widths"]],
            "high_layers": r.get("high_layers", []),
            "mean_coverage": r.get("mean_level"),
            "loss": token_mean(chunks),
            "increase_over_full_rope": token_mean(chunks) - token_mean(full),
        }
        row.update(_paired(chunks, losses[ref_name], name == ref_name, reference))
        if curves is not None:
            row["curves"] = curves[name]
        rows.append(row)
    return {
        "split": split,
        "chunks": len(full),
        "context": int(datamodule.block_size),
        "eval_tokens": sum(n for _, n in full),
        "reference": reference,
        "loss_full_rope": token_mean(full),
        "full_rope_curves": None if curves is None else curves[FULL],
        "pair_order": "highest frequencies (p-RoPE order)" if order is None else str(order),
        "finetune": None
        if finetune is None
        else {
            "config": str(finetune.config),
            "steps": finetune.steps,
            "seeds": list(finetune.seeds),
            "overrides": dict(finetune.overrides or {}),
        },  # fmt: skip
        "rows": rows,
    }


def _paired(chunks: Chunks, ref: Chunks, is_ref: bool, reference: str) -> dict[str, Any]:
    if is_ref:
        return {"delta_vs_reference": None, "ci95": None, "verdict": None}
    mean, low, high = mean_interval([a - b for (a, _), (b, _) in zip(chunks, ref)])
    verdict = (
        f"worse than {reference}" if low > 0 else f"better than {reference}" if high < 0 else "unresolved"
    )
    return {"delta_vs_reference": mean, "ci95": [low, high], "verdict": verdict}


def allocations_markdown(result: dict[str, Any]) -> str:
    tuned = result.get("finetune")
    how = (
        f"after a {tuned['steps']}-step fine-tune of each (seeds {tuned['seeds']})" if tuned else "zero-shot"
    )
    ref = result["reference"]
    lines = [
        f"Coverage allocations {how}, {result['context']} tokens of context, on {result['chunks']} {result['split']} "
        f"chunks ({result['eval_tokens']} tokens); full RoPE {result['loss_full_rope']:.4f}. "
        f"Δ = loss − `{ref}`'s at the same budget, 95% CI over the chunks.",
        "",
        f"| budget | allocation | high layers | loss | over full RoPE | Δ vs {ref} | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        name = r["method"] + ("" if r["draw"] is None else f" #{r['draw'] + 1}")
        high = ", ".join(map(str, r["high_layers"])) if r["high_layers"] else "-"
        delta = "" if r["delta_vs_reference"] is None else f"{r['delta_vs_reference']:+.4f}"
        ci = "" if r["ci95"] is None else f"{r['ci95'][0]:+.4f} .. {r['ci95'][1]:+.4f}"
        lines.append(
            f"| {r['budget']:g} | {name} | {high} | {r['loss']:.4f} | {r['increase_over_full_rope']:+.4f} | "
            f"{delta} | {ci} | {r['verdict'] or ''} |"
        )
    return "\n".join(lines) + "\n"

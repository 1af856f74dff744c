"""The coverage-benefit profile of a pretrained model (PROTOCOL.md §R3 on real weights): base,
every layer at the low coverage; upgrade ``l``, layer ``l`` at the high coverage and the others low;
``benefit[l] = loss(base) - loss(upgrade l)`` on the validation chunks, with its 95 % CI over them
(paired: the same chunks in both). A coverage is the fraction of a layer's rotary pairs that keep
their phase (its highest frequencies, or the first of a pair order's in each key/value head).

Zero-shot, the rotations are applied to the weights as trained (each upgrade from the base's
hidden states at its layer: ``layerwise_losses``). With a fine-tune (the paper's
"early" profile), each of the L + 1 rotations is fine-tuned a few steps with its rotation in place
and then evaluated as trained (``pretrained_rotations``): what a layer's coverage buys once the model
may adapt to it. The profile is the suite's own (kind ``coverage_benefit``), so ``repro allocate``
reads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from repro.models.gguf_folder import source_note
from repro.runs.provenance import provenance_header
from repro.stats import mean_interval

from .budget import BudgetLevels
from .pretrained_profile import layerwise_losses, pretrained_model_and_data, token_mean
from .pretrained_rotations import Chunks, Finetune, Rotation, finetuned_losses
from .profile import LayerProfile

BASE = "base (all low)"


def coverage_rotations(n_layer: int, low: float, high: float) -> dict[str, Rotation]:
    """The base rotation (every layer low) and one upgrade per layer (that layer high)."""
    base = dict.fromkeys(range(n_layer), low)
    return {BASE: base} | {f"layer {i} high": {**base, i: high} for i in range(n_layer)}


def upgrade_variants(rotations: dict[str, Rotation]) -> dict[str, tuple[int, Rotation]]:
    """The rotations as ``layerwise_losses`` variants: the base changes no layer, an upgrade its own."""
    n = len(rotations[BASE])
    return {name: (n if name == BASE else int(name.split()[1]), r) for name, r in rotations.items()}


def check_coverage_levels(levels: BudgetLevels) -> None:
    if levels.unit != "coverage":
        raise ValueError(f"a pretrained model's levels are coverages in [0, 1], not {levels.unit}s")


def benefits(losses: dict[str, Chunks], n_layer: int) -> tuple[list[float], list[list[float]]]:
    """Per layer: the benefit (base - upgraded, token-weighted) and its 95 % CI over the chunks."""
    base = losses[BASE]
    values, intervals = [], []
    for i in range(n_layer):
        up = losses[f"layer {i} high"]
        _, low, high = mean_interval([b - u for (b, _), (u, _) in zip(base, up)])
        values.append(token_mean(base) - token_mean(up))
        intervals.append([low, high])
    return values, intervals


def pretrained_coverage_profile(
    config_path: str | os.PathLike,
    levels: BudgetLevels,
    finetune: Finetune | None = None,
    order: str | os.PathLike | None = None,
    cache_dir: str | None = None,
    progress=None,
    quiet: bool = False,
) -> LayerProfile:
    """The coverage-benefit profile of the config's pretrained model on its validation chunks,
    zero-shot or after ``finetune`` of every rotation."""
    check_coverage_levels(levels)
    model, datamodule = pretrained_model_and_data(config_path, cache_dir)
    order = None if order is None else str(order)
    if order is not None:  # a bad file fails before any evaluation
        model.set_rotary({0: levels.low}, order)
        model.set_rotary(None)
    rotations = coverage_rotations(model.n_layer, levels.low, levels.high)
    batches = list(datamodule.val_dataloader())
    curves: dict[str, Any] | None = None
    if finetune is None:
        losses = layerwise_losses(
            model, batches, upgrade_variants(rotations), lambda r: model.set_rotary(r, order), progress
        )
    else:
        losses, curves = finetuned_losses(
            config_path, finetune, rotations, model.n_layer, "validation", order, cache_dir, quiet,
            "coverage fine-tune",
        )  # fmt: skip
    values, intervals = benefits(losses, model.n_layer)
    tokens = sum(n for _, n in losses[BASE])
    meta: dict[str, Any] = {
        **provenance_header(),  # commit, time, machine
        "source": str(config_path),
        "pretrained": str(model.folder),
        "weights_note": source_note(model.folder),
        "intervention": "coverage upgrade: every layer low, one layer high",
        "levels": levels.to_dict(),
        "pair_order": "highest frequencies (p-RoPE order)" if order is None else str(Path(order).resolve()),
        "context": int(datamodule.block_size),
        "loss_base": token_mean(losses[BASE]),
        "chunks": len(losses[BASE]),  # the validation batches: the unit of the intervals
        "eval_tokens": tokens,
        "ci95": intervals,  # per layer: 95 % CI of the benefit over the chunks (paired)
        "finetune": None if finetune is None else finetune.record(),
        "curves": curves,  # fine-tuned: each rotation's validation loss against steps, per seed
        "losses": {name: token_mean(chunks) for name, chunks in losses.items()},
    }
    if finetune is not None:
        meta["steps"], meta["seeds"] = finetune.steps, list(finetune.seeds)
    return LayerProfile(
        kind="coverage_benefit",
        values=values,
        model={
            "pretrained": str(model.folder),
            "model_type": model.config.model_type,
            "n_layer": model.n_layer,
        },
        meta=meta,
    )


def coverage_probe(
    config_path: str | os.PathLike,
    levels: BudgetLevels,
    upgrades: int = 3,
    target: float = 0.01,
    progress=None,
) -> dict[str, Any]:
    """The noise of a coverage profile before it is measured: the base and ``upgrades`` evenly spaced
    upgrades on every validation chunk there is (max_val_blocks aside), the per-chunk std of each paired difference,
    and the chunks a 95 % CI of half-width ``target`` nats needs (the largest std decides)."""
    import statistics

    from scipy import stats

    check_coverage_levels(levels)
    model, datamodule = pretrained_model_and_data(config_path, all_validation=True)
    everything = coverage_rotations(model.n_layer, levels.low, levels.high)
    layers = sorted({round(i * (model.n_layer - 1) / max(1, upgrades - 1)) for i in range(upgrades)})
    rotations = {BASE: everything[BASE]} | {f"layer {i} high": everything[f"layer {i} high"] for i in layers}
    losses = layerwise_losses(
        model, list(datamodule.val_dataloader()), upgrade_variants(rotations), model.set_rotary, progress
    )
    n = len(losses[BASE])
    sds = {}
    for name in rotations:
        if name != BASE:
            sds[name] = statistics.stdev([b - u for (b, _), (u, _) in zip(losses[BASE], losses[name])])
    worst = max(sds.values())
    needed = next(k for k in range(2, 10_000) if stats.t.ppf(0.975, k - 1) * worst / k**0.5 <= target)
    return {
        "config": str(config_path),
        "context": int(datamodule.block_size),
        "chunks": n,
        "chunk_tokens": losses[BASE][0][1],  # tokens of one chunk (its blocks of the context)
        "levels": levels.to_dict(),
        "paired_std": sds,
        "benefit": {name: token_mean(losses[BASE]) - token_mean(losses[name]) for name in sds},
        "target": target,
        "chunks_needed": needed,
    }

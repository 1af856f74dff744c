"""Phase-off profile (PROTOCOL.md §R3): how much a trained model's loss depends on each layer's
rotary phase. For each layer l, the validation loss with the rotation angle forced to 0 in layer l
only (its rotary dims stay, with no phase); ``phase_off[l] = loss_off(l) - loss_ref``.
Optionally per query head.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from repro.lit.checkpoints import WIDTH_FIELDS, load_checked_model
from repro.models.gpt import GPT
from repro.runs import Progress, RunResult, RunSpec, train_all
from repro.runs.model_config import ModelConfig

from .budget import BudgetLevels, level_to_width
from .coverage_profile import run_name
from .profile import LayerProfile


@torch.no_grad()
def mean_loss(model: GPT, batches: list[dict[str, torch.Tensor]]) -> tuple[float, int]:
    """Token-weighted mean next-token loss over the batches, and the number of tokens."""
    model.eval()
    total, tokens = 0.0, 0
    device = next(model.parameters()).device
    for batch in batches:
        _, loss = model(batch["input_ids"].to(device), batch["targets"].to(device))
        n = batch["targets"].numel()
        total += float(loss) * n
        tokens += n
    if tokens == 0:
        raise ValueError("no evaluation tokens: the validation loader is empty")
    return total / tokens, tokens


def phase_off_values(
    model: GPT, batches: list[dict[str, torch.Tensor]], per_head: bool = False
) -> dict[str, Any]:
    """Loss increase per layer (and per head) with the rotation angle forced to 0 there."""
    ref, tokens = mean_loss(model, batches)
    values, heads = [], []
    for layer in range(model.config.n_layer):
        with model.phase_off([layer]):
            values.append(mean_loss(model, batches)[0] - ref)
        if per_head:
            row = []
            for head in range(model.config.n_head):
                with model.phase_off({layer: [head]}):
                    row.append(mean_loss(model, batches)[0] - ref)
            heads.append(row)
    return {"values": values, "per_head": heads if per_head else None, "loss_ref": ref, "tokens": tokens}


def measure_phase_off_profile(
    config: ModelConfig,
    checkpoint: str | Path,
    per_head: bool = False,
    cache_dir: str | None = None,
    device: str = "cpu",
) -> LayerProfile:
    """Phase-off profile of a trained checkpoint on the config's validation data (evaluated on ``device``)."""
    datamodule = config.datamodule(**({"cache_dir": cache_dir} if cache_dir else {}))
    datamodule.setup("validate")
    # the reference keeps its own widths (all high by the spec); every other field must match the config
    model, _ = load_checked_model(
        checkpoint, config.gpt_config(datamodule.model_vocab_size), ignore=WIDTH_FIELDS
    )
    batches = [{k: v.to(device) for k, v in b.items()} for b in datamodule.val_dataloader()]  # moved once
    measured = phase_off_values(model.to(device), batches, per_head)
    return LayerProfile(
        kind="phase_off",
        values=measured["values"],
        per_head=measured["per_head"],
        model=model.config.to_dict(),
        meta={
            "source": config.path,
            "checkpoint": str(checkpoint),
            "loss_ref": measured["loss_ref"],
            "eval_tokens": measured["tokens"],
            "per_head": per_head,
        },
    )


def reference_spec(
    config: ModelConfig,
    levels: BudgetLevels,
    steps: int,
    seed: int,
    eval_every: int,
    folder: Path,
    checkpoint_every: int = 0,
) -> RunSpec:
    """The all-high reference of the phase-off profile, saved as a checkpoint."""
    shape = config.shape_config()
    widths = [level_to_width(levels.high, shape, levels.unit)] * shape.n_layer
    return RunSpec.make(
        run_name(list(range(shape.n_layer)), seed, prefix="reference"),
        folder,
        config.path,
        seed,
        steps,
        eval_every,
        {f"model.gpt.{config.width_field}": widths},
        save_checkpoint=True,
        checkpoint_every=checkpoint_every,
    )


def train_reference(spec: RunSpec, accelerator: str = "cpu", cache_dir: str | None = None) -> RunResult:
    """Train (or reuse) the all-high reference model of the phase-off profile (``reference_spec``;
    with its ``checkpoint_every``, also its checkpoints along the way)."""
    return train_all([spec], accelerator, 1, cache_dir, Progress("phase-off", 1, spec.steps))[spec.key]

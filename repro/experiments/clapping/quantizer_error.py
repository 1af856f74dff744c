"""The quantizers on real boundary messages: the relative error ||C(x) - x|| / ||x|| of each grid
(the zero-level fixed point, the default, and the span grid without a zero level) at several bit
widths, on the activations (forward) and their gradients (backward) that cross the pipeline's
boundaries when the trained base model sees fine-tune data, one micro-batch at a time."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from repro.lit.checkpoints import load_checked_model
from repro.lit.stages import GPTStages
from repro.pipeline.compressors import QUANT_GRIDS, Quantize
from repro.pipeline.stage_parts import layers_per_stage


def boundary_messages(checkpoint: str, batch: dict[str, torch.Tensor], stages: int, micro_batches: int):
    """(forward activations, backward gradients) at every boundary of a K-stage split, per micro-batch."""
    model, _ = load_checked_model(checkpoint, None)
    model.train()
    parts = GPTStages(model).parts()
    counts = layers_per_stage(len(parts.layers), stages)
    boundaries = [
        sum(counts[: k + 1]) - 1 for k in range(stages - 1)
    ]  # the last layer of each stage but the last
    fwd, bwd = [], []
    for ids, targets in zip(batch["input_ids"].chunk(micro_batches), batch["targets"].chunk(micro_batches)):
        outs = []
        x = parts.first(ids)
        for i, layer in enumerate(parts.layers):
            x = layer(x)
            if i in boundaries:
                x.retain_grad()
                outs.append(x)
        model.loss(parts.last(x), targets).backward()
        fwd += [o.detach() for o in outs]
        bwd += [o.grad.detach() for o in outs]
        model.zero_grad(set_to_none=True)
    return fwd, bwd


def relative_errors(messages: list[torch.Tensor], bits: int, grid: str) -> float:
    comp = Quantize(bits, grid=grid)
    errors = []
    for x in messages:
        x_hat = comp.decompress(comp.compress(x), tuple(x.shape), x.dtype)
        errors.append(float((x_hat - x).norm() / x.norm().clamp_min(1e-30)))
    return statistics.fmean(errors)


def quantizer_error_table(
    checkpoint: str, batch: dict[str, torch.Tensor], stages: int, micro_batches: int, bits: tuple[int, ...]
) -> list[dict[str, Any]]:
    """One record per (direction, grid, bits): the mean relative error over boundaries and micro-batches."""
    fwd, bwd = boundary_messages(checkpoint, batch, stages, micro_batches)
    return [
        {
            "direction": direction,
            "grid": grid,
            "bits": b,
            "relative_error": relative_errors(messages, b, grid),
            "messages": len(messages),
        }
        for direction, messages in (("fwd", fwd), ("bwd", bwd))
        for grid in QUANT_GRIDS
        for b in bits
    ]

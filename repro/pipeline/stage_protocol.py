"""The stage protocol: how a LightningModule hands its model to the pipeline, and how the parts
are split over the stages.

A module implements three methods:

- ``pipeline_parts() -> StageParts``: the ordered parts: ``first`` (stage 0, e.g. the embedding),
  ``layers`` (split over the stages by count) and ``last`` (the last stage, e.g. final norm and
  head). Each part maps the previous part's output tensor to its own output tensor.
- ``pipeline_input(batch) -> Tensor``: what ``first`` consumes, from a (micro-)batch.
- ``pipeline_loss(output, batch) -> Tensor``: the mean loss of a micro-batch from ``last``'s output.

and, optionally, ``pipeline_log(split, loss, batch)``: log a step's loss (every rank calls it with
the same value; ``split`` is 'train', 'val' or 'test'). Without it the strategy logs ``<split>/loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import torch
from torch import nn


@dataclass
class StageParts:
    first: nn.Module  # runs on stage 0 before the layers (e.g. token embedding)
    layers: Sequence[nn.Module]  # split over the stages by count
    last: nn.Module  # runs on the last stage after the layers (e.g. final norm and output head)


@runtime_checkable
class PipelineStageModule(Protocol):
    def pipeline_parts(self) -> StageParts: ...

    def pipeline_input(self, batch: Any) -> torch.Tensor: ...

    def pipeline_loss(self, output: torch.Tensor, batch: Any) -> torch.Tensor: ...


REQUIRED = ("pipeline_parts", "pipeline_input", "pipeline_loss")


def check_stage_protocol(module: object) -> None:
    missing = [name for name in REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise TypeError(
            f"{type(module).__name__} does not implement the pipeline stage protocol: missing "
            f"{', '.join(missing)}. A module trained with strategy='clapping' must define pipeline_parts() "
            f"(first, layers, last), pipeline_input(batch) and pipeline_loss(output, batch); "
            f"see repro/pipeline/stage_protocol.py and the README"
        )


def layers_per_stage(n_layers: int, n_stages: int, explicit: Sequence[int] | None = None) -> list[int]:
    """How many layers each stage holds: ``explicit`` if given (checked), else as even as possible
    (the first ``n_layers % n_stages`` stages hold one more)."""
    if n_stages > n_layers:
        raise ValueError(
            f"stages={n_stages}: the model has only {n_layers} layers to split; every stage needs at least "
            f"one layer, so use at most {n_layers} stages (devices)"
        )
    if explicit is not None:
        explicit = [int(c) for c in explicit]
        if len(explicit) != n_stages or sum(explicit) != n_layers or min(explicit) < 1:
            raise ValueError(
                f"layers_per_stage={explicit}: must list {n_stages} counts (one per stage), each >= 1, "
                f"summing to the model's {n_layers} layers"
            )
        return explicit
    base, extra = divmod(n_layers, n_stages)
    return [base + (1 if s < extra else 0) for s in range(n_stages)]


@dataclass
class StageSplit:
    """What stage ``stage`` holds."""

    stage: int
    num_stages: int
    counts: list[int]
    parts: StageParts

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def layer_range(self, stage: int | None = None) -> range:
        s = self.stage if stage is None else stage
        start = sum(self.counts[:s])
        return range(start, start + self.counts[s])

    def modules_of(self, stage: int) -> list[nn.Module]:
        mods: list[nn.Module] = [self.parts.first] if stage == 0 else []
        mods += [self.parts.layers[i] for i in self.layer_range(stage)]
        if stage == self.num_stages - 1:
            mods.append(self.parts.last)
        return mods

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This stage's parts applied in order."""
        if self.is_first:
            x = self.parts.first(x)
        for i in self.layer_range():
            x = self.parts.layers[i](x)
        if self.is_last:
            x = self.parts.last(x)
        return x

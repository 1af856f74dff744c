"""How a model is cut into pipeline stages: the parts, how they are split over the stages, and
the protocol of the adapter that cuts a model.

A model is an ordered list of parts: ``first`` (stage 0, e.g. the embedding), ``layers`` (split
over the stages by count) and ``last`` (the last stage, e.g. final norm and head). Each part maps
the previous part's output tensor to its own. A :class:`StageAdapter` says what those parts are
for a trained module, what the first part reads from a batch, and how the loss is computed.

A LightningModule gives its adapter by a method ``pipeline_stages() -> StageAdapter`` (see
:func:`stage_adapter_for`). No concrete model is cut here: the suite's adapters live beside their
modules (``repro.lit.stages``: ``GPTStages`` of the suite's GPT, ``HFStages`` of a Hugging Face
causal LM), and the strategy knows them only through this protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@dataclass
class StageParts:
    first: nn.Module  # runs on stage 0 before the layers (e.g. token embedding)
    layers: Sequence[nn.Module]  # split over the stages by count
    last: nn.Module  # runs on the last stage after the layers (e.g. final norm and output head)


@runtime_checkable
class StageAdapter(Protocol):
    """What the pipeline needs from a model."""

    def parts(self) -> StageParts: ...  # the model cut into first, layers, last

    def input(self, batch: Any) -> torch.Tensor: ...  # what ``first`` consumes, from a (micro-)batch

    def loss(self, output: torch.Tensor, batch: Any) -> torch.Tensor: ...  # mean loss of a micro-batch

    def weight(self, batch: Any) -> int: ...  # how many units the mean loss of a batch averages over


# the stage adapter's methods, as an error names them
PROTOCOL = {
    "parts": "parts()",
    "input": "input(batch)",
    "loss": "loss(output, batch)",
    "weight": "weight(batch)",
}


class ModelPart(nn.Module):
    """Some submodules of a model, run by one of the model's own methods. The submodules are
    registered here (their parameters belong to this part); the model itself is not, so a part
    holds exactly the parameters it uses."""

    def __init__(self, modules: dict[str, nn.Module], run: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)
        self.run = run  # a bound method of the model (not a submodule)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)


@runtime_checkable
class MaterializesStages(Protocol):
    """An adapter whose model is built without its weights (on the meta device): the strategy asks
    it to read only the parts of the rank's own stage."""

    def materialize(self, modules: list[nn.Module]) -> None: ...


def stage_adapter_for(module: object) -> StageAdapter:
    """The adapter a LightningModule returns from its ``pipeline_stages()`` (checked against the
    protocol); a module without one is refused with what to implement."""
    own = getattr(module, "pipeline_stages", None)
    if not callable(own):
        raise TypeError(
            f"{type(module).__name__} does not implement the pipeline stage protocol: give it a method "
            f"pipeline_stages() returning a stage adapter ({', '.join(PROTOCOL.values())}); for a suite GPT "
            f"as its model, `return GPTStages(self.model)` (repro.lit.stages; docs/strategy.md, 'Your own "
            f"LightningModule')"
        )
    adapter = own()
    missing = [PROTOCOL[name] for name in PROTOCOL if not callable(getattr(adapter, name, None))]
    if missing:
        raise TypeError(
            f"{type(module).__name__}.pipeline_stages() returned a {type(adapter).__name__}, which lacks "
            f"{' and '.join(missing)}; a stage adapter has {', '.join(PROTOCOL.values())} "
            f"(docs/strategy.md, 'Your own LightningModule')"
        )
    return adapter


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


PLACEMENTS = ("linear", "v")  # where the model's first part runs: on stage 0, or on the last stage


@dataclass
class StageSplit:
    """What stage ``stage`` holds. With ``placement='v'`` the model's ``first`` part (e.g. a token
    embedding tied to the output head) runs on the last stage, beside ``last``: the last stage
    sends its output to stage 0 (the pipeline's wrap-around boundary, ``num_stages - 1``) and
    receives its gradient back, so a weight that ``first`` and ``last`` share has one copy."""

    stage: int
    num_stages: int
    counts: list[int]
    parts: StageParts
    placement: str = "linear"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r}: allowed values are {PLACEMENTS}")
        if self.placement == "v" and self.num_stages < 2:
            raise ValueError(
                "placement='v' runs the first part on the last stage: it needs at least 2 stages"
            )

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def first_part_stage(self) -> int:
        """The stage that runs the model's ``first`` part."""
        return self.num_stages - 1 if self.placement == "v" else 0

    @property
    def wraps(self) -> bool:
        """The last stage sends to stage 0 (``placement='v'``)."""
        return self.placement == "v"

    @property
    def num_boundaries(self) -> int:
        """Boundaries with messages: ``b`` is from stage ``b`` to ``(b + 1) % num_stages``."""
        return self.num_stages if self.wraps else self.num_stages - 1

    @property
    def receives_input(self) -> bool:
        """This stage's layers start from a message (else from the ``first`` part, here)."""
        return not self.is_first or self.wraps

    @property
    def previous(self) -> int:
        """The stage this one receives its input from."""
        return (self.stage - 1) % self.num_stages

    @property
    def next(self) -> int:
        """The stage this one sends its forward messages to (the last stage's go to stage 0, 'v')."""
        return (self.stage + 1) % self.num_stages

    def layer_range(self, stage: int | None = None) -> range:
        s = self.stage if stage is None else stage
        start = sum(self.counts[:s])
        return range(start, start + self.counts[s])

    def chain_of(self, stage: int) -> list[nn.Module]:
        """What ``stage`` runs on its input, in order (the first part only where it feeds the layers)."""
        mods: list[nn.Module] = [self.parts.first] if stage == 0 and not self.wraps else []
        mods += [self.parts.layers[i] for i in self.layer_range(stage)]
        if stage == self.num_stages - 1:
            mods.append(self.parts.last)
        return mods

    def modules_of(self, stage: int) -> list[nn.Module]:
        """Every part ``stage`` holds."""
        chain = self.chain_of(stage)
        return [self.parts.first, *chain] if self.wraps and stage == self.first_part_stage else chain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This stage's chain applied in order."""
        for module in self.chain_of(self.stage):
            x = module(x)
        return x

    def forward_first(self, x: torch.Tensor) -> torch.Tensor:
        """The model's first part (on the last stage, ``placement='v'``)."""
        return self.parts.first(x)


def parameters_line(split: StageSplit) -> str:
    """The parameters of every stage, in one line (Lightning's model summary counts one stage)."""
    k = split.num_stages
    held = [{id(p): p.numel() for m in split.modules_of(s) for p in m.parameters()} for s in range(k)]
    per_stage = [sum(params.values()) for params in held]
    return (
        f"[clapping] {k} stages: {per_stage} parameters per stage, {sum(per_stage):,} in all (a weight tied "
        f"across stages counts on each); Lightning's model summary counts rank 0's stage alone"
    )

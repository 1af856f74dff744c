"""How a model is cut into pipeline stages: the parts, how they are split over the stages, and
the one adapter that cuts the suite's GPT.

A model is an ordered list of parts: ``first`` (stage 0, e.g. the embedding), ``layers`` (split
over the stages by count) and ``last`` (the last stage, e.g. final norm and head). Each part maps
the previous part's output tensor to its own. A :class:`StageAdapter` says what those parts are
for a trained module, what the first part reads from a batch, and how the loss is computed.

- :class:`GPTStages` is the adapter of a plain :class:`repro.models.GPT` (batches with
  ``input_ids`` and ``targets``). The Lightning strategy and the bench's
  ``torch.distributed.pipelining`` comparison both cut the GPT with it.
- Any other model: give the LightningModule a method ``pipeline_stages() -> StageAdapter``
  (see :func:`stage_adapter_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from repro.models.gpt import GPT


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


class GPTStages:
    """The stage adapter of the suite's GPT: embedding, the blocks, final norm and head; batches
    are dicts with ``input_ids`` and ``targets`` (-100 = ignored)."""

    def __init__(self, gpt: GPT) -> None:
        self.gpt = gpt

    def parts(self) -> StageParts:
        gpt = self.gpt
        return StageParts(
            first=ModelPart({"wte": gpt.wte, "drop": gpt.drop}, gpt.embed),
            layers=list(gpt.blocks),
            last=ModelPart({"norm_f": gpt.norm_f, "lm_head": gpt.lm_head}, gpt.head),
        )

    def materialize(self, modules: list[nn.Module]) -> None:
        """A GPT built deferred (on meta) draws its seed-built weights of these parts only."""
        self.gpt.materialize(modules)

    def input(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["input_ids"]

    def loss(self, output: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return GPT.loss(output, batch["targets"])

    def weight(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["targets"] != -100).sum())


@runtime_checkable
class MaterializesStages(Protocol):
    """An adapter whose model is built without its weights (on the meta device): the strategy asks
    it to read only the parts of the rank's own stage."""

    def materialize(self, modules: list[nn.Module]) -> None: ...


class HFStages:
    """The stage adapter of a Hugging Face causal LM (``repro.models.hf_causal_lm``): embedding,
    decoder layers (each with its rotary embeddings and causal mask), final norm and head; each
    rank reads only its own stage's tensors."""

    def __init__(self, model) -> None:
        self.model = model

    def parts(self) -> StageParts:
        first, layers, last = self.model.parts()
        return StageParts(first=first, layers=layers, last=last)

    def materialize(self, modules: list[nn.Module]) -> None:
        self.model.materialize(modules)

    def input(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["input_ids"]

    def loss(self, output: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.loss(output, batch["targets"])

    def weight(self, batch: dict[str, torch.Tensor]) -> int:
        return int((batch["targets"] != -100).sum())


def stage_adapter_for(module: object) -> StageAdapter:
    """The adapter of a LightningModule: its own ``pipeline_stages()``, or :class:`GPTStages` when
    its ``model`` attribute is a suite GPT; anything else is refused with what to implement."""
    own = getattr(module, "pipeline_stages", None)
    if callable(own):
        adapter = own()
        missing = [PROTOCOL[name] for name in PROTOCOL if not callable(getattr(adapter, name, None))]
        if missing:
            raise TypeError(
                f"{type(module).__name__}.pipeline_stages() returned a {type(adapter).__name__}, which lacks "
                f"{' and '.join(missing)}; a stage adapter has {', '.join(PROTOCOL.values())} "
                f"(docs/strategy.md, 'Your own LightningModule')"
            )
        return adapter
    if isinstance(getattr(module, "model", None), GPT):
        return GPTStages(module.model)
    raise TypeError(
        f"{type(module).__name__} does not implement the pipeline stage protocol: give it a method "
        f"pipeline_stages() returning a stage adapter ({', '.join(PROTOCOL.values())}), or a `model` attribute "
        f"that is a repro.models.GPT (docs/strategy.md, 'Your own LightningModule')"
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
        for module in self.modules_of(self.stage):
            x = module(x)
        return x


def parameters_line(split: StageSplit) -> str:
    """The parameters of every stage, in one line (Lightning's model summary counts one stage)."""
    k = split.num_stages
    per_stage = [sum(p.numel() for m in split.modules_of(s) for p in m.parameters()) for s in range(k)]
    return (
        f"[clapping] {k} stages: {per_stage} parameters per stage, {sum(per_stage):,} in all (a tied embedding "
        f"counts on both its stages); Lightning's model summary counts rank 0's stage alone"
    )

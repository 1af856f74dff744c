"""The stage adapters of the suite's models, beside their LightningModules (the strategy knows
them only through the protocol of ``repro.pipeline.stage_parts``): ``GPTStages`` cuts the suite's
GPT, ``HFStages`` a Hugging Face causal LM. A module returns its adapter from ``pipeline_stages()``."""

from __future__ import annotations

import torch
from torch import nn

from repro.models.gpt import GPT
from repro.pipeline.stage_parts import ModelPart, StageParts


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

"""The seams between the pipeline strategy and the code around it, declared (a rename is then an
error at the check, not a feature silently switched off):

- a LightningModule that ``RecordsEvalLoss`` gets the pipeline's evaluation losses through its own
  metric (the suite's modules do); any other one gets ``<split>/loss`` logged;
- a datamodule that ``HasShuffleSeed`` seeds the pipeline's sampler (unless ``sampler_seed`` is set);
- a strategy that ``ReportsPipeline`` (``ClappingStrategy``) brings its statistics up to date and
  summarises a run for the engine's result files.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class RecordsEvalLoss(Protocol):
    def record_eval_loss(self, split: str, loss: torch.Tensor, n_tokens: int) -> None: ...


@runtime_checkable
class HasShuffleSeed(Protocol):
    shuffle_seed: int


@runtime_checkable
class ReportsPipeline(Protocol):
    def flush_statistics(self) -> None: ...

    def run_summary(self) -> dict[str, Any]: ...

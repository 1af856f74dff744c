"""Validation and test through the pipeline: each batch's micro-batches run forward over the
stages with exact (uncompressed) messages, so ``val/loss`` measures the model, not the link; the
last stage's loss is summed over the ranks and logged on every rank (the module's own metric when
it ``RecordsEvalLoss``). ``predict`` is refused."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..runner import split_batch
from ..transport import stage_collectives
from .seams import RecordsEvalLoss


class PipelineEvaluation:
    """The evaluation steps of ``ClappingStrategy`` (which provides the runner, adapter and ranks)."""

    def _evaluate(self, split_name: str, batch: Any) -> torch.Tensor:
        micro = split_batch(batch, self.options.micro_batches, equal=False)
        with self.precision_plugin.val_step_context():
            total, count = self.runner.eval_step(micro)
        vec = torch.zeros(2, dtype=torch.float64, device=self.root_device)
        if total is not None:
            vec[0], vec[1] = total, count
        with stage_collectives(self.global_rank, f"the {split_name} loss's reduction"):
            dist.all_reduce(vec)
        loss = (vec[0] / vec[1]).float()
        weight = self.adapter.weight(batch)
        if isinstance(self.lightning_module, RecordsEvalLoss):
            self.lightning_module.record_eval_loss(split_name, loss, weight)
        else:
            self.lightning_module.log(
                f"{split_name}/loss", loss, on_step=False, on_epoch=True, batch_size=weight
            )
        return loss

    def validation_step(self, *args: Any, **kwargs: Any):
        return self._evaluate("val", args[0] if args else kwargs["batch"])

    def test_step(self, *args: Any, **kwargs: Any):
        return self._evaluate("test", args[0] if args else kwargs["batch"])

    def predict_step(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(
            "strategy='clapping' does not predict; load its checkpoint (the full model) into a single-process "
            "Trainer for predictions"
        )

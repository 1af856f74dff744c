"""The seams between the pipeline strategy and the code around it, declared (a rename is then an
error at the check, not a feature silently switched off):

- a LightningModule that ``RecordsEvalLoss`` gets the pipeline's evaluation losses through its own
  metric (the suite's modules do); any other one gets ``<split>/loss`` logged;
- a datamodule that ``HasShuffleSeed`` seeds the pipeline's sampler (unless ``sampler_seed`` is set),
  and one that ``HasBatchShape`` prices ``placement: auto`` before the first batch (as does a
  DataLoader passed to ``fit``, from its batch size and its dataset's first item);
- a strategy that ``ReportsPipeline`` (``ClappingStrategy``) brings its statistics up to date and
  summarises a run for the engine's result files;
- a LightningModule's own ``training_step``, ``validation_step`` and ``test_step`` do not run under
  the pipeline (its stage adapter's ``loss`` does); ``steps_not_run`` names them, in one line said at
  start, unless the module declares ``pipeline_replaces_steps = True`` (its steps compute what the
  adapter does, as the suite's modules' do).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from torch.utils.data import IterableDataset

from repro import lightning_compat as compat
from repro.pipeline.auto_placement import PlacementChoice, choose_placement

from .checkpoint import written_placement

STEPS = ("training_step", "validation_step", "test_step")


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


def steps_not_run(module: L.LightningModule) -> str | None:
    """One line naming the module's own steps that the pipeline replaces (None when it defines none
    or declares ``pipeline_replaces_steps``)."""
    if getattr(module, "pipeline_replaces_steps", False):
        return None
    cls = type(module)
    own = [name for name in STEPS if getattr(cls, name, None) is not getattr(L.LightningModule, name)]
    if not own:
        return None
    names = ", ".join(f"{cls.__name__}.{name}" for name in own)
    return (
        f"[clapping] {names} will not run (nor their self.log calls): the pipeline computes each micro-batch's "
        f"loss with {cls.__name__}.pipeline_stages()'s loss() and logs train/loss, val/loss, test/loss itself; "
        f"set pipeline_replaces_steps = True on {cls.__name__} once they compute the same (docs/strategy.md)"
    )


@runtime_checkable
class HasBatchShape(Protocol):
    batch_size: int
    block_size: int


def loader_batch_shape(loader: Any) -> tuple[int, int] | None:
    """(sequences, tokens) of a step from a DataLoader: its batch size and its dataset's first item
    (``input_ids``, or the first tensor of the item), read without drawing a batch (no sampler or
    generator moves, so the run's data order is untouched); None when it cannot say."""
    batch_size = getattr(loader, "batch_size", None)
    dataset = getattr(loader, "dataset", None)
    if batch_size is None or dataset is None or isinstance(dataset, IterableDataset):
        return None
    try:
        item = dataset[0]
    except Exception:  # a dataset that cannot be indexed: no shape before the first batch
        return None
    if isinstance(item, dict):
        item = item.get("input_ids", next(iter(item.values()), None))
    elif isinstance(item, (tuple, list)):
        item = item[0] if item else None
    if not isinstance(item, torch.Tensor) or item.dim() == 0:
        return None
    return int(batch_size), int(item.shape[-1])


def resolve_placement(strategy: Any, trainer: L.Trainer, parts: Any) -> tuple[str, str | None]:
    """The strategy's placement, and for ``auto`` the line that says which and why: a resumed run
    keeps its checkpoint's; otherwise :func:`~repro.pipeline.auto_placement.choose_placement` prices
    both from a datamodule that ``HasBatchShape`` (its batch and block size: the shape of every step)
    or from a DataLoader passed to ``fit`` (:func:`loader_batch_shape`)."""
    options = strategy.options
    if options.placement != "auto":
        return options.placement, None
    written = written_placement(getattr(trainer, "ckpt_path", None))
    if written is not None:
        return written, PlacementChoice(written, "as the checkpoint was written").line()
    dm = getattr(trainer, "datamodule", None)
    if isinstance(dm, HasBatchShape):
        shape = (int(dm.batch_size), int(dm.block_size))
    else:
        shape = loader_batch_shape(compat.passed_train_loader(trainer))
    choice = choose_placement(
        parts, strategy.num_stages, options.micro_batches, shape, options.fwd, options.bwd, options.tied
    )
    return choice.placement, choice.line()

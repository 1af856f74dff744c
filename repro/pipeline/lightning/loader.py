"""The pipeline's training loader: every rank draws the same batches from the one sampler of the
suite (lazy reuse with probability 1 - p; p = 1 is the ordinary shuffled order), started at the
run's step (``PipelineState.steps_done``), and the codecs of the rank's channel ends are built
once the dataset size is known."""

from __future__ import annotations

import torch
from lightning.pytorch.trainer.states import RunningStage
from torch.utils.data import DataLoader

from repro.data.sampler import LazyBatchSampler

from ..codecs import build_codecs
from ..sample_buffers import SampleBuffers
from .seams import HasShuffleSeed


def training_loader(strategy, dataloader: object) -> object:
    """The training DataLoader with the strategy's sampler (other loaders are left as they are)."""
    trainer = strategy.lightning_module.trainer if strategy.lightning_module is not None else None
    if (
        trainer is None
        or trainer.state.stage != RunningStage.TRAINING
        or not isinstance(dataloader, DataLoader)
    ):
        return dataloader
    batch_size = dataloader.batch_size or getattr(dataloader.batch_sampler, "batch_size", None)
    if batch_size is None:
        raise ValueError("strategy='clapping' needs a training DataLoader with a batch_size")
    m = strategy.options.micro_batches
    if batch_size % m:
        raise ValueError(
            f"strategy micro_batches={m}: the training batch size {batch_size} does not divide into {m} equal "
            f"micro-batches; choose a batch size divisible by micro_batches"
        )
    seed = strategy.options.sampler_seed
    if seed is None:
        seed = trainer.datamodule.shuffle_seed if isinstance(trainer.datamodule, HasShuffleSeed) else 0
    state = strategy.state
    state.attach_sampler(LazyBatchSampler(len(dataloader.dataset), batch_size, strategy.options.p, int(seed)))
    build_stage_codecs(strategy, len(dataloader.dataset))
    workers = dataloader.num_workers
    return DataLoader(
        dataloader.dataset,
        batch_sampler=state.sampler,
        num_workers=workers,
        collate_fn=dataloader.collate_fn,
        pin_memory=dataloader.pin_memory,
        worker_init_fn=dataloader.worker_init_fn,
        persistent_workers=dataloader.persistent_workers if workers > 0 else False,
    )


def build_stage_codecs(strategy, dataset_size: int) -> None:
    """This rank's channel ends (once), with any codec state a checkpoint left waiting."""
    if strategy.state.codecs:
        return
    opts = strategy.options
    n_samples = opts.aqsgd_num_samples or dataset_size

    def rows(boundary: int, role: str) -> SampleBuffers:
        return SampleBuffers(n_samples, opts.aqsgd_storage, opts.aqsgd_dir, f"aqsgd-b{boundary}-{role}")

    codecs = build_codecs(
        opts.method, opts.compressors, strategy.global_rank, strategy.num_stages, opts.compression_seed, rows,
        wraps=strategy.split.wraps,
    )  # fmt: skip
    strategy.state.attach_codecs(codecs, strategy.root_device)


def check_reuse(ids: torch.Tensor | None, previous: torch.Tensor | None, fresh: bool, step: int):
    """A step that reuses its batch (lazy sampling) got the previous step's sample ids; returns
    this step's ids (what the next step compares against)."""
    if ids is None:
        return previous
    if not fresh and previous is not None and not torch.equal(ids.cpu(), previous):
        raise RuntimeError(
            f"lazy sampling: step {step} should repeat the previous batch but got other sample ids; the training "
            f"DataLoader was replaced after the strategy set its sampler"
        )
    return ids.detach().cpu().clone()

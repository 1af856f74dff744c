"""The training batches of ``DataLoader(shuffle=True, drop_last=True, generator=seeded)`` as
Lightning consumes them, in the same order, as a batch sampler that can start at any (epoch,
batch): a run resumed from a mid-epoch checkpoint sees exactly the batches the uninterrupted run saw.

Each epoch torch draws, from the loader's generator, one int64 (the iterator's base seed) and then
the sampler's permutation. Lightning stops after ``len(loader)`` batches, so RandomSampler's
trailing ``randperm(n)[:0]`` is never reached. ``epoch_order`` replays those draws."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of ``epoch`` (0-based) of a shuffled DataLoader seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epoch + 1):
        torch.empty((), dtype=torch.int64).random_(generator=gen)  # the iterator's base seed
        order = torch.randperm(n, generator=gen)
    return order


class ResumableShuffleBatches(Sampler[list[int]]):
    """Batches of ``batch_size`` (the last partial batch dropped), reshuffled each epoch.

    Args:
        num_samples: Size of the dataset.
        batch_size: Samples per batch.
        seed: The shuffle seed (as ``generator=torch.Generator().manual_seed(seed)``).
        start_epoch, start_batch: Where the first iteration starts (a resume). Each further
            iteration is the next epoch, from its first batch (as each ``iter()`` of the loader is).
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int, start_epoch: int = 0, start_batch: int = 0) -> None:
        if num_samples < batch_size:
            raise ValueError(f"batch_size={batch_size}: the dataset has only {num_samples} samples")
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.epoch = start_epoch
        self._skip = start_batch  # batches the first iteration skips (a resume)

    def set_epoch(self, epoch: int) -> None:
        """The next iteration is ``epoch`` (from its first batch)."""
        self.epoch = epoch
        self._skip = 0

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        self.epoch += 1  # the next iteration is the next epoch (Lightning may stop this one early)
        first, self._skip = self._skip, 0  # the resume offset applies once
        order = epoch_order(self.num_samples, self.seed, epoch).tolist()
        for b in range(first, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size]

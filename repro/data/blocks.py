"""Fixed-length training samples over a split's token stream: the split's shards end to end.

The stream is cut into windows of ``block_size + 1`` tokens starting ``block_size`` apart, so
neighbours share one token (llm.c's convention; input = the first ``block_size``, target = the
last ``block_size``); a block may span two shards. The dataset is
map-style, so the suite's sampler (shuffle seed, lazy reuse, resume at any step) and AQ-SGD's
sample ids work on any corpus size; tokens are read from the memory-mapped shards only when a
block is used. A sample is a dict with ``input_ids`` (T,), ``targets`` (T,) and ``sample_id``:
the sample's index in the dataset (0..N-1), a stable id per-sample methods key their buffers by.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate


def evenly_spaced(n: int, at_most: int | None) -> np.ndarray | None:
    """``at_most`` evenly spaced indices of ``0..n-1`` (None: all of them)."""
    if at_most is None or at_most >= n:
        return None
    return np.unique(np.linspace(0, n - 1, at_most).round().astype(np.int64))


class PackedBlocks(Dataset):
    """Non-overlapping (input, target) blocks of a token stream held in one or more arrays."""

    def __init__(
        self,
        tokens: np.ndarray | Sequence[np.ndarray],
        block_size: int,
        indices: np.ndarray | None = None,
    ) -> None:
        self.pieces = [tokens] if isinstance(tokens, np.ndarray) else [p for p in tokens if len(p)]
        lengths = np.array([len(p) for p in self.pieces], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(lengths)])  # offset of each piece in the stream
        self.num_tokens = int(self.starts[-1])
        self.block_size = block_size
        self.num_blocks = max(0, (self.num_tokens - 1) // block_size)
        self.indices = np.arange(self.num_blocks) if indices is None else np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def window(self, start: int, length: int) -> np.ndarray:
        """Tokens ``start .. start + length - 1`` of the stream (across pieces when needed)."""
        piece = int(np.searchsorted(self.starts, start, side="right")) - 1
        offset = start - int(self.starts[piece])
        first = self.pieces[piece][offset : offset + length]
        if len(first) == length:
            return np.asarray(first)
        parts, need = [np.asarray(first)], length - len(first)
        while need > 0:
            piece += 1
            part = np.asarray(self.pieces[piece][:need])
            parts.append(part)
            need -= len(part)
        return np.concatenate(parts)

    def _block(self, i: int) -> torch.Tensor:
        start = int(self.indices[i]) * self.block_size
        return torch.from_numpy(self.window(start, self.block_size + 1).astype(np.int64))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        chunk = self._block(i)
        return {"input_ids": chunk[:-1], "targets": chunk[1:], "sample_id": torch.tensor(i)}

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        """A whole batch at once (the DataLoader's batched fetch): one gather and one int64
        conversion. The samples come stacked as well, which ``collate_blocks`` passes through
        (any other collate function sees the usual list of samples)."""
        starts = self.indices[np.asarray(indices, dtype=np.int64)] * self.block_size
        rows = np.stack([self.window(int(s), self.block_size + 1) for s in starts]).astype(np.int64)
        batch = {
            "input_ids": torch.from_numpy(np.ascontiguousarray(rows[:, :-1])),
            "targets": torch.from_numpy(np.ascontiguousarray(rows[:, 1:])),
            "sample_id": torch.as_tensor(indices, dtype=torch.int64),
        }
        return StackedSamples({k: v[j] for k, v in batch.items()} for j in range(len(indices))).with_batch(
            batch
        )


class StackedSamples(list):
    """A list of samples that also holds them stacked into a batch."""

    batch: dict[str, torch.Tensor]

    def with_batch(self, batch: dict[str, torch.Tensor]) -> StackedSamples:
        self.batch = batch
        return self


def collate_blocks(samples):
    """The collate function of block loaders: samples that come stacked are passed through."""
    if isinstance(samples, StackedSamples):
        return samples.batch
    return default_collate(samples)

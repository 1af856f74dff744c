"""What every benchmark trains: a GPT built from the bench settings, on synthetic token blocks
(timing does not depend on the token values, and no corpus or tokenizer is needed)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from repro.models import GPTConfig

from .settings import BenchSettings

# A constant learning rate, no warm-up: every step costs the same.
OPTIM = {"lr": 1e-3, "warmup_steps": 0, "schedule": "constant"}


class RandomBlocks(Dataset):
    """``n`` fixed random (input, target) blocks with their sample ids (the suite's batch format)."""

    def __init__(self, n: int, block_size: int, vocab_size: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab_size, (n, block_size + 1), generator=gen)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.tokens[i]
        return {"input_ids": row[:-1], "targets": row[1:], "sample_id": torch.tensor(i)}


def gpt_config(s: BenchSettings, block_size: int | None = None, **fields: Any) -> GPTConfig:
    """The bench GPT (MHA with half RoPE coverage unless ``fields`` say otherwise)."""
    base: dict[str, Any] = dict(
        n_layer=s.n_layer,
        n_embd=s.n_embd,
        n_head=s.n_head,
        vocab_size=s.vocab_size,
        block_size=block_size or s.block_size,
        rope_dims=[s.head_dim // 2] * s.n_layer,
    )
    base.update(fields)
    return GPTConfig(**base)


def loader(s: BenchSettings, steps: int, block_size: int | None = None, shuffle: bool = False) -> DataLoader:
    """Enough blocks for ``steps`` batches, in a fixed order."""
    data = RandomBlocks(steps * s.batch_size, block_size or s.block_size, s.vocab_size)
    return DataLoader(data, batch_size=s.batch_size, shuffle=shuffle, drop_last=True)

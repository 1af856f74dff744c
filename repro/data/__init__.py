"""Corpora, tokenizers, token shards and the LightningDataModule that reads them.

The datamodule and the block dataset (which need torch and Lightning) are imported on first use,
so ``repro data`` starts without them."""

from .sources import Document

__all__ = ["Document", "PackedBlocks", "TextDataModule"]


def __getattr__(name: str):
    if name == "TextDataModule":
        from .datamodule import TextDataModule

        return TextDataModule
    if name == "PackedBlocks":
        from .blocks import PackedBlocks

        return PackedBlocks
    raise AttributeError(f"module 'repro.data' has no attribute {name!r}")

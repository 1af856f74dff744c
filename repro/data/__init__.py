"""Offline corpora, local tokenizers and the LightningDataModule."""

from .corpus import Document, DocumentSplit, load_documents, split_documents
from .datamodule import PackedBlocks, TextDataModule

__all__ = ["Document", "DocumentSplit", "PackedBlocks", "TextDataModule", "load_documents", "split_documents"]

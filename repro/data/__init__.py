"""Corpora, tokenizers, token shards and the LightningDataModule that reads them."""

from .blocks import PackedBlocks
from .corpus import Document, DocumentSplit, load_documents, split_documents
from .datamodule import TextDataModule

__all__ = ["Document", "DocumentSplit", "PackedBlocks", "TextDataModule", "load_documents", "split_documents"]

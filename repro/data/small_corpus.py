"""A small corpus (the plays, a few text files, a save_to_disk folder) as the datamodule uses it:
split by whole documents in memory, its tokenizer trained (or a tokenizer file), and its shards
written into the cache as a prepared folder by the one writer, so it is read like any other."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .corpus import DocumentSplit, load_documents, split_documents
from .prepared import DEFAULT_SHARD_TOKENS, MANIFEST
from .shards import dtype_for_vocab
from .tokenizer import TextTokenizer, load_or_train_tokenizer, load_tokenizer_file, tokenizer_digest
from .writing import write_prepared


@dataclass
class SmallCorpus:
    """The datamodule's small-corpus settings (its parameters of the same names)."""

    corpus: str
    cache_dir: Path
    text_files: list[str] | None
    hf_dataset_dir: str | None
    text_field: str
    strip_markdown: bool
    val_fraction: float
    val_documents: list[str] | None
    test_fraction: float
    test_documents: list[str] | None
    finetune_documents: list[str] | None
    train_subset: str
    split_seed: int
    tokenizer: str  # the kind ('bpe', 'char'); the tokenizer itself is text_tokenizer
    vocab_size: int
    tokenizer_file: str | None
    eos_token: str | None
    _split: DocumentSplit | None = field(default=None, init=False)
    _tokenizer_documents: list = field(default_factory=list, init=False)  # what the tokenizer learns from
    _tokenizer: TextTokenizer | None = field(default=None, init=False)
    tokenizer_path: Path | None = field(default=None, init=False)

    @classmethod
    def of(cls, parameters: Mapping[str, Any]) -> SmallCorpus:
        """The small corpus of a datamodule's parameters (its ``hparams``)."""
        return cls(**{f.name: parameters[f.name] for f in fields(cls) if f.init})

    def __post_init__(self) -> None:
        self.cache_dir = Path(self.cache_dir)

    @property
    def split(self) -> DocumentSplit:
        if self._split is None:
            loaded = load_documents(
                self.corpus,
                self.cache_dir,
                text_files=self.text_files,
                hf_dataset_dir=self.hf_dataset_dir,
                text_field=self.text_field,
                strip_markdown=self.strip_markdown,
            )
            if isinstance(loaded, DocumentSplit):
                split = loaded
            else:
                split = split_documents(
                    loaded,
                    self.val_fraction,
                    self.split_seed,
                    self.val_documents,
                    self.test_fraction,
                    self.test_documents,
                )
            self._split, self._tokenizer_documents = self._training_subset(split)
        return self._split

    def _training_subset(self, split: DocumentSplit) -> tuple[DocumentSplit, list]:
        """The split with the training documents of ``train_subset``, and the documents the
        tokenizer learns from (never the fine-tuning text, so a base model and its fine-tuned
        versions share one vocabulary)."""
        if not self.finetune_documents:
            if self.train_subset != "all":
                raise ValueError(f"data.train_subset={self.train_subset!r} needs data.finetune_documents")
            return split, split.train
        names = set(self.finetune_documents)
        pool = [d.name for d in split.train]
        missing = sorted(names - set(pool))
        if missing:
            raise ValueError(
                f"data.finetune_documents: {missing} are not training documents (held out or absent); "
                f"the training documents are {pool}"
            )
        pretrain = [d for d in split.train if d.name not in names]
        finetune = [d for d in split.train if d.name in names]
        train = {"all": split.train, "pretrain": pretrain, "finetune": finetune}[self.train_subset]
        return DocumentSplit(train, split.validation, split.test), pretrain

    @property
    def text_tokenizer(self) -> TextTokenizer:
        """A tokenizer file as given, or the one trained on the (pre)training documents (cached)."""
        if self._tokenizer is None:
            if self.tokenizer_file:
                self._tokenizer = load_tokenizer_file(self.tokenizer_file, self.eos_token)
                self.tokenizer_path = Path(self.tokenizer_file)
            else:
                docs = self._tokenizer_documents if self.split is not None else []
                self._tokenizer, self.tokenizer_path = load_or_train_tokenizer(
                    self.tokenizer,
                    self.vocab_size,
                    [d.text for d in docs],
                    DocumentSplit(docs, []).fingerprint(("train",)),
                    self.cache_dir,
                )
        return self._tokenizer

    def prepared_folder(self) -> Path:
        """The prepared folder in the cache (written on first use: into a temporary folder renamed
        into place, so processes that race leave one whole folder)."""
        split, tok = self.split, self.text_tokenizer
        key = hashlib.sha256(f"{tokenizer_digest(tok)}|{split.fingerprint()}".encode()).hexdigest()[:16]
        folder = self.cache_dir / "prepared" / f"{self.corpus}-{key}"
        if (folder / MANIFEST).is_file():
            return folder
        tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_prepared(
            tmp,
            [(name, d) for name in ("train", "validation", "test") for d in getattr(split, name)],
            tok,
            "file" if self.tokenizer_file else self.tokenizer,
            dtype_for_vocab(int(tok.vocab_size)),
            {"format": self.corpus, "fingerprint": split.fingerprint()},
            {"rule": "in-memory", "subset": self.train_subset},
            DEFAULT_SHARD_TOKENS,
        )
        try:
            os.rename(tmp, folder)
        except OSError:  # another process put its (identical) folder there first
            shutil.rmtree(tmp, ignore_errors=True)
        return folder

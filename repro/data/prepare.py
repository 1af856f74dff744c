"""``repro data prepare``: a source -> train / validation / test token shards, a tokenizer and a
manifest (``repro.data.prepared``), written by the one writer (``repro.data.writing``).

The split is by whole documents and deterministic:
  - file sources (the plays, text files: every document's name is known up front) are split as
    the in-memory corpora are (``split_names``: a seeded shuffle of the name-sorted list), so the
    plays prepared here are the plays a config trains on;
  - row sources (jsonl, parquet, arrow, csv, save_to_disk, the hub) are streamed: a document is
    held out when a seeded hash of its name (its row position, or a name column) falls below
    ``val_fraction``, and a held-out one is a test document when a second hash falls below
    ``test_fraction``; or the source's own splits are taken as they are (``source_splits``).
A tokenizer trained here (``bpe`` or ``char``) learns from the first ``tokenizer_sample_bytes`` of
training text in source order; a tokenizer file (a model's own ``tokenizer.json``) is used as it is.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from repro.arguments import BelowOne, NonNegativeInt, PositiveInt, check_fields
from repro.files import read_json

from .prepared import MANIFEST, Manifest
from .shards import dtype_for_vocab
from .sources import Document, ResolvedSource, Source, iter_documents, resolve
from .tokenizer import TOKENIZER_KINDS, TextTokenizer, load_tokenizer_file, train_tokenizer
from .writing import STATE, write_prepared

DTYPES = ("auto", "uint16", "uint32")
TRAIN_SUBSETS = ("all", "pretrain", "finetune")


@dataclass(frozen=True)
class PrepareSettings:
    source: Source
    """what is read"""
    out: str
    """the output folder"""
    tokenizer: str = "bpe"
    """'bpe' or 'char' (trained here), or a tokenizer.json / tokenizer folder"""
    vocab_size: PositiveInt = 8192
    """BPE vocabulary size (a trained vocabulary may be smaller)"""
    tokenizer_sample_bytes: PositiveInt = 200_000_000
    """a trained tokenizer learns from this much training text"""
    eos_token: str | None = None
    """a tokenizer file's end-of-document token (default: found)"""
    val_fraction: BelowOne = 0.1
    """fraction of documents held out (validation + test)"""
    test_fraction: BelowOne = 0.5
    """fraction of the held-out documents that form the test split"""
    split_seed: NonNegativeInt = 0
    """seed of the split"""
    val_documents: tuple[str, ...] = ()
    """file sources: names of the documents held out instead"""
    test_documents: tuple[str, ...] = ()
    """file sources: names of the held-out documents that test"""
    finetune_documents: tuple[str, ...] = ()
    """file sources: training documents the tokenizer never learns from (the fine-tuning text)"""
    train_subset: Literal[TRAIN_SUBSETS] = "all"
    """the training shards: all, pretrain (all but finetune_documents) or finetune (those only)"""
    source_splits: dict[str, str] = field(default_factory=dict)
    """{train|validation|test: source split}"""
    max_documents: PositiveInt | None = None
    """read at most this many documents of the source (row sources)"""
    shard_tokens: PositiveInt = 100_000_000
    """a shard is closed at the first document boundary past this"""
    token_dtype: Literal[DTYPES] = "auto"
    """auto (by vocabulary size), uint16 or uint32"""
    workers: PositiveInt = 1
    """tokenizing processes"""
    progress: bool = True
    """a progress bar on stderr"""

    def __post_init__(self) -> None:
        check_fields(self, "repro data prepare: ", skip=("source",))  # each field's type and range
        bad = sorted(set(self.source_splits) - {"train", "validation", "test"})
        if bad or (self.source_splits and "train" not in self.source_splits):
            raise ValueError(
                f"--source_splits={self.source_splits}: map train (and validation, test) to the source's split names"
            )
        if self.train_subset != "all" and not self.finetune_documents:
            raise ValueError(f"data.train_subset={self.train_subset!r} needs data.finetune_documents")

    @property
    def trains_tokenizer(self) -> bool:
        return self.tokenizer in TOKENIZER_KINDS

    def split_record(self, resolved: ResolvedSource) -> dict[str, Any]:
        if self.source_splits:
            return {"rule": "source", "source_splits": dict(self.source_splits)}
        rule = "names" if resolved.names is not None else "hash"
        record = {"rule": rule, "val_fraction": self.val_fraction, "test_fraction": self.test_fraction}
        record.update(seed=self.split_seed, max_documents=self.max_documents)
        if rule == "names":
            record.update(val_documents=list(self.val_documents), test_documents=list(self.test_documents))
        if self.finetune_documents:
            record.update(finetune_documents=list(self.finetune_documents), train_subset=self.train_subset)
        return record


# ---------------------------------------------------------------------------- split items
def unit_hash(seed: int, salt: int, name: str) -> float:
    """A number in [0, 1) fixed by (seed, salt, name)."""
    digest = hashlib.sha256(f"{seed}|{salt}|{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def hashed_split(name: str, val_fraction: float, test_fraction: float, seed: int) -> str:
    if unit_hash(seed, 0, name) >= val_fraction:
        return "train"
    return "test" if unit_hash(seed, 1, name) < test_fraction else "validation"


def split_items(
    settings: PrepareSettings, resolved: ResolvedSource, subset: str | None = None
) -> Iterator[tuple[str, Document]]:
    """(split, document) in the order the shards hold them (``subset``: which training documents,
    default ``settings.train_subset``)."""
    if settings.finetune_documents and (settings.source_splits or resolved.names is None):
        raise ValueError("data.finetune_documents name files; a row source has no named training documents")
    if settings.source_splits:
        for split in ("train", "validation", "test"):
            if split in settings.source_splits:
                for doc in iter_documents(resolved, settings.source_splits[split]):
                    yield split, doc
        return
    if resolved.names is not None:  # file sources: split by name, then each split in name order
        if settings.max_documents is not None:
            raise ValueError("--max_documents applies to row sources; give fewer files instead")
        parts = split_names(
            list(resolved.names),
            settings.val_fraction,
            settings.split_seed,
            list(settings.val_documents) or None,
            settings.test_fraction,
            list(settings.test_documents) or None,
        )
        parts["train"] = training_subset(
            parts["train"], settings.finetune_documents, subset or settings.train_subset
        )
        files = dict(zip(resolved.names, resolved.files))
        for split in ("train", "validation", "test"):
            for name in parts[split]:
                single = ResolvedSource(resolved.source, resolved.format, (files[name],), "", (name,))
                yield split, next(iter_documents(single))
        return
    if settings.val_documents or settings.test_documents:
        raise ValueError(
            "--val_documents/--test_documents name files; a row source is split by --val_fraction"
        )
    for i, doc in enumerate(iter_documents(resolved)):
        if settings.max_documents is not None and i >= settings.max_documents:
            return
        yield hashed_split(doc.name, settings.val_fraction, settings.test_fraction, settings.split_seed), doc


def training_subset(train: list[str], finetune: tuple[str, ...], subset: str) -> list[str]:
    """The training documents of ``subset``: all, all but ``finetune`` (pretrain), or those only."""
    missing = sorted(set(finetune) - set(train))
    if missing:
        raise ValueError(
            f"data.finetune_documents: {missing} are not training documents (held out or absent); "
            f"the training documents are {train}"
        )
    if subset == "all":
        return train
    return [n for n in train if (n in finetune) == (subset == "finetune")]


# ---------------------------------------------------------------------------- split by name
def split_names(
    names: list[str],
    val_fraction: float = 0.1,
    seed: int = 0,
    val_documents: list[str] | None = None,
    test_fraction: float = 0.0,
    test_documents: list[str] | None = None,
) -> dict[str, list[str]]:
    """Hold out whole documents, deterministically, then carve the test split out of them (so the
    training documents do not depend on the test split). Returns {split: names in name order}.

    With ``val_documents`` those names are held out; otherwise ``ceil(val_fraction * n)``
    documents (at least one, at most n - 1) drawn by a ``random.Random(seed)`` shuffle of the
    name-sorted list. Of the held-out documents, ``test_documents`` (or ``round(test_fraction *
    held)`` of them, at least one and leaving one for validation, drawn with seed + 1) form the test
    split; the others validate.
    """
    if len(names) < 2:
        raise ValueError(f"the corpus has {len(names)} document(s): a document-level split needs at least 2")
    if len(set(names)) != len(names):
        raise ValueError(
            "document names are not unique; rename the files so that each document has its own name"
        )
    ordered = sorted(names)
    if val_documents:
        missing = sorted(set(val_documents) - set(names))
        if missing:
            raise ValueError(f"data.val_documents: {missing} are not in the corpus; documents are {ordered}")
        held = set(val_documents)
        if len(held) == len(names):
            raise ValueError("data.val_documents holds out every document; leave at least one for training")
    else:
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={val_fraction!r}: must be in (0, 1)")
        n_val = min(max(1, math.ceil(val_fraction * len(ordered) - 1e-9)), len(ordered) - 1)
        shuffled = list(ordered)
        random.Random(seed).shuffle(shuffled)
        held = set(shuffled[:n_val])
    test = _test_names(sorted(held), seed, test_fraction, test_documents)
    return {
        "train": [n for n in ordered if n not in held],
        "validation": [n for n in ordered if n in held and n not in test],
        "test": [n for n in ordered if n in test],
    }


def _test_names(held: list[str], seed: int, fraction: float, names: list[str] | None) -> set[str]:
    if names:
        outside = sorted(set(names) - set(held))
        if outside:
            raise ValueError(
                f"data.test_documents: {outside} are not held out from training; the held-out "
                f"documents are {held}"
            )
        if len(set(names)) == len(held):
            raise ValueError("data.test_documents takes every held-out document; leave one for validation")
        return set(names)
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"data.test_fraction={fraction!r}: must be in [0, 1)")
    if fraction == 0.0 or len(held) < 2:
        return set()
    n_test = min(max(1, round(fraction * len(held))), len(held) - 1)
    shuffled = list(held)
    random.Random(seed + 1).shuffle(shuffled)
    return set(shuffled[:n_test])


# ---------------------------------------------------------------------------- tokenizer
def tokenizer_kind(settings: PrepareSettings) -> str:
    if settings.tokenizer == "bpe":
        return f"bpe(vocab {settings.vocab_size}, sample {settings.tokenizer_sample_bytes} bytes)"
    if settings.tokenizer == "char":
        return f"char(sample {settings.tokenizer_sample_bytes} bytes)"
    return "file"


def choose_tokenizer(settings: PrepareSettings, resolved: ResolvedSource) -> TextTokenizer:
    """A tokenizer file as given; a trained one learnt from the first training documents (or the
    one an unfinished prepare of the same settings already trained)."""
    if not settings.trains_tokenizer:
        return load_tokenizer_file(settings.tokenizer, settings.eos_token)
    earlier = _earlier_tokenizer(settings, resolved)
    if earlier is not None:
        return earlier
    texts, size = [], 0
    for split, doc in split_items(settings, resolved, subset="pretrain"):  # never the fine-tuning text
        if split != "train":
            continue
        texts.append(doc.text)
        size += len(doc.text.encode())
        if size >= settings.tokenizer_sample_bytes:
            break
    if not texts:
        raise ValueError(
            f"source {resolved.source.location[0]!r}: no training document to learn a tokenizer from"
        )
    return train_tokenizer(settings.tokenizer, settings.vocab_size, texts)


def _earlier_tokenizer(settings: PrepareSettings, resolved: ResolvedSource) -> TextTokenizer | None:
    out = Path(settings.out)
    for name in (MANIFEST, STATE):
        path = out / name
        if not path.is_file():
            continue
        doc = read_json(path, "prepare record")
        record = doc.get("settings", doc)
        tok = record.get("tokenizer", {})
        same_source = record.get("source") == resolved.describe()
        same_split = _split_of(record) == settings.split_record(resolved)
        if same_source and same_split and tok.get("kind") == tokenizer_kind(settings):
            return load_tokenizer_file(out / tok["file"]) if (out / tok["file"]).is_file() else None
    return None


def _split_of(record: dict[str, Any]) -> dict[str, Any]:
    split = dict(record.get("split", {}))
    split.pop("shard_tokens", None)
    return split


# ---------------------------------------------------------------------------- prepare
def prepare(settings: PrepareSettings) -> Manifest:
    """Prepare the source into ``settings.out`` (resuming an unfinished prepare of the same settings)."""
    resolved = resolve(settings.source)
    tokenizer = choose_tokenizer(settings, resolved)
    natural = dtype_for_vocab(int(tokenizer.vocab_size))
    dtype = natural if settings.token_dtype == "auto" else np.dtype(settings.token_dtype)
    if dtype.itemsize < natural.itemsize:
        raise ValueError(
            f"--dtype={settings.token_dtype}: the tokenizer has {tokenizer.vocab_size:,} ids, more than uint16 "
            f"holds (65,536); use uint32 (or auto)"
        )
    return write_prepared(
        Path(settings.out),
        split_items(settings, resolved),
        tokenizer,
        tokenizer_kind(settings),
        dtype,
        resolved.describe(),
        settings.split_record(resolved),
        settings.shard_tokens,
        workers=settings.workers,
        progress=settings.progress,
        total_documents=count_documents(resolved, settings),
        label=f"prepare {Path(settings.out).name}",
    )


def count_documents(resolved: ResolvedSource, settings: PrepareSettings) -> int | None:
    """How many documents the source holds, where that is cheap to know (for the ETA)."""
    if resolved.names is not None:
        return len(resolved.names)
    count = None
    if resolved.format == "parquet" and not settings.source_splits:
        import pyarrow.parquet as pq

        count = sum(pq.ParquetFile(f).metadata.num_rows for f in resolved.files)
    if count is not None and settings.max_documents is not None:
        count = min(count, settings.max_documents)
    return count

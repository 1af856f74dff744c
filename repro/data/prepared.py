"""A prepared corpus: a folder of token shards per split, its tokenizer and a manifest.

    <dir>/manifest.json         what the folder holds (below); written last, atomically
    <dir>/tokenizer.json        the tokenizer the shards were made with (tokenizer-char.json for char)
    <dir>/<split>_<i>.bin       llm.c token shards (``repro.data.shards``): train, validation, test

The manifest holds the source's description and fingerprint, the tokenizer's hash, vocabulary
size and end-of-document id, the token dtype, the split rule, and per split the documents,
tokens and shards (name, tokens, sha256). ``ShardWriter`` writes a split's shards (whole
documents each, closed when they reach ``shard_tokens``); ``PreparedCorpus`` opens a folder
and checks it (headers and sizes always, checksums on request) before any block is read.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from repro.files import read_json, write_json_atomic

from .shards import HEADER_BYTES, ShardError, dtype_for_vocab, open_shard, read_header, shard_header
from .tokenizer import TextTokenizer, load_tokenizer_file, tokenizer_digest

MANIFEST = "manifest.json"
FORMAT = "repro-prepared-1"
SPLITS = ("train", "validation", "test")
DEFAULT_SHARD_TOKENS = 100_000_000  # about llm.c's shard size
VERIFY_MODES = ("auto", "full", "header")
AUTO_VERIFY_BYTES = 1 << 30  # verify='auto' checks checksums of folders up to 1 GiB


@dataclass(frozen=True)
class ShardRecord:
    name: str  # file name inside the folder
    tokens: int  # tokens in the shard
    sha256: str  # checksum of the whole file


@dataclass
class SplitRecord:
    documents: int = 0  # documents of the split
    tokens: int = 0  # tokens of the split, separators included
    shards: list[ShardRecord] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # held-out splits: their documents' names, in order


@dataclass
class Manifest:
    source: dict[str, Any]  # what was read: kind, description, fingerprint
    tokenizer: dict[str, Any]  # file, sha256, vocab_size, eos_id, kind
    dtype: str  # uint16 | uint32
    split: dict[str, Any]  # the split rule and its settings
    splits: dict[str, SplitRecord]  # train / validation / test
    format: str = FORMAT
    created: str = ""  # UTC time the prepare finished

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str) -> Manifest:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ShardError(f"{where}: not a prepared-corpus manifest (format {FORMAT!r} expected)")
        try:
            splits = {
                name: SplitRecord(
                    int(rec["documents"]),
                    int(rec["tokens"]),
                    [ShardRecord(**s) for s in rec["shards"]],
                    list(rec.get("names", [])),
                )
                for name, rec in doc["splits"].items()
            }
            return cls(
                doc["source"],
                doc["tokenizer"],
                doc["dtype"],
                doc["split"],
                splits,
                doc["format"],
                doc["created"],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardError(
                f"{where}: the manifest is incomplete ({exc!r}); prepare the corpus again"
            ) from None


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def tokenizer_file_name(tokenizer: TextTokenizer) -> str:
    return "tokenizer-char.json" if tokenizer.to_bytes().startswith(b'{"kind": "char"') else "tokenizer.json"


def tokenizer_record(tokenizer: TextTokenizer, kind: str) -> dict[str, Any]:
    return {
        "file": tokenizer_file_name(tokenizer),
        "kind": kind,
        "sha256": tokenizer_digest(tokenizer),
        "vocab_size": int(tokenizer.vocab_size),
        "eos_id": int(tokenizer.eos_id),
    }


class ShardWriter:
    """Writes one split's documents into shards of whole documents, in order, with bounded memory.

    ``add`` appends a document's tokens (its separator included) to the open shard's temporary file;
    once it holds ``shard_tokens`` or more, the header is written, the file synced and renamed into
    place (a reader sees no shard or a whole one) and its record returned."""

    def __init__(
        self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int, record: SplitRecord | None = None
    ) -> None:
        if not isinstance(shard_tokens, int) or shard_tokens <= 0:
            raise ValueError(f"shard_tokens={shard_tokens!r}: must be a positive integer")
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, np.dtype(dtype), shard_tokens
        self.record = record or SplitRecord()
        self._file = None
        self._tokens = 0
        self._docs = 0

    def _tmp(self) -> Path:
        return self.folder / f".{shard_name(self.split, len(self.record.shards))}.tmp"

    def add(self, tokens: np.ndarray) -> ShardRecord | None:
        if self._file is None:
            self._file = open(self._tmp(), "wb")  # noqa: SIM115 (open until the shard closes)
            self._file.write(b"\0" * HEADER_BYTES)  # the header is written when the shard closes
        if len(tokens) and int(tokens.max()) > np.iinfo(self.dtype).max:
            raise ValueError(f"token id {int(tokens.max())} does not fit a {self.dtype} shard")
        self._file.write(np.asarray(tokens).astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self._tokens += len(tokens)
        self._docs += 1
        if self._tokens >= self.shard_tokens:
            return self.flush()
        return None

    def flush(self) -> ShardRecord | None:
        """Close the open shard (nothing when none is open)."""
        if self._file is None:
            return None
        f, tmp = self._file, self._tmp()
        f.seek(0)
        f.write(shard_header(self._tokens, self.dtype))
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self._file = None
        name = shard_name(self.split, len(self.record.shards))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, self.folder / name)
        shard = ShardRecord(name, self._tokens, file_sha256(self.folder / name))
        self.record.shards.append(shard)
        self.record.tokens += shard.tokens
        self.record.documents += self._docs
        self._tokens, self._docs = 0, 0
        return shard

    def abandon(self) -> None:
        """Drop the open shard's temporary file (an interrupted prepare)."""
        if self._file is not None:
            self._file.close()
            self._tmp().unlink(missing_ok=True)
            self._file = None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class PreparedCorpus:
    """A prepared folder, checked: every shard the manifest names exists with the header, dtype and
    token count it records; with ``verify='full'`` (or 'auto' on folders up to 1 GiB) also its
    checksum. ``tokenizer``, when given, must be the one the shards were made with."""

    def __init__(
        self,
        folder: str | os.PathLike,
        verify: Literal["auto", "full", "header"] = "auto",
        tokenizer: TextTokenizer | None = None,
        what: str = "data.prepared_dir",
    ) -> None:
        self.folder = Path(folder)
        where = f"{what}={str(self.folder)!r}"
        if verify not in VERIFY_MODES:
            raise ValueError(f"data.verify={verify!r}: allowed values are {VERIFY_MODES}")
        if not self.folder.is_dir():
            raise FileNotFoundError(
                f"{where}: no such folder; make it with `repro data prepare SOURCE --out DIR`"
            )
        path = self.folder / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(
                f"{where}: no {MANIFEST} (an unfinished or interrupted prepare?); run `repro data prepare` "
                f"again with the same arguments to finish it"
            )
        try:
            self.manifest = Manifest.from_dict(read_json(path, "manifest"), str(path))
        except ValueError as exc:
            raise ShardError(str(exc)) from None
        self.dtype = np.dtype(self.manifest.dtype)
        vocab = int(self.manifest.tokenizer["vocab_size"])
        if dtype_for_vocab(vocab).itemsize > self.dtype.itemsize:
            raise ShardError(
                f"{path}: the vocabulary has {vocab:,} ids but the shards are {self.dtype} (ids up to "
                f"{np.iinfo(self.dtype).max:,}); prepare the corpus again"
            )
        self.where = where
        if tokenizer is not None:
            self.check_tokenizer(tokenizer)
        total = sum(s.tokens for r in self.manifest.splits.values() for s in r.shards) * self.dtype.itemsize
        full = verify == "full" or (verify == "auto" and total <= AUTO_VERIFY_BYTES)
        for record in self.manifest.splits.values():
            for shard in record.shards:
                self._check_shard(shard, full)

    def check_tokenizer(self, tokenizer: TextTokenizer) -> None:
        """The shards must have been made with this tokenizer."""
        if tokenizer_digest(tokenizer) != self.manifest.tokenizer["sha256"]:
            raise ShardError(
                f"{self.where}: its shards were made with another tokenizer (manifest sha256 "
                f"{self.manifest.tokenizer['sha256'][:12]}, given {tokenizer_digest(tokenizer)[:12]}); "
                f"prepare the corpus with this tokenizer"
            )

    def _check_shard(self, shard: ShardRecord, full: bool) -> None:
        path = self.folder / shard.name
        header = read_header(path)  # a missing, truncated or mislabelled file: one line naming it
        if header.dtype != self.dtype or header.num_tokens != shard.tokens:
            raise ShardError(
                f"shard {str(path)!r}: {header.num_tokens:,} {header.dtype} tokens, but the manifest expects "
                f"{shard.tokens:,} {self.dtype} tokens; prepare the corpus again"
            )
        if full and file_sha256(path) != shard.sha256:
            raise ShardError(
                f"shard {str(path)!r}: its sha256 differs from the manifest's ({shard.sha256[:12]}...); the file "
                f"is corrupt: prepare the corpus again"
            )

    @property
    def vocab_size(self) -> int:
        return int(self.manifest.tokenizer["vocab_size"])

    def tokens(self, split: str) -> int:
        record = self.manifest.splits.get(split)
        return record.tokens if record else 0

    def shards(self, split: str) -> list[np.ndarray]:
        """The split's shards, memory-mapped, in order."""
        record = self.manifest.splits.get(split)
        return [open_shard(self.folder / s.name) for s in (record.shards if record else [])]

    @property
    def eos_id(self) -> int:
        """The end-of-document id the documents were prepared with."""
        return int(self.manifest.tokenizer["eos_id"])

    def tokenizer(self, file: str | os.PathLike | None = None, eos_token: str | None = None) -> TextTokenizer:
        """The tokenizer the shards were made with, with its end-of-document id as recorded: the
        folder's own copy, or ``file`` (checked to be the same tokenizer)."""
        tok = load_tokenizer_file(
            file or self.folder / self.manifest.tokenizer["file"], eos_token, self.eos_id
        )
        if file is not None:
            self.check_tokenizer(tok)
        return tok


def write_manifest(folder: Path, manifest: Manifest) -> None:
    write_json_atomic(folder / MANIFEST, manifest.to_dict())

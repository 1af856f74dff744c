"""Tokenizers: trained locally on training documents (cached on disk), or a model's own.

- ``bpe``: byte-level BPE (Hugging Face ``tokenizers``) trained here, ``vocab_size`` an option;
- ``char``: one id per character seen in training, plus ``<unk>`` and ``<eos>``;
- a tokenizer file: any ``tokenizer.json`` (or an HF tokenizer directory holding one, e.g. a
  pretrained model's folder), with its end-of-document token read from ``tokenizer_config.json``
  or found among the usual names.
Documents are encoded without the tokenizer's own special tokens (no BOS); an end-of-document id
goes between documents when streams are packed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import ByteLevelBPETokenizer, Tokenizer

from repro.files import write_atomic

TOKENIZER_KINDS = ("bpe", "char")
EOS = "<|endoftext|>"
UNK = "<|unk|>"
# end-of-document tokens of common model families, tried in order when no tokenizer_config.json names one
EOS_CANDIDATES = (EOS, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "<|im_end|>")


class TextTokenizer(Protocol):
    vocab_size: int
    eos_id: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...

    def to_bytes(self) -> bytes: ...


class FileTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer``: one trained here (byte-level BPE) or a model's own."""

    def __init__(self, tokenizer: Tokenizer, eos_id: int) -> None:
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_id = eos_id

    @classmethod
    def train_bpe(cls, texts: list[str], vocab_size: int) -> FileTokenizer:
        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator(
            texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False
        )
        return cls(tok._tokenizer, tok._tokenizer.token_to_id(EOS))

    def save(self, path: Path) -> None:
        write_atomic(path, self.to_bytes())

    def to_bytes(self) -> bytes:
        return self._tok.to_str().encode()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


BPETokenizer = FileTokenizer  # the byte-level BPE trained here is a tokenizer file like any other


class CharTokenizer:
    def __init__(self, chars: list[str]) -> None:
        self.itos = [UNK, EOS, *chars]
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self.unk_id, self.eos_id = 0, 1
        self.vocab_size = len(self.itos)
        self._ords = np.array([ord(c) for c in chars], dtype=np.int64)
        self._order = np.argsort(self._ords)

    @classmethod
    def train(cls, texts: list[str]) -> CharTokenizer:
        return cls(sorted(set().union(*map(set, texts))))

    def save(self, path: Path) -> None:
        write_atomic(path, self.to_bytes())

    def to_bytes(self) -> bytes:
        return json.dumps({"kind": "char", "chars": self.itos[2:]}).encode()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode_array(t).tolist() for t in texts]

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of ``text`` as int64 (vectorized: code points looked up in the sorted alphabet)."""
        points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
        if not len(self._ords):
            return np.zeros(len(points), dtype=np.int64)
        sorted_ords = self._ords[self._order]
        at = np.clip(np.searchsorted(sorted_ords, points), 0, len(sorted_ords) - 1)
        found = sorted_ords[at] == points
        return np.where(found, self._order[at] + 2, self.unk_id)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] if i > 1 else "" for i in ids)


def tokenizer_digest(tokenizer: TextTokenizer) -> str:
    """sha256 of the tokenizer's serialised form (what a manifest records to tell tokenizers apart)."""
    return hashlib.sha256(tokenizer.to_bytes()).hexdigest()


def encode_documents(tokenizer: TextTokenizer, texts: list[str], dtype: np.dtype) -> list[np.ndarray]:
    """Each text's ids followed by the end-of-document id, as arrays of ``dtype``."""
    if isinstance(tokenizer, CharTokenizer):
        ids = [tokenizer.encode_array(t) for t in texts]
    else:
        ids = [np.asarray(x, dtype=np.int64) for x in tokenizer.encode_batch(texts)]
    eos = np.array([tokenizer.eos_id], dtype=np.int64)
    return [np.concatenate([x, eos]).astype(dtype) for x in ids]


# ---------------------------------------------------------------------------- files
def _eos_of(tokenizer: Tokenizer, folder: Path | None, eos_token: str | None, where: str) -> int:
    names: list[str] = [eos_token] if eos_token else []
    config = folder / "tokenizer_config.json" if folder is not None else None
    if not eos_token and config is not None and config.is_file():
        try:
            value = json.loads(config.read_text()).get("eos_token")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            value = None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            names.append(value)
    if not eos_token:
        names += list(EOS_CANDIDATES)
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return int(token_id)
    if eos_token:
        raise ValueError(f"{where}: eos_token={eos_token!r} is not in the tokenizer's vocabulary")
    raise ValueError(
        f"{where}: no end-of-document token found (tried tokenizer_config.json's eos_token and "
        f"{', '.join(EOS_CANDIDATES)}); name it with eos_token"
    )


def load_tokenizer_file(
    path: str | os.PathLike, eos_token: str | None = None, eos_id: int | None = None
) -> TextTokenizer:
    """A tokenizer from a file: ``tokenizer.json`` (or a directory holding one, e.g. a pretrained
    model's folder), or the suite's own char tokenizer file. Its end-of-document id is ``eos_id``
    when given (a prepared corpus's, as its manifest records it; ``eos_token``, if also given, must
    be that id), else ``eos_token``'s, else found (the folder's tokenizer_config.json, common names)."""
    path = Path(path)
    where = f"tokenizer {str(path)!r}"
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        what = "has no tokenizer.json" if path.is_dir() else "no such file"
        raise FileNotFoundError(f"{where}: {what}; give a tokenizer.json or a folder holding one")
    tok = tokenizer_from_text(
        file.read_text(encoding="utf-8", errors="replace"), where, file.parent, eos_token, eos_id
    )
    if eos_id is not None and eos_token and isinstance(tok, FileTokenizer):
        named = tok._tok.token_to_id(eos_token)
        if named != eos_id:
            raise ValueError(
                f"{where}: eos_token={eos_token!r} is id {named}, but the documents were prepared with "
                f"end-of-document id {eos_id}; leave eos_token unset (the manifest's id is used) or prepare again"
            )
    return tok


def tokenizer_from_text(
    text: str, where: str, folder: Path | None = None, eos_token: str | None = None, eos_id: int | None = None
) -> TextTokenizer:
    """A tokenizer from its serialised form (``to_bytes``), e.g. in a worker process."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not a tokenizer file (not JSON: {exc})") from None
    if isinstance(doc, dict) and doc.get("kind") == "char":
        return CharTokenizer(list(doc.get("chars", [])))
    try:
        tok = Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises its own exception type
        raise ValueError(f"{where}: not a tokenizers file ({str(exc).splitlines()[0]})") from None
    if eos_id is None:
        eos_id = _eos_of(tok, folder, eos_token, where)
    return FileTokenizer(tok, eos_id)


def check_bpe_vocab_size(vocab_size: int) -> None:
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 257:
        raise ValueError(
            f"data.vocab_size={vocab_size!r}: byte-level BPE needs at least 257 (256 bytes + <eos>)"
        )


def train_tokenizer(kind: str, vocab_size: int, texts: list[str]) -> TextTokenizer:
    """A new tokenizer of ``kind`` ('bpe' or 'char') learnt from ``texts``."""
    if kind == "bpe":
        check_bpe_vocab_size(vocab_size)
        return FileTokenizer.train_bpe(texts, vocab_size)
    if kind == "char":
        return CharTokenizer.train(texts)
    raise ValueError(f"tokenizer={kind!r}: allowed values are {TOKENIZER_KINDS} or a tokenizer file")

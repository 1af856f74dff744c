"""Tokenizers trained locally on the training documents and cached on disk.

- ``bpe``: byte-level BPE (Hugging Face ``tokenizers``), ``vocab_size`` an option;
- ``char``: one id per character seen in training, plus ``<unk>`` and ``<eos>``.
Both put an end-of-document id between documents when streams are packed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from tokenizers import ByteLevelBPETokenizer, Tokenizer

from repro.files import write_atomic

TOKENIZER_KINDS = ("bpe", "char")
EOS = "<|endoftext|>"
UNK = "<|unk|>"


class TextTokenizer(Protocol):
    vocab_size: int
    eos_id: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...


class BPETokenizer:
    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.eos_id = tokenizer.token_to_id(EOS)

    @classmethod
    def train(cls, texts: list[str], vocab_size: int) -> BPETokenizer:
        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator(
            texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False
        )
        return cls(tok._tokenizer)

    @classmethod
    def load(cls, path: Path) -> BPETokenizer:
        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: Path) -> None:
        write_atomic(path, self._tok.to_str().encode())

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


class CharTokenizer:
    def __init__(self, chars: list[str]) -> None:
        self.itos = [UNK, EOS, *chars]
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self.unk_id, self.eos_id = 0, 1
        self.vocab_size = len(self.itos)

    @classmethod
    def train(cls, texts: list[str]) -> CharTokenizer:
        return cls(sorted(set().union(*map(set, texts))))

    @classmethod
    def load(cls, path: Path) -> CharTokenizer:
        return cls(json.loads(path.read_text())["chars"])

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps({"kind": "char", "chars": self.itos[2:]}).encode())

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        get = self.stoi.get
        return [[get(c, self.unk_id) for c in t] for t in texts]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] if i > 1 else "" for i in ids)


def load_or_train_tokenizer(
    kind: str, vocab_size: int, train_texts: list[str], corpus_fingerprint: str, cache_dir: Path
) -> tuple[TextTokenizer, Path]:
    """The tokenizer for these training texts, from ``cache_dir`` when it was trained before."""
    if kind == "bpe":
        if not isinstance(vocab_size, int) or vocab_size < 257:
            raise ValueError(
                f"data.vocab_size={vocab_size!r}: byte-level BPE needs at least 257 (256 bytes + <eos>)"
            )
        path = cache_dir / "tokenizers" / f"bpe-{vocab_size}-{corpus_fingerprint}.json"
        if path.exists():
            return BPETokenizer.load(path), path
        tok = BPETokenizer.train(train_texts, vocab_size)
    elif kind == "char":
        path = cache_dir / "tokenizers" / f"char-{corpus_fingerprint}.json"
        if path.exists():
            return CharTokenizer.load(path), path
        tok = CharTokenizer.train(train_texts)
    else:
        raise ValueError(f"data.tokenizer={kind!r}: allowed values are {TOKENIZER_KINDS}")
    tok.save(path)
    return tok, path

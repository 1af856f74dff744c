"""Flat token shards in llm.c's layout (``dev/data/data_common.py``), so shards made by llm.c or
modded-nanogpt (the public FineWeb GPT-2 shards) read here, and shards made here read there.

A shard is a header of 256 little-endian int32 followed by the tokens:

    header[0]  magic: 20240520 (tokens are uint16, llm.c's "gpt-2" kind) or 20240801 (uint32, "llama-3")
    header[1]  version: 1 with uint16, 7 with uint32
    header[2]  number of tokens after the header (below 2**31)
    header[3:] zero

Reading memory-maps the tokens (nothing is read until a block is used). Every problem is one
line naming the file and what was expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# (magic, version) of each token dtype, as llm.c writes them
KINDS = {np.dtype(np.uint16): (20240520, 1), np.dtype(np.uint32): (20240801, 7)}


class ShardError(ValueError):
    """A shard that cannot be used (the message names the file and what was expected)."""


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocabularies up to 65,536), else uint32."""
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ValueError(f"vocab_size={vocab_size!r}: must be a positive integer")
    if vocab_size > 2**32:
        raise ValueError(f"vocab_size={vocab_size}: larger than a uint32 shard can hold")
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def shard_header(num_tokens: int, dtype: np.dtype) -> bytes:
    """The 256 x int32 header of a shard of ``num_tokens`` tokens of ``dtype``."""
    magic, version = KINDS[np.dtype(dtype)]
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (magic, version, num_tokens)
    return header.tobytes()


@dataclass(frozen=True)
class ShardHeader:
    path: str
    dtype: np.dtype  # uint16 or uint32
    num_tokens: int


def read_header(path: str | os.PathLike) -> ShardHeader:
    """The shard's header, checked against the file's size."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"shard {str(path)!r}: no such file")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(
            f"shard {str(path)!r}: {size} bytes, shorter than the {HEADER_BYTES}-byte header; "
            f"the file is truncated or not a token shard"
        )
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
    kind = {v: k for k, v in KINDS.items()}.get((int(header[0]), int(header[1])))
    if kind is None:
        raise ShardError(
            f"shard {str(path)!r}: header starts {int(header[0])}, {int(header[1])}; expected magic 20240520 "
            f"version 1 (uint16) or 20240801 version 7 (uint32), llm.c's token shard layout"
        )
    count = int(header[2])
    expected = HEADER_BYTES + count * kind.itemsize
    if count < 0 or size != expected:
        raise ShardError(
            f"shard {str(path)!r}: the header says {count:,} {kind} tokens ({expected:,} bytes) but the file has "
            f"{size:,} bytes; it is truncated or corrupt: prepare it again"
        )
    return ShardHeader(str(path), kind, count)


def open_shard(path: str | os.PathLike) -> np.ndarray:
    """The shard's tokens, memory-mapped read-only (little-endian uint16 or uint32)."""
    header = read_header(path)
    if header.num_tokens == 0:
        return np.zeros(0, dtype=header.dtype)
    return np.memmap(
        path, dtype=header.dtype.newbyteorder("<"), mode="r", offset=HEADER_BYTES, shape=(header.num_tokens,)
    )

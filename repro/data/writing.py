"""The one writer of prepared corpora: a stream of (split, document) items -> token shards and a
manifest, with every core tokenizing, a progress bar, atomic shards, and a resume that does not
redo finished shards.

Items are tokenized in chunks by a pool of worker processes (``workers`` > 1; each encodes on one
thread) or in this process, and written in stream order, so the shards do not depend on the
number of workers. Progress is kept in ``<dir>/.prepare-state.json`` after every shard: each shard
records the stream position after its last document. A rerun with the same settings restarts the
stream at the earliest position a split has not finished and skips, for each split, the items its
written shards already hold; the shards it then writes are those an uninterrupted run writes.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from repro.files import read_json, write_atomic, write_json_atomic

from .prepared import (
    MANIFEST,
    Manifest,
    ShardRecord,
    ShardWriter,
    SplitRecord,
    tokenizer_record,
    write_manifest,
)
from .sources import Document
from .tokenizer import TextTokenizer, encode_documents, tokenizer_from_text

STATE = ".prepare-state.json"
CHUNK_DOCUMENTS = 256  # documents per task sent to a worker
CHUNK_BYTES = 1 << 20  # ... or fewer, when they reach this many bytes of text


class PrepareConflict(ValueError):
    """The output folder holds another prepare (other source or settings)."""


# ---------------------------------------------------------------------------- workers
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_text: str, eos_id: int, dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the pool is the parallelism
    _WORKER["tok"] = tokenizer_from_text(tokenizer_text, "worker tokenizer", eos_id=eos_id)
    _WORKER["dtype"] = np.dtype(dtype)


def _encode_chunk(texts: list[str]) -> list[np.ndarray]:
    return encode_documents(_WORKER["tok"], texts, _WORKER["dtype"])


def _chunks(items: Iterator[tuple[int, str, Document]]) -> Iterator[list[tuple[int, str, Document]]]:
    while True:
        chunk, size = [], 0
        for item in items:
            chunk.append(item)
            size += len(item[2].text)
            if len(chunk) >= CHUNK_DOCUMENTS or size >= CHUNK_BYTES:
                break
        if not chunk:
            return
        yield chunk


def _encoded(
    chunks: Iterator[list[tuple[int, str, Document]]], tokenizer: TextTokenizer, dtype: np.dtype, workers: int
) -> Iterator[tuple[list[tuple[int, str, Document]], list[np.ndarray]]]:
    if workers <= 1:
        for chunk in chunks:
            yield chunk, encode_documents(tokenizer, [d.text for _, _, d in chunk], dtype)
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no warning when the pool forks
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    context = multiprocessing.get_context(method)
    window: deque = deque()  # (chunk, pending result): at most 2 per worker, so memory stays bounded
    with context.Pool(
        workers, _init_worker, (tokenizer.to_bytes().decode(), tokenizer.eos_id, dtype.str)
    ) as pool:
        for chunk in chunks:
            window.append((chunk, pool.apply_async(_encode_chunk, ([d.text for _, _, d in chunk],))))
            if len(window) >= 2 * workers:
                done, result = window.popleft()
                yield done, result.get()
        while window:
            done, result = window.popleft()
            yield done, result.get()


# ---------------------------------------------------------------------------- progress
class _Bar:
    """A progress bar on stderr: documents (of the total, when known), tokens/s and an ETA."""

    def __init__(self, total: int | None, enabled: bool, label: str) -> None:
        self.tokens, self.start = 0, time.perf_counter()
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="doc", desc=label, dynamic_ncols=True, file=sys.stderr)

    def update(self, documents: int, tokens: int) -> None:
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(documents)
            rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
            self.bar.set_postfix_str(
                f"{self.tokens / 1e6:,.1f} M tokens, {rate / 1e6:.2f} M tok/s", refresh=False
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------- the writer
def write_prepared(
    folder: Path,
    items: Iterable[tuple[str, Document]],
    tokenizer: TextTokenizer,
    tokenizer_kind: str,
    dtype: np.dtype,
    source: dict[str, Any],
    split: dict[str, Any],
    shard_tokens: int,
    workers: int = 1,
    progress: bool = False,
    total_documents: int | None = None,
    label: str = "prepare",
) -> Manifest:
    """Tokenize ``items`` (split name, document) into ``folder``'s shards and write its manifest.
    A folder with a finished manifest of the same settings is returned as it is; one with the
    progress of the same settings is resumed; one of other settings is refused."""
    folder.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype(dtype)
    settings = {
        "source": source,
        "split": split,
        "tokenizer": tokenizer_record(tokenizer, tokenizer_kind),
        "dtype": dtype.name,
        "shard_tokens": shard_tokens,
    }
    done = _finished(folder, settings)
    if done is not None:
        return done
    state = _resume_state(folder, settings)
    records = {name: _record(rec) for name, rec in state["splits"].items()}
    # the held-out documents' names as (item, name): those of finished shards survive a resume
    held = {name: [tuple(x) for x in rec.get("held_out", [])] for name, rec in state["splits"].items()}
    ends = {name: int(rec.get("next_item", 0)) for name, rec in state["splits"].items()}
    start = min(ends.values(), default=0)  # the earliest item a split still needs
    for stale in folder.glob(".*.tmp"):  # a shard a killed prepare left half written
        stale.unlink()
    write_atomic(folder / settings["tokenizer"]["file"], tokenizer.to_bytes())
    writers: dict[str, ShardWriter] = {}

    def writer(name: str) -> ShardWriter:
        if name not in writers:
            writers[name] = ShardWriter(folder, name, dtype, shard_tokens, records.get(name))
        return writers[name]

    def save_state() -> None:
        doc = {"settings": settings, "splits": {}}
        for name, w in writers.items():
            doc["splits"][name] = {**asdict(w.record), "next_item": ends.get(name, 0)}
        for name, rec in records.items():
            doc["splits"].setdefault(name, {**asdict(rec), "next_item": ends.get(name, 0)})
        for name, rec in doc["splits"].items():
            rec["held_out"] = [list(x) for x in held.get(name, []) if x[0] < ends.get(name, 0)]
        write_json_atomic(folder / STATE, doc)

    numbered = ((i, name, doc) for i, (name, doc) in enumerate(items))
    todo = (
        (i, name, doc)
        for i, name, doc in islice(numbered, start, None)
        if i >= ends.get(name, 0)  # what a split's written shards hold is skipped
    )
    bar = _Bar(total_documents - start if total_documents else None, progress, label)
    try:
        for chunk, encoded in _encoded(_chunks(todo), tokenizer, dtype, workers):
            for (i, name, document), ids in zip(chunk, encoded):
                if name != "train":
                    held.setdefault(name, []).append((i, document.name))
                if writer(name).add(ids) is not None:
                    ends[name] = i + 1  # the shard holds every item of its split before i + 1
                    save_state()
            bar.update(len(chunk), sum(len(x) for x in encoded))
    except BaseException:
        for w in writers.values():
            w.abandon()
        raise
    finally:
        bar.close()
    for w in writers.values():
        w.flush()
    splits = {name: w.record for name, w in writers.items()}
    for name, rec in records.items():
        splits.setdefault(name, rec)
    for name, rec in splits.items():
        rec.names = [n for _, n in sorted(held.get(name, []))] if name != "train" else []
    manifest = Manifest(
        source=source,
        tokenizer=settings["tokenizer"],
        dtype=dtype.name,
        split={**split, "shard_tokens": shard_tokens},
        splits=splits,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    write_manifest(folder, manifest)
    (folder / STATE).unlink(missing_ok=True)
    return manifest


def _record(doc: dict[str, Any]) -> SplitRecord:
    return SplitRecord(int(doc["documents"]), int(doc["tokens"]), [ShardRecord(**s) for s in doc["shards"]])


def _finished(folder: Path, settings: dict[str, Any]) -> Manifest | None:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    manifest = Manifest.from_dict(read_json(path, "manifest"), str(path))
    same = (
        manifest.source == settings["source"]
        and manifest.tokenizer == settings["tokenizer"]
        and manifest.dtype == settings["dtype"]
        and manifest.split == {**settings["split"], "shard_tokens": settings["shard_tokens"]}
    )
    if not same:
        raise PrepareConflict(
            f"{str(folder)!r} already holds a prepared corpus of another source, tokenizer or split; choose "
            f"another --out (or delete the folder)"
        )
    return manifest


def _resume_state(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    path = folder / STATE
    if not path.is_file():
        if any(folder.glob("*.bin")):
            raise PrepareConflict(
                f"{str(folder)!r} holds shards but no manifest or progress file; choose another --out (or delete "
                f"the folder)"
            )
        return {"settings": settings, "splits": {}}
    state = read_json(path, "prepare progress")
    if state.get("settings") != settings:
        raise PrepareConflict(
            f"{str(folder)!r} holds an unfinished prepare of another source, tokenizer or split; rerun that "
            f"prepare to finish it, or choose another --out"
        )
    for rec in state["splits"].values():  # drop shards written after the last recorded state
        rec["shards"] = [s for s in rec["shards"] if (folder / s["name"]).is_file()]
    return state

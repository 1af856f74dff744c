"""A small corpus (the plays, a few text files, a save_to_disk folder) as the datamodule reads it:
prepared by ``repro data prepare``'s own path (``repro.data.prepare``) into the cache, in a folder
keyed by what it is prepared from, so it is read like any prepared corpus. The folder is written
once, into a temporary folder renamed into place (processes that race leave one whole folder)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .prepare import PrepareSettings, prepare, tokenizer_kind
from .prepared import MANIFEST
from .sources import ROW_EXTENSIONS, Source, expand_files, read_text_document, resolve
from .tokenizer import load_tokenizer_file, tokenizer_digest

SMALL_CORPORA = ("shakespeare", "text_files", "hf_dataset")
ROW_FILE_SUFFIXES = tuple(x for suffixes in ROW_EXTENSIONS.values() for x in suffixes)


def small_corpus_folder(data: Mapping[str, Any]) -> Path:
    """The prepared folder of the small corpus that the datamodule fields ``data`` describe (written
    on first use)."""
    settings = prepare_settings(data)
    resolved = resolve(settings.source)
    tokenizer = (
        tokenizer_digest(load_tokenizer_file(settings.tokenizer, settings.eos_token))
        if not settings.trains_tokenizer
        else tokenizer_kind(settings)
    )
    identity = {
        "source": resolved.describe(),
        "split": settings.split_record(resolved),
        "tokenizer": tokenizer,
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(data["cache_dir"]) / "prepared" / f"{data['corpus']}-{key}"
    if (folder / MANIFEST).is_file():
        return folder
    if data["corpus"] == "text_files":
        for f in resolved.files:  # an empty or non-UTF-8 file is named as the datamodule's field
            read_text_document(f, "data.text_files")
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    prepare(dataclasses.replace(settings, out=str(tmp)))
    try:
        os.rename(tmp, folder)
    except OSError:  # another process put its (identical) folder there first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def prepare_settings(data: Mapping[str, Any]) -> PrepareSettings:
    """``repro data prepare``'s settings for the datamodule fields ``data`` (its small corpus)."""
    corpus, extra = data["corpus"], {}
    try:
        return _settings(data, corpus, extra)
    except ValueError as exc:  # a field's check: named as the datamodule's field
        raise ValueError(str(exc).replace("repro data prepare: ", "data.")) from None


def _settings(data: Mapping[str, Any], corpus: str, extra: dict[str, Any]) -> PrepareSettings:
    if corpus == "shakespeare":
        source = Source(("shakespeare",), "shakespeare", strip_markdown=data["strip_markdown"])
    elif corpus == "text_files":
        source = Source(tuple(str(f) for f in expand_text_files(data["text_files"])), "text")
    elif corpus == "hf_dataset":
        source, extra = _hf_directory(data["hf_dataset_dir"], data["text_field"])
    else:
        raise ValueError(f"data.corpus={corpus!r}: allowed values are {SMALL_CORPORA}")
    return PrepareSettings(
        source,
        out="",
        tokenizer=data["tokenizer_file"] or data["tokenizer"],
        vocab_size=data["vocab_size"],
        eos_token=data["eos_token"],
        val_fraction=data["val_fraction"],
        test_fraction=data["test_fraction"],
        split_seed=data["split_seed"],
        val_documents=tuple(data["val_documents"] or ()),
        test_documents=tuple(data["test_documents"] or ()),
        finetune_documents=tuple(data["finetune_documents"] or ()),
        train_subset=data["train_subset"],
        progress=False,
        **extra,
    )


def expand_text_files(patterns: list[str] | None) -> list[Path]:
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


def _hf_directory(path: str | None, text_field: str) -> tuple[Source, dict[str, Any]]:
    """A save_to_disk folder as a source: its own train and validation splits when it has them,
    else its one split (split by a hash of each row's name, as ``repro data prepare`` splits rows)."""
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
    splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    val_key = next((k for k in ("validation", "valid", "test") if k in splits), None)
    extra = (
        {"source_splits": {"train": "train", "validation": val_key}} if "train" in splits and val_key else {}
    )
    if not extra and len(splits) != 1:
        raise ValueError(
            f"data.hf_dataset_dir={path!r} has splits {list(splits)}: give one split, or 'train' and 'validation'"
        )
    columns = next(iter(splits.values())).column_names
    if text_field not in columns:
        raise ValueError(f"data.text_field={text_field!r}: not a column of {path!r}; columns are {columns}")
    name_column = "name" if "name" in columns else None
    source = Source(
        (path,), "hf_disk", text_column=text_field, name_column=name_column, hub_split=next(iter(splits))
    )
    return source, extra

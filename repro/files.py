"""Results files: atomic writes (a reader sees the old file or the whole new one, never half; the
file gets the mode the umask gives, so a group can read a shared results folder) and JSON/YAML
reads that fail with the file's name and what is wrong."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # the mode a plain open() gives (mkstemp's is 0600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """A new folder at ``path``, written whole or not at all: the caller fills the temporary folder
    it is given (beside ``path``, with the mode the umask gives), which replaces ``path`` only when
    the block ends without an error; on an error it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp.chmod(0o777 & ~_umask())  # mkdtemp's folder is private
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Parsed JSON of ``path``; a missing or malformed file is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {str(path)!r} is not valid JSON: {exc}") from exc


def read_yaml(path: str | os.PathLike, what: str = "file") -> Any:
    """Parsed YAML of ``path``; a missing or malformed file is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    try:
        return yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {str(path)!r} is not valid YAML: {exc}") from exc


def write_report(out: str | os.PathLike, stem: str, doc: Any, markdown: str) -> None:
    """``<out>/<stem>.md`` then ``<out>/<stem>.json``, each atomically (the json last: its presence
    means the report is whole)."""
    write_text_atomic(Path(out) / f"{stem}.md", markdown)
    write_json_atomic(Path(out) / f"{stem}.json", doc)


def table_head(title: str, columns: list[str]) -> list[str]:
    """The first lines of a markdown report: its title, a blank line, a table's header and rule."""
    return [title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]

"""Experiment settings: one YAML file per experiment and scale
(``paper_configs/experiments/<experiment>/<scale>.yaml``), read into the experiment's settings
dataclass by one loader.

The loader parses with jsonargparse (what LightningCLI uses), so a settings file gets the same
typed parsing as a model config: every field checked against its type, unknown keys refused. A
path inside a settings file (the model configs it names) is relative to that file, never to the
working folder. Errors are one line naming the file, the field, the value and what is allowed;
the dataclass's own checks add the ranges.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, TypeVar

from jsonargparse import ArgumentParser
from jsonargparse.typing import Path_fr

from repro.argument_errors import settings_one_line
from repro.arguments import fields_help
from repro.paths import EXPERIMENTS_DIR, missing_file_message

ConfigPath = Path_fr  # a field of this type is a file path, relative to the settings file that names it
S = TypeVar("S")


def shipped_settings(experiment: str, scale: str, scales: tuple[str, ...]) -> Path:
    """The repository's settings file of an experiment at a scale."""
    if scale not in scales:
        raise ValueError(f"--scale={scale!r}: allowed {scales}")
    path = EXPERIMENTS_DIR / experiment / f"{scale}.yaml"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the shipped settings are not here; run from a clone of the repository "
            f"(pip install -e .) or pass --settings FILE"
        )
    return path


def _parser(cls: type) -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False, description=f"{cls.__name__} fields:\n{fields_help(cls)}")
    parser.add_argument("--settings", action="config")
    parser.add_class_arguments(cls, nested_key=None, skip={"path"}, fail_untyped=True)
    return parser


def load_settings(cls: type[S], path: str | os.PathLike, what: str, **overrides: Any) -> S:
    """The settings in ``path`` as an instance of dataclass ``cls``; ``overrides`` (not None) replace
    fields. Paths are resolved relative to the file and stored absolute."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(missing_file_message(path, what))
    parser = _parser(cls)
    try:
        namespace = parser.instantiate(
            parser.parse_args(["--settings", str(path)])
        )  # nested dataclasses built
    except Exception as exc:  # jsonargparse raises ArgumentError (and TypeError for some values)
        raise ValueError(f"{what} {str(path)!r}: {settings_one_line(exc, cls)}") from None
    values = {
        f.name: _plain(namespace.get(f.name))
        for f in dataclasses.fields(cls)
        if f.init and f.name != "path" and f.name in namespace
    }
    for name in getattr(cls, "RELATIVE_PATHS", ()):  # folders that need not exist yet: resolved here
        if isinstance(values.get(name), str) and not os.path.isabs(os.path.expanduser(values[name])):
            values[name] = os.path.normpath(path.resolve().parent / values[name])
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return cls(**values, path=str(path))
    except TypeError as exc:
        raise ValueError(f"{what} {str(path)!r}: {exc}") from None


def _plain(value: Any) -> Any:
    """Paths as absolute strings; lists as tuples (settings dataclasses are frozen)."""
    if isinstance(value, Path_fr):
        return os.path.normpath(os.fspath(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value):
        return value
    return value

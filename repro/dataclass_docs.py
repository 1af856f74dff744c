"""The one-line comment of each field of a dataclass, read from its source (``name: type = default
# comment``), so a field's documentation is written once, next to it, and shown by ``--help``,
by docstrings made from it, and by tests that check a config lists every field."""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize
from functools import cache


@cache
def field_comments(cls: type) -> dict[str, str]:
    """``{field name: its trailing comment}`` for the fields of dataclass ``cls`` (and its bases)."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names = {f.name for f in dataclasses.fields(klass)}
        line_field: dict[int, str] = {}
        for line_no, line in enumerate(source.splitlines(), 1):
            stripped = line.strip()
            name = stripped.split(":", 1)[0].strip()
            if (
                name in names
                and ":" in stripped
                and line.startswith(" " * 4)
                and not line.startswith(" " * 8)
            ):
                line_field[line_no] = name
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and tok.start[0] in line_field:
                comments[line_field[tok.start[0]]] = tok.string.lstrip("#").strip()
    return comments


def fields_help(cls: type) -> str:
    """A ``name: comment (default ...)`` line per field (for ``--help`` texts)."""
    comments = field_comments(cls)
    lines = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name == "path":
            continue
        if f.default is not dataclasses.MISSING:
            default = f" (default {f.default!r})"
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f" (default {f.default_factory()!r})"  # type: ignore[misc]
        else:
            default = " (required)"
        lines.append(f"  {f.name}: {comments.get(f.name, '')}{default}")
    return "\n".join(lines)

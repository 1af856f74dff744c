"""The one check of a ``compile`` option (the model's and the pipeline stages'): ``false``,
``true`` or the name of a ``torch.compile`` backend."""

from __future__ import annotations

import torch


def check_compile_backend(value: object, field: str) -> None:
    """A one-line error naming ``field`` unless ``value`` is a bool or a known backend."""
    if isinstance(value, bool):
        return
    backends = torch.compiler.list_backends(exclude_tags=())
    if not isinstance(value, str) or value not in backends:
        raise ValueError(
            f"{field}={value!r}: allowed false, true or a torch.compile backend: {', '.join(backends)}"
        )

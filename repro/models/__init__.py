"""Plain-torch models: per-layer partial RoPE (fixed-width MHA/GQA) and physical RoPE widths in MLA.

``GPTConfig`` imports without torch (the accounting code relies on that); the torch modules are
loaded on first use.
"""

from importlib import import_module

from .config import GPTConfig

_LAZY = {
    "GPT": ".gpt",
    "FixedWidthAttention": ".attention",
    "LatentAttention": ".attention",
    "apply_rope": ".rope",
    "rope_frequencies": ".rope",
    "rope_table": ".rope",
}

__all__ = ["GPTConfig", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

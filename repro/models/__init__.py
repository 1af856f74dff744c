"""Plain-torch models: per-layer partial RoPE (fixed-width MHA/GQA) and physical RoPE widths in MLA.

``config`` (GPTConfig) is plain Python; the torch modules are ``rope``, ``attention`` and ``gpt``
(``from repro.models.gpt import GPT``). The package itself imports only the config, so the pure
allocation maths and accounting, which need only GPTConfig, run without torch.
"""

from .config import GPTConfig

__all__ = ["GPTConfig"]

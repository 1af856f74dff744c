"""Plain-torch models: per-layer partial RoPE (fixed-width MHA/GQA) and physical RoPE widths in MLA."""

from .attention import FixedWidthAttention, LatentAttention
from .config import GPTConfig
from .gpt import GPT
from .rope import apply_rope, rope_frequencies, rope_table

__all__ = ["GPT", "GPTConfig", "FixedWidthAttention", "LatentAttention", "apply_rope", "rope_frequencies", "rope_table"]

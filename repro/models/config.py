"""GPTConfig: one flat, serialisable config; every architectural choice is a named field.

Per-layer RoPE widths live in two lists, one per attention kind:
  - ``rope_dims[l]``: fixed-width attention (MHA/GQA), dims of the head rotated in layer l;
  - ``qk_rope_head_dim[l]``: MLA, the physical rotary width of layer l (decoupled RoPE).
``None`` means "the full width in every layer" (head_dim for MHA, qk_nope_head_dim for MLA).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from repro.arguments import BelowOne, NonNegativeInt, PositiveInt, check_fields

ATTENTION_KINDS = ("mha", "mla")
ROPE_CONVENTIONS = ("neox", "prope")
MLP_KINDS = ("swiglu", "gelu")


def width_field_of(attention: str) -> str:
    """The GPTConfig list that holds the per-layer RoPE widths of an attention kind: the rotated
    dims of each query/key head (MHA) or the physical rotary width d_R of each layer (MLA)."""
    return "rope_dims" if attention == "mha" else "qk_rope_head_dim"


@dataclass
class GPTConfig:
    vocab_size: PositiveInt = 512
    """tokens in the vocabulary (linked from the datamodule by the CLI)"""
    block_size: PositiveInt = 128
    """maximum context length in tokens"""
    n_layer: PositiveInt = 4
    """number of transformer blocks"""
    n_embd: PositiveInt = 128
    """model width d_model"""
    n_head: PositiveInt = 4
    """query heads; head_dim = n_embd // n_head for MHA"""
    n_kv_head: PositiveInt | None = None
    """key/value heads for GQA (MHA only); None = n_head"""
    attention: Literal[ATTENTION_KINDS] = "mha"
    """fixed-width attention or Multi-head Latent Attention"""
    rope_dims: list[int] | None = None
    """MHA: rotated dims per layer, even, 0..head_dim; None = all head_dim"""
    rope_convention: Literal[ROPE_CONVENTIONS] = "neox"
    """frequency convention of the rotated slice"""
    rope_base: float = 10000.0
    """RoPE base (theta)"""
    # --- MLA (DeepSeek-V2 style, decoupled RoPE) ---
    q_lora_rank: NonNegativeInt = 0
    """MLA: rank of the low-rank query projection; 0 = full-rank query"""
    kv_lora_rank: PositiveInt = 64
    """MLA: compressed latent width d_c (cached per token)"""
    qk_nope_head_dim: PositiveInt = 32
    """MLA: per-head query/key dims that carry no position (d_nope)"""
    v_head_dim: PositiveInt = 32
    """MLA: per-head value dims (d_v)"""
    qk_rope_head_dim: list[int] | None = None
    """MLA: rotary width d_R per layer, even, >= 0; None = d_nope"""
    # --- the rest of the block ---
    mlp: Literal[MLP_KINDS] = "swiglu"
    """MLP kind"""
    mlp_hidden: PositiveInt | None = None
    """MLP width; None = 4*n_embd (gelu), 8/3*n_embd rounded to 8 (swiglu)"""
    norm_eps: float = 1e-5
    """RMSNorm epsilon"""
    dropout: BelowOne = 0.0
    """dropout on attention output and MLP output"""
    bias: bool = False
    """bias in linear layers"""
    tie_embeddings: bool = True
    """share the token embedding with the output head"""
    init_std: float = 0.02
    """std of the normal init; residual projections get init_std / sqrt(2 * n_layer)"""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def width_field(self) -> str:
        return width_field_of(self.attention)

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        check_fields(self, "GPTConfig.", skip=("rope_dims", "qk_rope_head_dim"))  # widths: below, per layer
        if not self.rope_base > 1.0:
            raise ValueError(f"GPTConfig.rope_base={self.rope_base!r}: must be > 1")
        if self.attention == "mha":
            self._validate_mha()
        else:
            self._validate_mla()

    def _validate_mha(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"GPTConfig.n_head={self.n_head}: must divide n_embd={self.n_embd} "
                f"(head_dim = n_embd / n_head); divisors of {self.n_embd} are "
                f"{[d for d in range(1, self.n_embd + 1) if self.n_embd % d == 0]}"
            )
        if self.n_head % self.kv_heads != 0:
            raise ValueError(
                f"GPTConfig.n_kv_head={self.n_kv_head!r}: must be a positive integer dividing n_head={self.n_head}"
            )
        if self.qk_rope_head_dim is not None:
            raise ValueError(
                "GPTConfig.qk_rope_head_dim is set but attention='mha'; use rope_dims for fixed-width attention"
            )
        _check_width_list("rope_dims", self.rope_dims, self.n_layer, max_width=self.head_dim)

    def _validate_mla(self) -> None:
        if self.rope_dims is not None:
            raise ValueError("GPTConfig.rope_dims is set but attention='mla'; use qk_rope_head_dim for MLA")
        if self.n_kv_head not in (None, self.n_head):
            raise ValueError(
                f"GPTConfig.n_kv_head={self.n_kv_head!r}: MLA shares one latent across heads; leave n_kv_head unset"
            )
        # p-RoPE needs a reference width to take frequencies from; for MLA that is d_nope
        # (the spec's `high` level), so a wider rotary part is not defined there.
        max_width = self.qk_nope_head_dim if self.rope_convention == "prope" else None
        _check_width_list("qk_rope_head_dim", self.qk_rope_head_dim, self.n_layer, max_width=max_width)

    # ------------------------------------------------------------------ derived
    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        """Per-head query/key width for MHA (d_h)."""
        return self.n_embd // self.n_head

    @property
    def rope_reference_dim(self) -> int:
        """Width whose frequencies p-RoPE takes (d_h for MHA, d_nope for MLA)."""
        return self.head_dim if self.attention == "mha" else self.qk_nope_head_dim

    def layer_rope_widths(self) -> list[int]:
        """Rotary width of every layer (rope_dims or qk_rope_head_dim, with None expanded)."""
        if self.attention == "mha":
            return list(self.rope_dims) if self.rope_dims is not None else [self.head_dim] * self.n_layer
        if self.qk_rope_head_dim is not None:
            return list(self.qk_rope_head_dim)
        return [self.qk_nope_head_dim] * self.n_layer

    @property
    def mlp_hidden_dim(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.mlp == "gelu":
            return 4 * self.n_embd
        return 8 * ((int(8 * self.n_embd / 3) + 7) // 8)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_width_list(name: str, widths: list[int] | None, n_layer: int, max_width: int | None) -> None:
    if widths is None:
        return
    if not isinstance(widths, (list, tuple)):
        raise ValueError(f"GPTConfig.{name}={widths!r}: must be a list with one width per layer")
    if len(widths) != n_layer:
        raise ValueError(
            f"GPTConfig.{name} has {len(widths)} entries but n_layer={n_layer}: give one width per layer"
        )
    limit = f"0..{max_width}" if max_width is not None else ">= 0"
    for layer, width in enumerate(widths):
        if not isinstance(width, int) or isinstance(width, bool):
            raise ValueError(f"GPTConfig.{name}[{layer}]={width!r}: must be an even integer in {limit}")
        if width < 0 or width % 2 != 0:
            raise ValueError(f"GPTConfig.{name}[{layer}]={width}: must be an even integer in {limit}")
        if max_width is not None and width > max_width:
            raise ValueError(
                f"GPTConfig.{name}[{layer}]={width}: larger than the head's width {max_width}; allowed {limit}"
            )


__all__ = ["GPTConfig", "ATTENTION_KINDS", "ROPE_CONVENTIONS", "MLP_KINDS"]

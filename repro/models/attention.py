"""Causal self-attention with a per-layer rotary width.

- ``FixedWidthAttention``: MHA/GQA with head dim d_h; the layer rotates the first ``r_l`` dims of
  every query and key head (spec 1, fixed width). KV cache per token: 2 * n_kv * d_h.
- ``LatentAttention``: Multi-head Latent Attention (DeepSeek-V2, decoupled RoPE). The layer
  caches a latent c_kv (d_c) plus one rotary key shared by all heads (d_R,l); per token the cache
  holds d_c + d_R,l elements. Score scale 1/sqrt(d_nope + d_R,l).

Both support a phase-off switch (``set_phase_off``): the rotation angle is forced to 0
(cos=1, sin=0) in this layer, for all heads or chosen query heads, without touching weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .config import GPTConfig
from .rope import apply_rope, apply_rope_with_phase_off, rope_table


class RotaryAttention(nn.Module):
    """What both attention kinds share: the layer's rotary settings, its cached cos/sin, and the
    phase-off state (off for every head, for some query heads, or not at all)."""

    def __init__(self, config: GPTConfig, layer_idx: int, rope_reference_dim: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.rope_width = config.layer_rope_widths()[layer_idx]
        self.rope_convention = config.rope_convention
        self.rope_reference_dim = rope_reference_dim  # p-RoPE takes its frequencies over this width
        self.rope_base = config.rope_base
        self.block_size = config.block_size
        self.dropout = config.dropout
        self._init_phase_off()

    def _rope(self, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        table = rope_table(
            self.rope_width,
            self.block_size,
            self.rope_convention,
            self.rope_reference_dim,
            self.rope_base,
            device,
        )
        return table.cos[:T], table.sin[:T]

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        """Causal attention of (B, T, H, d) queries over (B, T, H or Hk, d) keys/values -> (B, T, H * d_v)."""
        B, T = q.shape[:2]
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
            scale=scale,
            enable_gqa=k.shape[2] != q.shape[2],
        )  # (B, H, T, d_v)
        return y.transpose(1, 2).reshape(B, T, -1)

    def _init_phase_off(self) -> None:
        self._phase_off = False
        self._phase_off_heads: torch.Tensor | None = None  # None with _phase_off=True: all heads

    def set_phase_off(self, heads: Iterable[int] | None = None) -> None:
        """Force the rotation angle to 0 in this layer (all heads, or the given query heads)."""
        self._phase_off = True
        if heads is None:
            self._phase_off_heads = None
            return
        heads = sorted({int(h) for h in heads})
        bad = [h for h in heads if not 0 <= h < self.n_head]
        if bad:
            raise ValueError(f"phase-off heads {bad}: allowed heads are 0..{self.n_head - 1}")
        mask = torch.zeros(self.n_head, dtype=torch.bool)
        mask[heads] = True
        self._phase_off_heads = mask

    def clear_phase_off(self) -> None:
        self._init_phase_off()

    @property
    def phase_off_active(self) -> bool:
        return self._phase_off

    def _rotate_per_head(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q (B,T,H,w) and k (B,T,Hk,w) honouring the phase-off state.

        With per-head phase-off, k is expanded to H heads so that a phase-off query head meets an
        unrotated key while the other heads sharing that key still see the rotated one.
        """
        if not self._phase_off:
            return apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self._phase_off_heads is None:
            return q, k
        if k.shape[2] != q.shape[2]:
            k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
        mask = self._phase_off_heads
        return apply_rope_with_phase_off(q, cos, sin, mask), apply_rope_with_phase_off(k, cos, sin, mask)


def _causal_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Pre-softmax scores (B,H,T,T) with -inf above the diagonal. q, k: (B,T,H,D)."""
    if k.shape[2] != q.shape[2]:
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * scale
    T = q.shape[1]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf"))


class FixedWidthAttention(RotaryAttention):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, rope_reference_dim=config.head_dim)
        self.n_kv_head = config.kv_heads
        self.head_dim = config.head_dim
        d, hd = config.n_embd, self.head_dim
        self.q_proj = nn.Linear(d, self.n_head * hd, bias=config.bias)
        self.k_proj = nn.Linear(d, self.n_kv_head * hd, bias=config.bias)
        self.v_proj = nn.Linear(d, self.n_kv_head * hd, bias=config.bias)
        self.o_proj = nn.Linear(self.n_head * hd, d, bias=config.bias)

    @property
    def kv_cache_width(self) -> int:
        """Elements cached per token in this layer: keys and values of every KV head."""
        return 2 * self.n_kv_head * self.head_dim

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        if self.rope_width > 0:
            cos, sin = self._rope(T, x.device)
            q, k = self._rotate_per_head(q, k, cos, sin)
        return q, k, v

    def kv_cache_entries(self, x: torch.Tensor) -> torch.Tensor:
        """What a decoder would cache for x: rotated keys and values, (B, T, 2 * n_kv * d_h)."""
        _, k, v = self._qkv(x)
        return torch.cat([k.flatten(2), v.flatten(2)], dim=-1)

    def attention_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-softmax causal scores (B, H, T, T) as the forward pass computes them."""
        q, k, _ = self._qkv(x)
        return _causal_scores(q, k, self.head_dim**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x)  # (B, T, H, d_h), (B, T, Hk or H, d_h)
        if v.shape[2] != k.shape[2]:  # keys were expanded for per-head phase-off
            v = v.repeat_interleave(k.shape[2] // v.shape[2], dim=2)
        return self.o_proj(self._attend(q, k, v))


class LatentAttention(RotaryAttention):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, rope_reference_dim=config.qk_nope_head_dim)
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.v_head_dim = config.v_head_dim
        self.qk_head_dim = self.qk_nope_head_dim + self.rope_width
        d, H = config.n_embd, self.n_head
        if config.q_lora_rank > 0:
            self.q_a_proj = nn.Linear(d, config.q_lora_rank, bias=config.bias)
            self.q_a_norm = nn.RMSNorm(config.q_lora_rank, eps=config.norm_eps)
            self.q_b_proj = nn.Linear(config.q_lora_rank, H * self.qk_head_dim, bias=config.bias)
        else:
            self.q_proj = nn.Linear(d, H * self.qk_head_dim, bias=config.bias)
        # W_DKV and W_KR in one projection: latent (d_c) and the shared rotary key (d_R).
        self.kv_a_proj = nn.Linear(d, self.kv_lora_rank + self.rope_width, bias=config.bias)
        self.kv_a_norm = nn.RMSNorm(self.kv_lora_rank, eps=config.norm_eps)
        # W_UK and W_UV: per-head no-position keys and values from the latent.
        self.kv_b_proj = nn.Linear(
            self.kv_lora_rank, H * (self.qk_nope_head_dim + self.v_head_dim), bias=config.bias
        )
        self.o_proj = nn.Linear(H * self.v_head_dim, d, bias=config.bias)

    @property
    def kv_cache_width(self) -> int:
        """Elements cached per token in this layer: latent d_c plus the shared rotary key d_R,l."""
        return self.kv_lora_rank + self.rope_width

    def _query(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
        return q.view(B, T, self.n_head, self.qk_head_dim)

    def kv_cache_entries(self, x: torch.Tensor) -> torch.Tensor:
        """The per-token cache of this layer, (B, T, d_c + d_R,l): normalised latent, then the
        shared rotary key (stored before rotation; the rotation is applied when it is read)."""
        kv = self.kv_a_proj(x)
        c_kv, k_rope = kv.split([self.kv_lora_rank, self.rope_width], dim=-1)
        return torch.cat([self.kv_a_norm(c_kv), k_rope], dim=-1)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        H = self.n_head
        q = self._query(x)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.rope_width], dim=-1)
        cache = self.kv_cache_entries(x)
        c_kv, k_rope = cache.split([self.kv_lora_rank, self.rope_width], dim=-1)
        k_rope = k_rope.unsqueeze(2)  # (B, T, 1, d_R): one rotary key shared by all heads
        if self.rope_width > 0:
            cos, sin = self._rope(T, x.device)
            q_rope, k_rope = self._rotate_per_head(q_rope, k_rope, cos, sin)
        kv = self.kv_b_proj(c_kv).view(B, T, H, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_rope.expand(B, T, H, self.rope_width)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        return q, k, v

    def attention_scores(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-softmax causal scores (B, H, T, T) as the forward pass computes them."""
        q, k, _ = self._qkv(x)
        return _causal_scores(q, k, self.qk_head_dim**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x)  # keys carry the shared rotary part expanded to every head
        return self.o_proj(self._attend(q, k, v, scale=self.qk_head_dim**-0.5))


def build_attention(config: GPTConfig, layer_idx: int) -> FixedWidthAttention | LatentAttention:
    if config.attention == "mha":
        return FixedWidthAttention(config, layer_idx)
    return LatentAttention(config, layer_idx)

"""Rotary interventions on a Hugging Face decoder layer, for the RoPE profiles of pretrained
models: keep only a layer's highest-frequency rotary pairs, or remove the rotary phase of some
key/value heads (and the query heads that read them) by undoing the rotation on those heads."""

from __future__ import annotations

import torch
from torch import nn

PER_HEAD_PHASE_OFF = ("llama", "mistral", "qwen2", "qwen3")  # one rotation per key/value head


def keep_rotary_pairs(
    cos: torch.Tensor, sin: torch.Tensor, fraction: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (..., d) in transformers' layout (frequency i at i and i + d/2, highest first) with
    only the first ``round(fraction * d/2)`` frequencies rotating; the others get cos 1, sin 0."""
    half = cos.shape[-1] // 2
    keep = round(fraction * half)
    rotating = (torch.arange(half, device=cos.device) < keep).repeat(2)
    return torch.where(rotating, cos, torch.ones_like(cos)), torch.where(rotating, sin, torch.zeros_like(sin))


def unrotate_heads(attn: nn.Module, kv_heads: tuple[int, ...], cos: torch.Tensor, sin: torch.Tensor) -> list:
    """Hooks that give key/value heads ``kv_heads``, and the query heads reading them, the inverse
    rotation right before the attention's own: those heads attend without rotary phase. Placed on
    what the rotation is applied to (``q_norm``/``k_norm`` where the model has them, else the
    projections)."""
    n_q, n_kv = attn.config.num_attention_heads, attn.config.num_key_value_heads
    group = n_q // n_kv
    kv = torch.tensor(kv_heads)
    q = (kv[:, None] * group + torch.arange(group)).flatten()  # the query heads of those kv heads
    c, s = cos[:, :, None, :], sin[:, :, None, :]

    def unrotate(heads: torch.Tensor):
        def hook(module, args, out):
            y = out.view(*out.shape[:2], -1, attn.head_dim)
            x = y[:, :, heads]
            x1, x2 = x.chunk(2, dim=-1)
            y = y.clone()
            y[:, :, heads] = x * c - torch.cat((-x2, x1), dim=-1) * s  # R(-angle): cos, -sin
            return y.view(out.shape)

        return hook

    q_at = getattr(attn, "q_norm", None) or attn.q_proj
    k_at = getattr(attn, "k_norm", None) or attn.k_proj
    return [q_at.register_forward_hook(unrotate(q)), k_at.register_forward_hook(unrotate(kv))]

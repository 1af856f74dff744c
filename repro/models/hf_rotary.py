"""Rotary interventions on a Hugging Face decoder layer, for the RoPE profiles of pretrained
models: keep only a layer's highest-frequency rotary pairs (``keep_rotary_pairs``: on cos/sin, the
same for every head), or remove the rotary phase of chosen pairs of chosen key/value heads (and of
the query heads that read them) by undoing the rotation there (``unrotate_pairs``): whole heads
(per-head phase-off) or the pairs a ranking file leaves out (``kept_pairs_mask``).

Pairs are numbered as transformers lays them out: pair i is dims i and i + d/2 of a head, with
frequency ``theta^(-2i/d)`` (pair 0 the highest)."""

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


def kept_pairs_mask(order: list[list[int]], fraction: float) -> torch.Tensor:
    """(kv heads, d/2) bool: True where a pair loses its phase when each key/value head keeps the first
    ``round(fraction * d/2)`` pairs of its ``order`` (pair indices, most important first)."""
    half = len(order[0])
    keep = round(fraction * half)
    off = torch.ones(len(order), half, dtype=torch.bool)
    for head, pairs in enumerate(order):
        off[head, list(pairs[:keep])] = False
    return off


def unrotate_pairs(attn: nn.Module, off: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> list:
    """Hooks that give the pairs ``off`` (kv heads, d/2; True = no phase) of each key/value head, and
    of the query heads reading it, the inverse rotation right before the attention's own: there they
    attend without rotary phase. Placed on what the rotation is applied to (``q_norm``/``k_norm``
    where the model has them, else the projections)."""
    n_q, n_kv = attn.config.num_attention_heads, attn.config.num_key_value_heads
    group = n_q // n_kv
    off = off.to(cos.device)
    dims_kv = torch.cat((off, off), dim=-1)  # pair i at dims i and i + d/2
    dims_q = dims_kv.repeat_interleave(group, dim=0)  # query head j reads kv head j // group
    c, s = cos[:, :, None, :], sin[:, :, None, :]

    def unrotate(dims: torch.Tensor):
        def hook(module, args, out):
            x = out.view(*out.shape[:2], -1, attn.head_dim)
            x1, x2 = x.chunk(2, dim=-1)
            back = x * c - torch.cat((-x2, x1), dim=-1) * s  # R(-angle): cos, -sin
            return torch.where(dims, back, x).view(out.shape)

        return hook

    q_at = getattr(attn, "q_norm", None) or attn.q_proj
    k_at = getattr(attn, "k_norm", None) or attn.k_proj
    return [q_at.register_forward_hook(unrotate(dims_q)), k_at.register_forward_hook(unrotate(dims_kv))]


def read_pair_order(order, n_layer: int, kv_heads: int, half: int) -> list[list[list[int]]]:
    """A pair order: a file written by ``repro profile pair-order`` (or its ``order`` list): per
    layer, per key/value head, the ``half`` pair indices, most important first. Checked against the
    model's shape; the message names what does not match."""
    import json
    from pathlib import Path

    source = "the pair order"
    if isinstance(order, (str, Path)):
        source = f"pair order file {str(order)!r}"
        try:
            doc = json.loads(Path(order).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{source}: not readable JSON ({exc})") from None
        order = doc.get("order") if isinstance(doc, dict) else None
    if not isinstance(order, list) or len(order) != n_layer:
        got = len(order) if isinstance(order, list) else type(order).__name__
        raise ValueError(f"{source}: needs one entry per layer ({n_layer}), got {got}")
    for i, heads in enumerate(order):
        if not isinstance(heads, list) or len(heads) != kv_heads:
            raise ValueError(f"{source}: layer {i} needs {kv_heads} key/value heads' orders")
        for h, pairs in enumerate(heads):
            if sorted(pairs) != list(range(half)):
                raise ValueError(f"{source}: layer {i} head {h} is not an order of the pairs 0..{half - 1}")
    return [[[int(p) for p in pairs] for pairs in heads] for heads in order]

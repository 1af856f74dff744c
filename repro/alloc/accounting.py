"""Analytical resource accounting (PROTOCOL.md §R6). Pure functions, no torch.

Per token and per layer, for a context of T tokens, summed over layers:
  fixed width (MHA/GQA): KV cache 2 * n_kv * d_h elements; RoPE 3 * (n_h + n_kv) * r_l FLOPs
    (2 mul + 1 add per rotated element); attention 4 * n_h * d_h * T FLOPs (scores + values);
    no parameter depends on r_l.
  MLA (absorbed decode): KV cache d_c + d_R,l; attention 2 * n_h * (d_c + d_R,l) * T +
    2 * n_h * d_c * T FLOPs; RoPE 3 * (n_h + 1) * d_R,l FLOPs; rotary-dependent parameters
    W_qr (q_in x n_h * d_R,l, q_in = q_lora_rank or d_model) and W_kr (d_model x d_R,l).
  A converted model (``repro convert-mla``: a latent R_l per layer and a rotary key of 2 N_l dims
    per key/value head): KV cache R_l + n_kv * 2 N_l; attention (absorbed decode: each query head
    scores its key/value head's rotary key, and the latent for the rest and for the values)
    2 * n_h * (R_l + 2 N_l) * T + 2 * n_h * R_l * T FLOPs; RoPE 3 * (n_h + n_kv) * 2 N_l FLOPs;
    rotary parameters (n_h + n_kv) * 2 N_l * d_model (the query's and the key's rotary rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro.models.config import GPTConfig  # a plain dataclass: importing it loads no torch


@dataclass(frozen=True)
class FixedWidthShape:
    n_layer: int  # layers
    n_head: int  # query heads n_h
    n_kv_head: int  # key/value heads n_kv
    head_dim: int  # d_h


@dataclass(frozen=True)
class MLAShape:
    n_layer: int  # layers
    n_head: int  # heads n_h
    kv_lora_rank: int  # latent d_c
    n_embd: int  # d_model
    q_lora_rank: int = 0  # 0 = full-rank query (W_qr reads d_model)


def _check_widths(widths: list[int], n_layer: int) -> None:
    if len(widths) != n_layer:
        raise ValueError(f"rotary widths have {len(widths)} entries but the model has {n_layer} layers")
    bad = [w for w in widths if not isinstance(w, int) or w < 0]
    if bad:
        raise ValueError(f"rotary widths {bad}: must be integers >= 0")


def _summary(
    per_layer: dict[str, list[int]], bytes_per_elem: int, context: int, extra: dict
) -> dict[str, Any]:
    totals = {name: sum(values) for name, values in per_layer.items()}
    kv_bytes = [e * bytes_per_elem for e in per_layer["kv_cache_elements"]]
    return {
        **extra,
        "context": context,
        "bytes_per_elem": bytes_per_elem,
        "per_layer": {**per_layer, "kv_cache_bytes": kv_bytes},
        "total": {**totals, "kv_cache_bytes": sum(kv_bytes)},
    }


def account_fixed_width(
    shape: FixedWidthShape, rope_dims: list[int], context: int, bytes_per_elem: int = 2
) -> dict[str, Any]:
    """Per-token costs of a fixed-width allocation ``rope_dims`` (one r_l per layer)."""
    _check_widths(rope_dims, shape.n_layer)
    _check_positive(context=context, bytes_per_elem=bytes_per_elem)
    n_h, n_kv, d_h = shape.n_head, shape.n_kv_head, shape.head_dim
    per_layer = {
        "rope_width": list(rope_dims),
        "kv_cache_elements": [2 * n_kv * d_h for _ in rope_dims],
        "rope_flops": [3 * (n_h + n_kv) * r for r in rope_dims],
        "attention_flops": [4 * n_h * d_h * context for _ in rope_dims],
        "rotary_parameters": [0 for _ in rope_dims],
    }
    return _summary(per_layer, bytes_per_elem, context, {"attention": "mha"})


def account_mla(
    shape: MLAShape, rope_widths: list[int], context: int, bytes_per_elem: int = 2
) -> dict[str, Any]:
    """Per-token costs of an MLA allocation ``rope_widths`` (one d_R,l per layer)."""
    _check_widths(rope_widths, shape.n_layer)
    _check_positive(context=context, bytes_per_elem=bytes_per_elem)
    n_h, d_c = shape.n_head, shape.kv_lora_rank
    q_in = shape.q_lora_rank if shape.q_lora_rank > 0 else shape.n_embd
    per_layer = {
        "rope_width": list(rope_widths),
        "kv_cache_elements": [d_c + w for w in rope_widths],
        "rope_flops": [3 * (n_h + 1) * w for w in rope_widths],
        "attention_flops": [2 * n_h * (d_c + w) * context + 2 * n_h * d_c * context for w in rope_widths],
        "rotary_parameters": [q_in * n_h * w + shape.n_embd * w for w in rope_widths],
    }
    return _summary(per_layer, bytes_per_elem, context, {"attention": "mla"})


def account_latent(
    n_head: int,
    n_kv_head: int,
    n_embd: int,
    pairs: list[int],
    ranks: list[int],
    context: int,
    bytes_per_elem: int = 2,
) -> dict[str, Any]:
    """Per-token costs of a converted model: ``pairs[l]`` rotary pairs per key/value head and a
    latent of ``ranks[l]`` in layer l (what its attention caches, see the module docstring)."""
    _check_widths(pairs, len(ranks))
    _check_widths(ranks, len(pairs))
    _check_positive(context=context, bytes_per_elem=bytes_per_elem)
    n_h, n_kv = n_head, n_kv_head
    per_layer = {
        "rope_width": [2 * n for n in pairs],
        "latent_rank": list(ranks),
        "kv_cache_elements": [r + n_kv * 2 * n for n, r in zip(pairs, ranks)],
        "rope_flops": [3 * (n_h + n_kv) * 2 * n for n in pairs],
        "attention_flops": [
            2 * n_h * (r + 2 * n) * context + 2 * n_h * r * context for n, r in zip(pairs, ranks)
        ],
        "rotary_parameters": [(n_h + n_kv) * 2 * n * n_embd for n in pairs],
    }
    return _summary(per_layer, bytes_per_elem, context, {"attention": "latent (converted)"})


def account_model(
    gpt: GPTConfig | dict[str, Any], context: int | None = None, bytes_per_elem: int = 2
) -> dict[str, Any]:
    """Accounting of a model config given as a dict of GPTConfig fields (its own widths)."""
    cfg = gpt if isinstance(gpt, GPTConfig) else GPTConfig(**{"vocab_size": 1, **gpt})
    context = cfg.block_size if context is None else context
    widths = cfg.layer_rope_widths()
    if cfg.attention == "mha":
        shape = FixedWidthShape(cfg.n_layer, cfg.n_head, cfg.kv_heads, cfg.head_dim)
        return account_fixed_width(shape, widths, context, bytes_per_elem)
    shape = MLAShape(cfg.n_layer, cfg.n_head, cfg.kv_lora_rank, cfg.n_embd, cfg.q_lora_rank)
    return account_mla(shape, widths, context, bytes_per_elem)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")

"""Per-token costs (``accounting``) of a pretrained model read from its folder: a fixed-width
Llama-family model (its keys and values, every pair rotating unless ``rotary`` says otherwise), a
``repro convert-mla`` folder (its latent and rotary keys per layer: what its attention caches), or
DeepSeek's MLA."""

from __future__ import annotations

import os
from typing import Any

from .accounting import FixedWidthShape, MLAShape, account_fixed_width, account_latent, account_mla


def account_pretrained(
    location: str | os.PathLike,
    context: int | None = None,
    bytes_per_elem: int = 2,
    rotary: list[float] | None = None,
) -> dict[str, Any]:
    """Accounting of the model at ``location`` (a folder, .gguf, package or hub id) at ``context``
    tokens (default: its max_position_embeddings); ``rotary``: per layer, the fraction of pairs that
    rotate (a fixed-width model's ``model.rotary``)."""
    from repro.models.hf_folder import model_folder, read_config

    config = read_config(model_folder(location))
    context = int(context or config.max_position_embeddings)
    kind = config.model_type
    n_layer, n_head = int(config.num_hidden_layers), int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_head)
    if kind == "llama_mla":
        pairs = [len(p[0]) for p in config.mla_rotary_pairs]
        ranks = [int(r) for r in config.mla_latent_ranks]
        return account_latent(n_head, n_kv, int(config.hidden_size), pairs, ranks, context, bytes_per_elem)
    if kind == "deepseek_v3":
        shape = MLAShape(
            n_layer, n_head, int(config.kv_lora_rank), int(config.hidden_size), int(config.q_lora_rank or 0)
        )
        return account_mla(shape, [int(config.qk_rope_head_dim)] * n_layer, context, bytes_per_elem)
    if kind == "gpt2":
        raise ValueError("repro account: GPT-2 has no rotary embedding to account")
    d = int(getattr(config, "head_dim", None) or config.hidden_size // n_head)
    fractions = rotary or [1.0] * n_layer
    dims = [2 * round(f * d / 2) for f in fractions]
    return account_fixed_width(FixedWidthShape(n_layer, n_head, n_kv, d), dims, context, bytes_per_elem)

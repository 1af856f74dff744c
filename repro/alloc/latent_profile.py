"""The rank-benefit profile of a converted model (the coverage-benefit protocol, §R3, applied to
the latent): base, every layer's latent cut to the low rank; upgrade ``l``, layer ``l`` at the high
rank; ``benefit[l] = loss(base) - loss(upgrade l)`` on the validation chunks with its 95 % CI over
them. One conversion at the high rank in every layer serves every run: the factorization's components
come largest first, so running a layer with its first r components is exactly its conversion at
rank r (``LlamaMLAForCausalLM.set_active_ranks``). Zero-shot.
"""

from __future__ import annotations

import os
from typing import Any

from repro.models.gguf_folder import source_note
from repro.runs.provenance import provenance_header
from repro.stats import mean_interval

from .pretrained_profile import layerwise_losses, pretrained_model_and_data, token_mean
from .profile import LayerProfile


def rank_benefit_profile(
    config_path: str | os.PathLike,
    converted: str | os.PathLike,
    low: int,
    high: int,
    cache_dir: str | None = None,
    progress=None,
) -> LayerProfile:
    """The profile of ``converted`` (a convert-mla folder at rank >= ``high`` in every layer) on the
    validation chunks of ``config_path``'s data."""
    model, datamodule = pretrained_model_and_data(config_path, cache_dir, pretrained=converted)
    if model.config.model_type != "llama_mla":
        raise ValueError(f"rank profile: {str(converted)!r} is not a convert-mla folder")
    n = model.n_layer
    batches = list(datamodule.val_dataloader())
    model.eval()

    base_ranks = dict.fromkeys(range(n), low)
    variants = {"base": (n, base_ranks)} | {f"layer {i} high": (i, {**base_ranks, i: high}) for i in range(n)}
    measured = layerwise_losses(model, batches, variants, model.hf.set_active_ranks, progress)
    base = measured["base"]
    values, intervals, losses = [], [], {"base": token_mean(base)}
    for layer in range(n):
        up = measured[f"layer {layer} high"]
        _, lo, hi = mean_interval([b - u for (b, _), (u, _) in zip(base, up)])
        values.append(token_mean(base) - token_mean(up))
        intervals.append([lo, hi])
        losses[f"layer {layer} high"] = token_mean(up)
    model.hf.set_active_ranks(None)
    meta: dict[str, Any] = {
        **provenance_header(),  # commit, time, machine
        "source": str(config_path),
        "converted": str(converted),
        "weights_note": source_note(model.folder),
        "intervention": "latent rank upgrade: every layer at the low rank, one layer high",
        "levels": {"low": low, "high": high, "unit": "latent rank"},
        "context": int(datamodule.block_size),
        "loss_base": token_mean(base),
        "chunks": len(base),
        "eval_tokens": sum(t for _, t in base),
        "ci95": intervals,
        "losses": losses,
    }
    return LayerProfile(
        kind="rank_benefit",
        values=values,
        model={"pretrained": str(converted), "model_type": "llama_mla", "n_layer": n},
        meta=meta,
    )

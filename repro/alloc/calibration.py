"""What a pretrained model's attention sees on calibration text, for its MLA conversion:

- ``pair_order``: per layer and key/value head, the rotary pairs ranked by their contribution to the
  q.k scores, MHA2MLA's 2-norm selection: for pair i, the mean over tokens of ``||q_i||`` (summed
  over the query heads that read the key/value head) times the mean of ``||k_i||``, largest first.
- ``attention_input_moments``: per layer, the second moment ``E[x x^T]`` of the attention's inputs
  (the normed hidden states), for the activation-aware factorization (``mla_conversion.factorize``).

Both run the model over calibration batches (a config's training text, the model's own tokenizer)
with hooks on its attention projections; the model is left as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from repro.models.hf_causal_lm import HFCausalLM

from .pretrained_profile import pretrained_model_and_data


def calibration_batches(config_path: str | os.PathLike, blocks: int, cache_dir: str | None = None):
    """The config's model (materialized) and ``blocks`` evenly spaced blocks of its training text,
    one block per batch."""
    model, datamodule = pretrained_model_and_data(config_path, cache_dir)
    train = datamodule.train_set
    if blocks > len(train):
        raise ValueError(f"--calibration_blocks={blocks}: the training text has {len(train)} blocks")
    step = len(train) / blocks
    return model, [train.__getitems__([int(i * step)]).batch for i in range(blocks)]


def _hooked(model: HFCausalLM, batches: list[dict[str, torch.Tensor]], attach) -> None:
    layers = model.hf.model.layers
    hooks = [h for i, layer in enumerate(layers) for h in attach(i, layer.self_attn)]
    try:
        model.set_rotary(None)
        model.eval()
        with torch.no_grad():
            for batch in batches:
                model(batch["input_ids"])
    finally:
        for h in hooks:
            h.remove()


def pair_order(model: HFCausalLM, batches: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Per layer, per key/value head, the rotary pairs by decreasing q.k 2-norm contribution, and
    the scores themselves (mean ||q_i|| summed over the group times mean ||k_i||)."""
    model.check_per_head_phase_off("the pair order")
    n_layer, n_kv, d = model.n_layer, model.kv_heads, model.head_dim
    n_q = model.config.num_attention_heads
    half = d // 2
    sums = {
        kind: torch.zeros(n_layer, (n_q if kind == "q" else n_kv), half, dtype=torch.float64) for kind in "qk"
    }
    count = [0]

    def attach(i: int, attn):
        def norms(kind: str):
            def hook(module, args, out):
                x = out.detach().view(*out.shape[:2], -1, d).double()
                pair_norm = (x[..., :half] ** 2 + x[..., half:] ** 2).sqrt()  # pair i: dims i, i + d/2
                sums[kind][i] += pair_norm.sum(dim=(0, 1))
                if kind == "k" and i == 0:
                    count[0] += out.shape[0] * out.shape[1]

            return hook

        q_at = getattr(attn, "q_norm", None) or attn.q_proj
        k_at = getattr(attn, "k_norm", None) or attn.k_proj
        return [q_at.register_forward_hook(norms("q")), k_at.register_forward_hook(norms("k"))]

    _hooked(model, batches, attach)
    q = sums["q"] / count[0]
    k = sums["k"] / count[0]
    scores = q.view(n_layer, n_kv, n_q // n_kv, half).sum(dim=2) * k  # (layers, kv heads, pairs)
    order = [
        [sorted(range(half), key=lambda p, s=scores[i, g]: (-float(s[p]), p)) for g in range(n_kv)]
        for i in range(n_layer)
    ]
    return {"order": order, "scores": scores.tolist(), "tokens": count[0]}


def attention_input_moments(model: HFCausalLM, batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Per layer, E[x x^T] (d_model x d_model, float64) of the attention's input x."""
    n = model.config.hidden_size
    moments = [torch.zeros(n, n, dtype=torch.float64) for _ in range(model.n_layer)]
    count = [0] * model.n_layer

    def attach(i: int, attn):
        def hook(module, args, kwargs):
            x = (args[0] if args else kwargs["hidden_states"]).detach().double().reshape(-1, n)
            moments[i] += x.T @ x
            count[i] += x.shape[0]

        return [attn.register_forward_pre_hook(hook, with_kwargs=True)]

    _hooked(model, batches, attach)
    return [m / c for m, c in zip(moments, count)]


def pair_order_file(config_path: str | os.PathLike, blocks: int, out: str | os.PathLike) -> dict[str, Any]:
    """``repro profile pair-order``: the pair order of the config's pretrained model on ``blocks``
    blocks of its training text, written to ``out`` (the file ``--pair_order`` reads)."""
    from repro.files import write_json_atomic

    model, batches = calibration_batches(config_path, blocks)
    doc = {
        "kind": "rotary_pair_order",
        "method": "q.k 2-norm (MHA2MLA): mean ||q_i|| over the group's query heads x mean ||k_i||",
        "model": {"pretrained": str(model.folder), "n_layer": model.n_layer, "kv_heads": model.kv_heads},
        "source": str(Path(config_path)),
        "blocks": blocks,
        "block_size": int(batches[0]["input_ids"].shape[1]),
        **pair_order(model, batches),
    }
    write_json_atomic(out, doc)
    return doc

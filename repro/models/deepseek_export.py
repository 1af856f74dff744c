"""A converted model (``llama_mla``, every layer with the same widths) written as a Hugging Face
DeepseekV3 folder, so that transformers' own MLA code loads it with the same logits.

DeepSeek's MLA differs from the converted attention in three ways, each bridged exactly:
- **One rotary key shared by all heads** (``k_pe``, width ``qk_rope_head_dim``). The converted layer
  has one rotary key per key/value head (2 N dims each); they are laid side by side
  (``qk_rope_head_dim = n_kv * 2 N``) and each query head's ``q_pe`` is zero outside its key/value
  head's slice, so ``q_pe . k_pe`` is that head's rotary score.
- **DeepSeek's frequencies** are a geometric series over ``qk_rope_head_dim``; the converted pairs keep
  the source's (the same N per head, repeated n_kv times). ``rope_type: longrope`` with equal
  ``short_factor``/``long_factor`` (one factor per frequency, ``attention_factor`` 1) sets each
  frequency to the source's.
- **An RMSNorm on the latent** (``kv_a_layernorm``). A constant latent coordinate of 2^40 (the bias of
  ``kv_a_proj_with_mqa``: ``attention_bias: true``) makes the norm's scale the same for every token
  in float32 and bfloat16 (the latent's own square is below the sum's rounding), and the norm's
  weights undo it; the position-free keys' and values' biases ride on that coordinate.
The query scale ``(qk_nope + qk_rope)^-1/2`` is turned into the source's ``d^-1/2`` by scaling
``q_proj``. So a token caches ``R + 1 + n_kv * 2 N`` elements (one more than the converted model).

Where it does not: widths that differ between layers (DeepSeek has one ``kv_lora_rank`` and one
``qk_rope_head_dim``), pair sets that differ between layers (one frequency list for the model), no
rotary pair at all, a query bias (Qwen2: DeepSeek's ``q_proj`` has none), a source rotary embedding
whose frequencies change with the length (dynamic, YaRN), and float16 (2^40 overflows it). Engines
that implement only DeepSeek's default or YaRN rotary embedding, or that drop
``kv_a_proj_with_mqa``'s bias, load the folder but do not give these logits.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from repro.files import atomic_folder

from .hf_folder import HFModelError, TensorFiles, model_folder, read_config
from .mla_llama import MODEL_TYPE, head_dim_of

CONSTANT = 2.0**40  # the latent coordinate that fixes kv_a_layernorm's scale
STATIC_ROPE = ("default", "linear", "llama3")


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or {}
    return str(params.get("rope_type", "default"))


def check_deepseek_exportable(config, widths) -> None:
    """One line naming why a conversion (its source config and per-layer widths) has no exact
    DeepseekV3 form."""
    ranks = {w.rank for w in widths}
    pairs = {json.dumps(w.pairs) for w in widths}
    if len(ranks) != 1 or len(pairs) != 1:
        raise ValueError(
            "--deepseek: DeepseekV3 has one latent rank and one rotary width for every layer; this conversion "
            f"has ranks {sorted(ranks)} and {len(pairs)} different rotary pair sets"
        )
    if not widths[0].pairs[0]:
        raise ValueError(
            "--deepseek: a conversion without rotary pairs has no DeepseekV3 form (qk_rope_head_dim 0)"
        )
    qkv_bias = config.model_type == "qwen2" or getattr(config, "mla_qkv_bias", False)
    if qkv_bias:
        raise ValueError(
            "--deepseek: the source has a query bias (Qwen2), which DeepseekV3's q_proj does not hold"
        )
    if _rope_type(config) not in STATIC_ROPE:
        raise ValueError(
            f"--deepseek: the source's rotary embedding (rope_type {_rope_type(config)!r}) changes with the length; "
            f"exportable: {', '.join(STATIC_ROPE)}"
        )


def source_frequencies(config) -> tuple[torch.Tensor, float]:
    """The source's inverse frequencies (d/2, pair i first) and its cos/sin scaling."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config=config)
    return rotary.inv_freq.double(), float(rotary.attention_scaling)


def deepseek_config(config, pairs: list[list[int]], rank: int) -> dict:
    """The DeepseekV3 config.json of a uniform conversion."""
    n_kv, n = config.num_key_value_heads, len(pairs[0])
    d = head_dim_of(config)
    width = n_kv * 2 * n
    inv_freq, scaling = source_frequencies(config)
    base = float(config.rope_parameters["rope_theta"])
    targets = [float(inv_freq[p]) for head in pairs for p in head]
    factors = [1.0 / (t * base ** (2 * j / width)) for j, t in enumerate(targets)]
    return {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "moe_intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "first_k_dense_replace": config.num_hidden_layers,  # a dense MLP in every layer
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_attention_heads,
        "q_lora_rank": None,
        "kv_lora_rank": rank + 1,
        "qk_rope_head_dim": width,
        "qk_nope_head_dim": d - 2 * n,
        "v_head_dim": d,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": bool(config.tie_word_embeddings),
        "attention_bias": True,
        "attention_dropout": 0.0,
        "rope_interleave": False,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": base,
            "short_factor": factors,
            "long_factor": factors,
            "factor": 1.0,
            "attention_factor": scaling,
            "original_max_position_embeddings": config.max_position_embeddings,
        },
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": getattr(config, "pad_token_id", None),
        "num_mtp_layers": 0,
        "repro_source": {"converted_from": getattr(config, "mla_conversion", {}), "constant": CONSTANT},
    }


def deepseek_layer(read, i: int, config) -> dict[str, torch.Tensor]:
    """One layer's attention tensors in DeepseekV3's names."""
    src, dst = f"model.layers.{i}.self_attn", f"model.layers.{i}.self_attn"
    n_h, n_kv = config.num_attention_heads, config.num_key_value_heads
    d, group = head_dim_of(config), n_h // n_kv
    pairs, rank = config.mla_rotary_pairs[i], int(config.mla_latent_ranks[i])
    n, half = len(pairs[0]), d // 2
    width = n_kv * 2 * n
    nope = [[j for j in range(d) if j not in set(p) | {q + half for q in p}] for p in pairs]
    scale = math.sqrt((d - 2 * n + width) / d)

    def optional(name: str, size: int) -> torch.Tensor:
        try:
            return read(name).double()
        except (KeyError, HFModelError):
            return torch.zeros(size, dtype=torch.float64)

    wq = read(f"{src}.q_proj.weight").double().view(n_h, d, -1)
    q = torch.zeros(n_h, d - 2 * n + width, wq.shape[-1], dtype=torch.float64)
    for h in range(n_h):
        g = h // group
        q[h, : d - 2 * n] = wq[h, nope[g]]
        for m, p in enumerate(pairs[g]):
            q[h, d - 2 * n + g * n + m] = wq[h, p]
            q[h, d - 2 * n + width // 2 + g * n + m] = wq[h, p + half]
    w_a = read(f"{src}.kv_a_proj.weight").double()
    w_r = read(f"{src}.k_rope_proj.weight").double().view(n_kv, 2 * n, -1)
    b_r = optional(f"{src}.k_rope_proj.bias", n_kv * 2 * n).view(n_kv, 2 * n)
    pe = torch.zeros(width, w_a.shape[1], dtype=torch.float64)
    pe_bias = torch.zeros(width, dtype=torch.float64)
    for g in range(n_kv):
        for m in range(n):
            for part in (0, 1):  # first and second component of the pair
                row = part * (width // 2) + g * n + m
                pe[row], pe_bias[row] = w_r[g, part * n + m], b_r[g, part * n + m]
    a = torch.cat((w_a, torch.zeros(1, w_a.shape[1], dtype=torch.float64), pe))
    a_bias = torch.cat((torch.zeros(rank, dtype=torch.float64), torch.tensor([CONSTANT]).double(), pe_bias))
    # kv_a_layernorm: every token's scale is K = rsqrt(CONSTANT^2 / (rank + 1) + eps), as float32 computes it
    k = float(torch.rsqrt(torch.tensor(CONSTANT**2, dtype=torch.float32) / (rank + 1) + 1e-6))
    norm = torch.cat((torch.full((rank,), 1.0 / k, dtype=torch.float64), torch.ones(1, dtype=torch.float64)))
    const = CONSTANT * k  # what the constant coordinate is after the norm
    w_b = read(f"{src}.kv_b_proj.weight").double().view(n_kv, 2 * d - 2 * n, rank)
    b_b = optional(f"{src}.kv_b_proj.bias", n_kv * (2 * d - 2 * n)).view(n_kv, 2 * d - 2 * n)
    b = torch.cat((w_b, (b_b / const)[..., None]), dim=-1).repeat_interleave(group, dim=0)  # per query head
    o_bias = optional(f"{src}.o_proj.bias", config.hidden_size)
    return {
        f"{dst}.q_proj.weight": (q * scale).reshape(-1, wq.shape[-1]),
        f"{dst}.kv_a_proj_with_mqa.weight": a,
        f"{dst}.kv_a_proj_with_mqa.bias": a_bias,
        f"{dst}.kv_a_layernorm.weight": norm,
        f"{dst}.kv_b_proj.weight": b.reshape(-1, rank + 1),
        f"{dst}.o_proj.weight": read(f"{src}.o_proj.weight").double(),
        f"{dst}.o_proj.bias": o_bias,
    }


def write_deepseek(converted: str | Path, out: str | Path) -> Path:
    """The DeepseekV3 folder of a converted folder (``repro convert-mla``'s, or an export of its
    fine-tune), written atomically beside ``out``."""
    from safetensors.torch import save_file

    from . import mla_llama  # noqa: F401  (registers llama_mla)
    from .mla_conversion import LayerWidths

    folder = model_folder(converted)
    config = read_config(folder)
    if config.model_type != MODEL_TYPE:
        raise HFModelError(
            f"--deepseek: {str(folder)!r} is a {config.model_type!r} model, not a convert-mla folder"
        )
    widths = [LayerWidths(p, int(r)) for p, r in zip(config.mla_rotary_pairs, config.mla_latent_ranks)]
    check_deepseek_exportable(config, widths)
    files = TensorFiles(folder)
    state: dict[str, torch.Tensor] = {}
    for i in range(config.num_hidden_layers):
        state.update(deepseek_layer(files.get, i, config))
    for name in files.files:
        if ".self_attn." not in name:
            state[name] = files.get(name).double()
    state = {k: v.float().contiguous() for k, v in state.items()}
    with atomic_folder(out) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        doc = deepseek_config(config, widths[0].pairs, widths[0].rank)
        (tmp / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
        for extra in folder.iterdir():
            if (
                extra.is_file()
                and extra.name != "config.json"
                and not extra.name.startswith("model.safetensors")
            ):
                shutil.copy(extra, tmp / extra.name)
    return Path(out)


def compare_logits(converted: str | Path, deepseek: str | Path, tokens: int = 128, seed: int = 0) -> dict:
    """Both folders' logits (transformers' own code for each) on ``tokens`` random token ids: the
    largest absolute difference and the largest logit, in float32."""
    from transformers import AutoModelForCausalLM

    from . import mla_llama  # noqa: F401

    a = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.float32).eval()
    ids = torch.randint(0, a.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = a(ids).logits
        del a
        b = AutoModelForCausalLM.from_pretrained(str(deepseek), dtype=torch.float32).eval()
        got = b(ids).logits
    return {
        "tokens": tokens,
        "max_abs_diff": float((got - want).abs().max()),
        "max_abs_logit": float(want.abs().max()),
    }

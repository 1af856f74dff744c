"""A Llama-family model whose attention caches a latent: what ``repro convert-mla`` writes.

Each layer's attention keeps, per key/value head, a few rotary pairs of its key as they were (the
decoupled rotary key, rotated with the model's own frequencies) and rebuilds the rest of the key
(without position) and the value from one low-rank latent per token (Multi-head Latent Attention,
DeepSeek-V2 style, as MHA2MLA converts pretrained models; here with a width per layer):

    q       = W_q x                                       (as the source model; n_h heads of d)
    k_rope  = W_kr x            (n_kv heads x 2 N_l: pairs P_{l,g} of head g, rotated)
    c       = W_a x             (R_l: the latent)
    [k_nope, v] = W_b c + b     (n_kv heads x (d - 2 N_l), n_kv heads x d)
    k[g]    = k_rope[g] at dims (P, P + d/2), k_nope[g] at the other dims

so a token's cache in layer l is ``R_l + n_kv * 2 N_l`` elements (``c`` and ``k_rope``; what the
cache this module fills holds). Scores and values are the source model's whenever nothing is cut.
The query keeps its layout; each query head reads its key/value head's dims in the same order
(rotary pairs first), so the scores are unchanged by the reordering.

The config (``model_type: llama_mla``) is a LlamaConfig with ``mla_rotary_pairs`` (per layer, per
key/value head, the rotary pair indices kept: pair i is dims i and i + d/2) and ``mla_latent_ranks``
(per layer R_l), ``mla_qkv_bias`` (a Qwen2 source's q/k/v biases). Importing this module registers it
with transformers' Auto classes, so ``AutoModelForCausalLM.from_pretrained(folder)`` loads it.
Nothing here knows of Lightning or of parallelism.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

MODEL_TYPE = "llama_mla"


class LlamaMLAConfig(LlamaConfig):
    """LlamaConfig plus the per-layer latent attention (``mla_rotary_pairs``, ``mla_latent_ranks``,
    ``mla_qkv_bias``; read with ``getattr``, kept as extra attributes of the config)."""

    model_type = MODEL_TYPE


def layer_widths(config, layer: int) -> tuple[list[list[int]], int]:
    """A layer's rotary pairs per key/value head and its latent rank, checked against the shape."""
    pairs, ranks = config.mla_rotary_pairs, config.mla_latent_ranks
    n_layer, n_kv = config.num_hidden_layers, config.num_key_value_heads
    half = head_dim_of(config) // 2
    if (
        not isinstance(pairs, list)
        or len(pairs) != n_layer
        or not isinstance(ranks, list)
        or len(ranks) != n_layer
    ):
        raise ValueError(f"{MODEL_TYPE} config: mla_rotary_pairs and mla_latent_ranks need {n_layer} entries")
    heads = pairs[layer]
    if len(heads) != n_kv or len({len(h) for h in heads}) != 1:
        raise ValueError(
            f"{MODEL_TYPE} config: layer {layer} needs {n_kv} equal-length lists of rotary pairs"
        )
    for h in heads:
        if len(set(h)) != len(h) or any(not 0 <= p < half for p in h):
            raise ValueError(
                f"{MODEL_TYPE} config: layer {layer} pairs {h}: distinct indices in 0..{half - 1}"
            )
    rank = int(ranks[layer])
    if rank < 1:
        raise ValueError(f"{MODEL_TYPE} config: layer {layer} latent rank {rank}: must be >= 1")
    return [list(map(int, h)) for h in heads], rank


def head_dim_of(config) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LatentKVAttention(nn.Module):
    """The attention of one converted layer (see the module docstring); the call signature and
    attention kernels are LlamaAttention's."""

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim = d = head_dim_of(config)
        n_h, n_kv = config.num_attention_heads, config.num_key_value_heads
        self.num_heads, self.num_kv_heads = n_h, n_kv
        self.num_key_value_groups = n_h // n_kv
        self.scaling = d**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.pairs, self.rank = layer_widths(config, layer_idx)
        self.n_pairs = n = len(self.pairs[0])
        qkv_bias = bool(config.attention_bias or getattr(config, "mla_qkv_bias", False))
        self.q_proj = nn.Linear(config.hidden_size, n_h * d, bias=qkv_bias)
        self.k_rope_proj = nn.Linear(config.hidden_size, n_kv * 2 * n, bias=qkv_bias) if n else None
        self.kv_a_proj = nn.Linear(config.hidden_size, self.rank, bias=False)
        self.kv_b_proj = nn.Linear(self.rank, n_kv * (2 * d - 2 * n), bias=qkv_bias)
        self.o_proj = nn.Linear(n_h * d, config.hidden_size, bias=config.attention_bias)
        self.active_rank: int | None = None  # run with only the first r latent components (the SVD's top r)
        self._index: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def cache_elements(self) -> int:
        """Elements a token caches in this layer: the latent and the rotary keys."""
        return (self.active_rank or self.rank) + self.num_kv_heads * 2 * self.n_pairs

    def dims(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Per key/value head, the head dims of its rotary key (pairs P then P + d/2) and the others."""
        if device not in self._index:
            half = self.head_dim // 2
            rope = [list(p) + [i + half for i in p] for p in self.pairs]
            nope = [[i for i in range(self.head_dim) if i not in set(r)] for r in rope]
            self._index[device] = (
                torch.tensor(rope, dtype=torch.long, device=device).view(self.num_kv_heads, 2 * self.n_pairs),
                torch.tensor(nope, dtype=torch.long, device=device).view(self.num_kv_heads, -1),
            )
        return self._index[device]

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        past_key_values=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cache = cache if cache is not None else past_key_values
        kwargs.pop("position_ids", None)
        kwargs.pop("use_cache", None)
        b, t, _ = hidden_states.shape
        d, n, n_kv, group = self.head_dim, self.n_pairs, self.num_kv_heads, self.num_key_value_groups
        rope, nope = self.dims(hidden_states.device)
        q = self.q_proj(hidden_states).view(b, t, self.num_heads, d)
        q_rope_dims = rope.repeat_interleave(group, dim=0)  # query head j reads kv head j // group
        q_nope_dims = nope.repeat_interleave(group, dim=0)
        q_nope = q.gather(-1, q_nope_dims.expand(b, t, -1, -1))
        r = self.active_rank or self.rank
        latent = nn.functional.linear(hidden_states, self.kv_a_proj.weight[:r])  # (b, t, R)
        if n:
            cos, sin = position_embeddings  # (b or 1, t, d): the model's own frequencies
            cos_k, sin_k = cos[:, :, rope], sin[:, :, rope]  # (b, t, n_kv, 2n)
            k_rope = self.k_rope_proj(hidden_states).view(b, t, n_kv, 2 * n)
            k_rope = k_rope * cos_k + rotate_half(k_rope) * sin_k
            q_rope = q.gather(-1, q_rope_dims.expand(b, t, -1, -1))
            cos_q, sin_q = cos_k.repeat_interleave(group, dim=2), sin_k.repeat_interleave(group, dim=2)
            query = torch.cat((q_rope * cos_q + rotate_half(q_rope) * sin_q, q_nope), dim=-1)
        else:
            k_rope = latent.new_zeros(b, t, n_kv, 0)
            query = q_nope
        k_rope, latent = k_rope.transpose(1, 2), latent[:, None]  # (b, n_kv, t, 2n), (b, 1, t, R)
        if cache is not None:  # the cache holds what this layer stores per token: k_rope and the latent
            k_rope, latent = cache.update(k_rope, latent, self.layer_idx)
        s = latent.shape[2]
        kv = nn.functional.linear(latent[:, 0], self.kv_b_proj.weight[:, :r], self.kv_b_proj.bias)
        kv = kv.view(b, s, n_kv, 2 * d - 2 * n)
        k_nope, value = kv.split([d - 2 * n, d], dim=-1)
        key = torch.cat((k_rope, k_nope.transpose(1, 2)), dim=-1)  # (b, n_kv, s, d), rotary dims first
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        out, weights = attention(
            self,
            query.transpose(1, 2),
            key,
            value.transpose(1, 2),
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        return self.o_proj(out.reshape(b, t, -1).contiguous()), weights


class LlamaMLAForCausalLM(LlamaForCausalLM):
    """LlamaForCausalLM with a ``LatentKVAttention`` in every layer."""

    config_class = LlamaMLAConfig

    def __init__(self, config) -> None:
        super().__init__(config)
        for i, layer in enumerate(self.model.layers):
            layer.self_attn = LatentKVAttention(config, i)
        self.post_init()

    def cache_elements_per_token(self) -> list[int]:
        """Per layer, the elements a token caches (latent + rotary keys)."""
        return [layer.self_attn.cache_elements for layer in self.model.layers]

    def set_active_ranks(self, ranks: dict[int, int] | None) -> None:
        """Run layer i with only the first ``ranks[i]`` latent components: exactly the conversion at
        that rank (the factorization's components come in order, largest first); None: all."""
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            r = None if not ranks or i not in ranks else int(ranks[i])
            if r is not None and not 1 <= r <= attn.rank:
                raise ValueError(f"layer {i}: active rank {r} outside 1..{attn.rank}")
            attn.active_rank = r


AutoConfig.register(MODEL_TYPE, LlamaMLAConfig, exist_ok=True)
AutoModelForCausalLM.register(LlamaMLAConfig, LlamaMLAForCausalLM, exist_ok=True)

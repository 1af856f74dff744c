"""GPT decoder with a per-layer rotary width (plain torch; knows nothing of Lightning).

Pre-norm blocks (RMSNorm), SwiGLU or GELU MLP, tied embeddings, causal attention through
``scaled_dot_product_attention``. The model is an ordered list of parts (``embed``, ``blocks``,
``head``) so that a pipeline can keep only the parts a stage owns.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from repro.deferred_init import InitTrace, assign_parameters, deferring, parameter_names, tied_groups

from .attention import FixedWidthAttention, LatentAttention, build_attention
from .config import GPTConfig


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = config.mlp_hidden_dim
        self.kind = config.mlp
        if self.kind == "swiglu":
            self.gate_proj = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.up_proj = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.down_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "swiglu":
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        else:
            h = F.gelu(self.up_proj(x))
        return self.dropout(self.down_proj(h))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = build_attention(config, layer_idx)
        self.mlp_norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x)))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config  # checked when it was made (GPTConfig.__post_init__)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm_f = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        residual_std = config.init_std / math.sqrt(2 * config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=residual_std)

    @classmethod
    def build(cls, config: GPTConfig) -> GPT:
        """``GPT(config)``; inside :func:`repro.models.deferred_init.deferred_init`, the same model on
        the meta device, its weights drawn by :meth:`materialize` (bit for bit those of ``GPT(config)``
        built here, and the random state after it the same)."""
        if not deferring():
            return cls(config)
        model, trace = InitTrace.build(lambda: cls(config))
        model.init_trace = trace
        return model

    @property
    def is_materialized(self) -> bool:
        return not any(p.is_meta for p in self.parameters())

    def materialize(self, parts: Iterable[nn.Module] | None = None) -> None:
        """Draw the weights of ``parts`` (submodules; None = all) of a deferred model that are still on
        meta; a model built whole is left as it is."""
        trace = getattr(self, "init_trace", None)
        if trace is None:
            return
        wanted = None if parts is None else parameter_names(self, parts)
        meta = {
            n
            for n, p in self.named_parameters(remove_duplicate=False)
            if p.is_meta and (wanted is None or n in wanted)
        }
        source = getattr(self, "weight_source", None)
        if meta and source is not None:  # the weights of a checkpoint: copied, never drawn
            dtypes = {n: p.dtype for n, p in self.named_parameters(remove_duplicate=False)}
            groups = tied_groups(self, meta.__contains__)
            assign_parameters(self, {g: source[g[0]].detach().to(dtypes[g[0]], copy=True) for g in groups})
        elif meta:  # only what is still on meta: drawn weights (and a stage's freed parts) stay as they are
            trace.materialize(self, meta.__contains__)
        if self.is_materialized:
            self.init_trace = self.weight_source = None

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """``load_state_dict(state)`` (strict); a deferred model instead takes ``state`` as its weights'
        source: :meth:`materialize` copies a part's tensors from it (a pipeline stage its own parts
        only) and draws nothing."""
        if getattr(self, "init_trace", None) is None:
            self.load_state_dict(state)
            return
        expected = {n: tuple(p.shape) for n, p in self.named_parameters(remove_duplicate=False)}
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        wrong = [n for n in expected if n in state and tuple(state[n].shape) != expected[n]]
        if missing or unexpected or wrong:
            raise ValueError(
                f"weights do not fit this GPT: missing {missing}, unexpected {unexpected}, "
                f"other shapes {[(n, tuple(state[n].shape), expected[n]) for n in wrong]}"
            )
        self.weight_source = state

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)

    # ------------------------------------------------------------------ parts
    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> hidden states (B, T, d_model)."""
        if idx.shape[1] > self.config.block_size:
            raise ValueError(
                f"sequence length {idx.shape[1]} exceeds GPTConfig.block_size={self.config.block_size}"
            )
        return self.drop(self.wte(idx))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, T, d_model) -> logits (B, T, vocab)."""
        return self.lm_head(self.norm_f(x))

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross entropy; targets (B, T), -100 ignored."""
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab), or (logits, loss) when targets are given."""
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        if targets is None:
            return logits
        return logits, self.loss(logits, targets)

    # ------------------------------------------------------------------ introspection
    def attention_layers(self) -> list[FixedWidthAttention | LatentAttention]:
        return [block.attn for block in self.blocks]

    def kv_cache_elements_per_token(self) -> list[int]:
        """Per layer: cached elements per token (2*n_kv*d_h for MHA, d_c + d_R,l for MLA)."""
        return [attn.kv_cache_width for attn in self.attention_layers()]

    # ------------------------------------------------------------------ phase-off switch
    def set_phase_off(self, layers: Iterable[int] | Mapping[int, Iterable[int] | None]) -> None:
        """Force the rotation angle to 0 in the given layers (all heads), or, with a mapping
        ``{layer: heads}``, in chosen query heads of each layer (``None`` = all heads).
        Other layers are left as they are. Weights are not touched."""
        spec = layers if isinstance(layers, Mapping) else {int(layer): None for layer in layers}
        bad = [layer for layer in spec if not 0 <= int(layer) < self.config.n_layer]
        if bad:
            raise ValueError(f"phase-off layers {bad}: allowed layers are 0..{self.config.n_layer - 1}")
        for layer, heads in spec.items():
            self.blocks[int(layer)].attn.set_phase_off(heads)

    def clear_phase_off(self) -> None:
        for attn in self.attention_layers():
            attn.clear_phase_off()

    @contextlib.contextmanager
    def phase_off(self, layers: Iterable[int] | Mapping[int, Iterable[int] | None]) -> Iterator[GPT]:
        """Context manager: phase-off in ``layers`` inside the block, restored on exit."""
        saved = [(attn._phase_off, attn._phase_off_heads) for attn in self.attention_layers()]
        self.clear_phase_off()
        try:
            self.set_phase_off(layers)
            yield self
        finally:
            for attn, (active, heads) in zip(self.attention_layers(), saved):
                attn._phase_off, attn._phase_off_heads = active, heads

"""Hugging Face causal language models as the suite runs them: loaded from a local folder
(``config.json`` and safetensors, sharded with an index or not), a GGUF file or a hub id, built on
the meta device and materialized part by part, so a pipeline rank reads only its own stage's tensors.

The model runs as an ordered list of parts, the same list the pipeline cuts:
  - ``embed``: token ids -> hidden states (GPT-2 adds its learned positions);
  - ``layers``: one per decoder layer; each computes its rotary embeddings itself (the model's own
    rotary module, on every stage) and passes an explicit causal mask under ``eager`` attention
    (under ``sdpa`` no mask means causal; under ``eager`` it would mean bidirectional);
  - ``head``: final norm and the output head.
A layer's rotary phase can be removed (identity rotation: cos 1, sin 0) or kept for only its
highest-frequency pairs (``rotary``), or removed in some key/value heads only
(``set_phase_off_heads``), the interventions of the RoPE profiles.

Families: the Llama family (``llama``, ``mistral``, ``qwen2``, ``qwen3``, DeepSeek's MLA in
``deepseek_v3``, and ``llama_mla``, a Llama converted to latent attention by ``repro convert-mla``:
``model.embed_tokens``, ``model.layers``, ``model.norm``, ``model.rotary_emb``, ``lm_head``) and
``gpt2`` (``transformer.wte``/``wpe``/``h``/``ln_f``). Nothing here knows of Lightning or of
parallelism.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from .hf_folder import SUPPORTED, HFModelError, TensorFiles, model_folder, num_layers, read_config  # noqa: F401
from .hf_rotary import PER_HEAD_PHASE_OFF, keep_rotary_pairs, kept_pairs_mask, read_pair_order, unrotate_pairs

ATTENTION = ("sdpa", "eager")


# ---------------------------------------------------------------------------- the parts
def causal_mask(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive (1, 1, T, T) mask of eager attention: 0 where a query may look, the dtype's
    minimum above the diagonal (as transformers' own eager mask)."""
    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[None, None]


class Embed(nn.Module):
    def __init__(self, tokens: nn.Module, positions: nn.Module | None = None, drop: nn.Module | None = None):
        super().__init__()
        self.tokens, self.positions, self.drop = tokens, positions, drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.tokens(ids)
        if self.positions is not None:
            h = h + self.positions(torch.arange(ids.shape[1], device=ids.device))[None]
        return self.drop(h) if self.drop is not None else h


class Layer(nn.Module):
    """One decoder layer with its positions: rotary embeddings computed here (Llama family), an
    explicit causal mask under eager attention. ``rotary``: 1.0 = as trained, 0.0 = no rotary
    phase (identity rotation), a fraction f = only f of the pairs rotate: the highest frequencies,
    or with ``rotary_order`` (per key/value head, pair indices most important first) the first of
    that order in each head."""

    def __init__(self, layer: nn.Module, family: str, attention: str, rotary_emb: nn.Module | None) -> None:
        super().__init__()
        self.layer, self.family, self.attention = layer, family, attention
        self.rotary_emb = rotary_emb  # shared by every layer (a buffer only: its inverse frequencies)
        self.rotary = 1.0
        self.rotary_order: list[list[int]] | None = None  # per kv head: pair indices, kept first
        self.phase_off_heads: tuple[int, ...] = ()  # key/value heads whose rotary phase is removed

    def _pairs_off(self) -> torch.Tensor | None:
        """(kv heads, d/2) True where a pair loses its phase by hooks (None: no hook needed)."""
        off = None
        if self.rotary != 1.0 and self.rotary_order is not None:
            off = kept_pairs_mask(self.rotary_order, self.rotary)
        if self.phase_off_heads:
            attn = self.layer.self_attn
            heads = torch.zeros(attn.config.num_key_value_heads, attn.head_dim // 2, dtype=torch.bool)
            heads[list(self.phase_off_heads)] = True
            off = heads if off is None else off | heads
        return off

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        length = h.shape[1]
        mask = causal_mask(length, h.dtype, h.device) if self.attention == "eager" else None
        if self.family == "gpt2":
            return self.layer(h, attention_mask=mask)
        position_ids = torch.arange(length, device=h.device)[None]
        cos, sin = self.rotary_emb(h, position_ids)
        if self.rotary != 1.0 and self.rotary_order is None:
            cos, sin = keep_rotary_pairs(cos, sin, self.rotary)
        off = self._pairs_off()
        hooks = unrotate_pairs(self.layer.self_attn, off, cos, sin) if off is not None else []
        try:
            return self.layer(
                h, attention_mask=mask, position_ids=position_ids, position_embeddings=(cos, sin)
            )
        finally:
            for hook in hooks:
                hook.remove()


class Head(nn.Module):
    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))


# ---------------------------------------------------------------------------- the model
class HFCausalLM(nn.Module):
    """A Hugging Face causal LM run through its parts. Built on the meta device; ``materialize``
    reads the tensors of some parts (a pipeline stage's) or of all of them (``materialize()``).

    Args:
        location: A local model folder (config.json + safetensors) or a hub id.
        attention: 'sdpa' or 'eager'.
        tie_embeddings: 'auto' (as the config says), or 'untied': the head gets its own copy of a tied
            embedding (saved as two tensors).
    """

    def __init__(self, location: str, attention: str = "sdpa", tie_embeddings: str = "auto") -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        if attention not in ATTENTION:
            raise HFModelError(f"model.attention={attention!r}: allowed values are {ATTENTION}")
        if tie_embeddings not in ("auto", "untied"):
            raise HFModelError(
                f"model.tie_embeddings={tie_embeddings!r}: allowed values are ('auto', 'untied')"
            )
        self.folder = model_folder(location)
        self.config = read_config(self.folder)
        self.family = "gpt2" if self.config.model_type == "gpt2" else "llama"
        self.untie = tie_embeddings == "untied" and bool(getattr(self.config, "tie_word_embeddings", False))
        if self.untie:
            self.config.tie_word_embeddings = False
        with torch.device("meta"):
            self.hf = AutoModelForCausalLM.from_config(
                self.config, attn_implementation=attention, dtype=torch.float32
            )
        rotary = None
        if self.family == "llama":  # computed buffers, not in the checkpoint: built for real at once
            rotary = type(self.hf.model.rotary_emb)(config=self.config)
            self.hf.model.rotary_emb = rotary
        self.files = TensorFiles(self.folder)
        self._check_tied_weights()
        if self.family == "gpt2":
            t = self.hf.transformer
            embed, blocks, norm = Embed(t.wte, t.wpe, t.drop), t.h, t.ln_f
        else:
            m = self.hf.model
            embed, blocks, norm = Embed(m.embed_tokens), m.layers, m.norm
        # the parts hold the model's own modules; kept outside the module tree (state-dict names stay the model's)
        self.__dict__["embed"] = embed
        self.__dict__["layers"] = [Layer(b, self.family, attention, rotary) for b in blocks]
        self.__dict__["head"] = Head(norm, self.hf.lm_head)

    # ------------------------------------------------------------------ tensors
    def _check_tied_weights(self) -> None:
        tied = bool(getattr(self.config, "tie_word_embeddings", False))
        head, embed = "lm_head.weight", self._embedding_name()
        both = tied and head in self.files and embed in self.files
        if both and not torch.equal(self.files.get(head), self.files.get(embed)):
            raise HFModelError(
                f"model {str(self.folder)!r}: config.json ties the embedding and the head, but the checkpoint "
                f"holds two different tensors (loading would drop one); give model.tie_embeddings: untied"
            )

    def _embedding_name(self) -> str:
        return "transformer.wte.weight" if self.family == "gpt2" else "model.embed_tokens.weight"

    def _tensor(self, name: str) -> torch.Tensor:
        if name in self.files:
            return self.files.get(name)
        if name == "lm_head.weight" and self._embedding_name() in self.files:  # a tied head, or untied here
            return self.files.get(self._embedding_name()).clone()
        raise HFModelError(f"model {str(self.folder)!r}: the checkpoint has no tensor {name!r}")

    def materialize(self, modules: list[nn.Module] | None = None, source=None) -> None:
        """Read the tensors of these parts (None: all; those still on the meta device) from the
        checkpoint (or from ``source``: state-dict name -> tensor), as ``GPT.materialize`` draws its.
        Each parameter read replaces its meta placeholder wherever the model holds it, so a parameter
        shared by several parts (a tied embedding and head) stays one parameter."""
        read = source or self._tensor
        modules = [self.embed, *self.layers, self.head] if modules is None else modules
        prefixes: dict[nn.Module, str] = {}
        for name, module in self.hf.named_modules(remove_duplicate=False):
            prefixes.setdefault(module, name)
        swaps: list[tuple[nn.Parameter, nn.Parameter]] = []  # (placeholder, real), compared by identity
        for module in modules:
            for sub in module.modules():
                if sub not in prefixes:  # the parts' own wrappers, the rotary module (real already)
                    continue
                for pname, p in list(sub._parameters.items()):
                    if p is None or not p.is_meta:
                        continue
                    done = next((new for old, new in swaps if old is p), None)
                    if done is None:
                        name = f"{prefixes[sub]}.{pname}" if prefixes[sub] else pname
                        done = nn.Parameter(
                            read(name).detach().float().clone(), requires_grad=p.requires_grad
                        )
                        swaps.append((p, done))
                    sub._parameters[pname] = done
                for bname, b in list(sub._buffers.items()):
                    if b is not None and b.is_meta:
                        name = f"{prefixes[sub]}.{bname}" if prefixes[sub] else bname
                        if name not in self.files:
                            raise HFModelError(
                                f"model {str(self.folder)!r}: buffer {name!r} is computed, not stored"
                            )
                        sub._buffers[bname] = self.files.get(name)
        for holder in self.hf.modules():  # the same placeholder anywhere else in the model
            for pname, q in list(holder._parameters.items()):
                new = next((new for old, new in swaps if old is q), None)
                if new is not None:
                    holder._parameters[pname] = new
        if (
            self.untie
            and self.hf.lm_head.weight is self._embedding_param()
            and not self.hf.lm_head.weight.is_meta
        ):
            self.hf.lm_head.weight = nn.Parameter(self.hf.lm_head.weight.detach().clone())

    def _embedding_param(self) -> nn.Parameter:
        return self.hf.transformer.wte.weight if self.family == "gpt2" else self.hf.model.embed_tokens.weight

    @property
    def is_materialized(self) -> bool:
        return not any(p.is_meta for p in self.hf.parameters())

    def parts(self) -> tuple[nn.Module, list[nn.Module], nn.Module]:
        return self.embed, list(self.layers), self.head

    # ------------------------------------------------------------------ running
    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        logits = self.head(h)
        return logits, (None if targets is None else self.loss(logits, targets))

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def set_rotary(self, fractions: dict[int, float] | None, order: list | str | None = None) -> None:
        """Layer i rotates only ``fractions[i]`` of its rotary pairs (0 = no phase): its highest
        frequencies, or with ``order`` (a pair-order file or its ``order`` list: per layer, per
        key/value head, pair indices most important first) the first of that order in each head;
        None: every layer as trained."""
        if fractions and self.family == "gpt2":
            raise HFModelError("rotary coverage: GPT-2 has no rotary phase (learned positions)")
        if order is not None and fractions:
            self.check_per_head_phase_off("a rotary pair order")
            order = read_pair_order(order, self.n_layer, self.kv_heads, self.head_dim // 2)
        for i, layer in enumerate(self.layers):
            layer.rotary = 1.0 if not fractions or i not in fractions else float(fractions[i])
            layer.rotary_order = order[i] if order is not None and fractions else None

    def set_phase_off_heads(self, heads: dict[int, list[int]] | None) -> None:
        """Layer i attends without rotary phase in key/value heads ``heads[i]`` (and the query heads
        that read them: with grouped-query attention a query head cannot lose its phase alone, its
        keys are shared); None: every head as trained. Llama family with per-head rotations only
        (MLA's rotary key is one head shared by all query heads; GPT-2 has no rotary phase)."""
        if heads:
            self.check_per_head_phase_off()
        for i, layer in enumerate(self.layers):
            chosen = tuple(sorted((heads or {}).get(i, ())))
            if any(not 0 <= h < self.kv_heads for h in chosen):
                raise HFModelError(f"per-head phase-off: layer {i} heads {chosen}: there are {self.kv_heads}")
            layer.phase_off_heads = chosen

    def check_per_head_phase_off(self, what: str = "per-head phase-off") -> None:
        """Fail in one line for a model whose heads do not each have their own rotation."""
        if self.family == "gpt2" or self.config.model_type not in PER_HEAD_PHASE_OFF:
            raise HFModelError(
                f"{what}: not defined for model_type {self.config.model_type!r} "
                f"(supported: {PER_HEAD_PHASE_OFF})"
            )

    @property
    def kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.config.num_attention_heads)

    @property
    def head_dim(self) -> int:
        return int(
            getattr(self.config, "head_dim", None)
            or self.config.hidden_size // self.config.num_attention_heads
        )

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def n_layer(self) -> int:
        return num_layers(self.config)

    # ------------------------------------------------------------------ export
    def save_pretrained(self, out: str | os.PathLike, state: dict[str, torch.Tensor] | None = None) -> Path:
        """A ``from_pretrained``-loadable folder: config, sharded safetensors, and every other file of
        the source folder (the tokenizer's, a chat template, the generation config; not a GGUF
        source's record, which describes other weights); ``state`` (full state-dict names) replaces
        the weights."""
        import shutil

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        if state is not None:
            missing = [n for n, p in self.hf.named_parameters() if n not in state]
            if missing:
                raise HFModelError(f"export: the weights lack {missing[:3]}")
            self.materialize(source=state.__getitem__)
            self.hf.load_state_dict(state, strict=False)
        self.hf.save_pretrained(str(out), max_shard_size="2GB")
        weights = (
            "config.json",
            "model.safetensors.index.json",
            "gguf_source.json",
        )  # the source's, not these
        for extra in self.folder.iterdir():  # the tokenizer, whatever files it has (a chat template too)
            if extra.is_file() and extra.suffix != ".safetensors" and extra.name not in weights:
                shutil.copy(extra, out / extra.name)
        return out

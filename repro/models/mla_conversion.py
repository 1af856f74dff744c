"""Convert a pretrained Llama-family model (Llama, Mistral, Qwen2) to Multi-head Latent Attention,
with a rotary width and a latent rank per layer: the folder ``repro convert-mla`` writes.

Per layer l and key/value head g, the key's rotary pairs ``P_{l,g}`` (N_l of the d/2; the highest
frequencies, or the first of a pair order) are kept as the decoupled rotary key, rows of ``W_k`` as
they are. The key's other rows (no position) and ``W_v`` are stacked and factorized jointly:
``[W_k_nope; W_v] = U S V^T``, cut to rank R_l: ``W_a = S^1/2 V^T`` (the latent a token caches),
``W_b = U S^1/2`` (k_nope and v from it). With ``svd="activations"`` the factorization minimizes the
error on the layer's inputs instead of on the weights: the SVD of ``M C^1/2`` with C the
second moment of the attention's inputs on calibration text (``C^-1/2`` folded into ``W_a``).
Nothing is cut at every pair and the full rank (min(d_model, n_kv (2 d - 2 N))): the logits are
the source's to float precision; N pairs at full rank give the source with only those pairs
rotating (``model.rotary``). The query, output, MLP, norms and embeddings are copied.

The conversion reads the source's tensors one at a time (``TensorFiles``) and writes a folder
(config ``model_type: llama_mla``, ``model.safetensors``, every tokenizer file of the source) into a
temporary folder renamed into place: nothing is written half.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from repro.files import atomic_folder

from .hf_folder import HFModelError, TensorFiles, model_folder, read_config
from .mla_llama import MODEL_TYPE, head_dim_of

CONVERTIBLE = ("llama", "mistral", "qwen2")  # q/k/v/o projections, one rotation per key/value head
WEIGHT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")
SVD_KINDS = ("weights", "activations")


@dataclass(frozen=True)
class LayerWidths:
    """One layer's conversion: rotary pairs kept per key/value head, and the latent rank."""

    pairs: list[list[int]]
    rank: int

    @property
    def cache_elements(self) -> int:
        return self.rank + len(self.pairs) * 2 * len(self.pairs[0])


def source_config(location: str | os.PathLike):
    """The source's folder and config, checked: a family the conversion is defined for."""
    folder = model_folder(location)
    config = read_config(folder)
    kind = config.model_type
    if kind not in CONVERTIBLE:
        why = {
            "gpt2": "it has no rotary embedding (learned positions)",
            "qwen3": "its per-head q/k norms act on the whole key, so no part of it factorizes linearly",
            "deepseek_v3": "it is MLA already",
            MODEL_TYPE: "it is converted already",
        }.get(kind, "its attention is not a Llama-style q/k/v/o with one rotation per key/value head")
        raise HFModelError(
            f"convert-mla: model_type {kind!r} cannot be converted ({why}); convertible: {', '.join(CONVERTIBLE)}"
        )
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        raise HFModelError(
            f"convert-mla: {str(folder)!r} uses sliding-window attention (sliding_window="
            f"{config.sliding_window}), which the converted attention does not implement"
        )
    return folder, config


def full_rank(config, n_pairs: int) -> int:
    """The largest useful latent rank of a layer keeping ``n_pairs`` pairs per key/value head."""
    d, n_kv = head_dim_of(config), config.num_key_value_heads
    return min(config.hidden_size, n_kv * (2 * d - 2 * n_pairs))


def per_layer(value, n_layer: int, what: str) -> list:
    """A value for every layer: one value, or a list (a JSON file's, e.g. written by repro allocate)."""
    if isinstance(value, list):
        if len(value) != n_layer:
            raise ValueError(f"{what}: {len(value)} entries, but the model has {n_layer} layers")
        return list(value)
    return [value] * n_layer


def plan_widths(
    config, rotary_pairs, latent_rank, order: list[list[list[int]]] | None = None
) -> list[LayerWidths]:
    """Every layer's pairs and rank from ``rotary_pairs`` (N, 'all', or a list per layer) and
    ``latent_rank`` (R, 'full', or a list per layer; 'full' entries allowed in the list), the pairs
    the first N of ``order`` per key/value head (default: the highest frequencies). One line names a
    bad value and what is allowed."""
    n_layer, n_kv = config.num_hidden_layers, config.num_key_value_heads
    half = head_dim_of(config) // 2
    pairs = per_layer(rotary_pairs, n_layer, "--rotary_pairs")
    ranks = per_layer(latent_rank, n_layer, "--latent_rank")
    out = []
    for layer, (n, r) in enumerate(zip(pairs, ranks)):
        n = half if n == "all" else n
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= half:
            raise ValueError(
                f"--rotary_pairs: layer {layer} has {n!r}; allowed 0..{half} pairs per key/value head, or 'all'"
            )
        top = full_rank(config, n)
        r = top if r == "full" else r
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= top:
            raise ValueError(
                f"--latent_rank: layer {layer} has {r!r}; with {n} rotary pairs the layer's rank is at most "
                f"{top} (min(d_model, n_kv * (2 * head_dim - 2 * pairs))); allowed 1..{top} or 'full'"
            )
        heads = [list(range(half))] * n_kv if order is None else order[layer]
        out.append(LayerWidths([list(h[:n]) for h in heads], r))
    return out


def rope_and_nope_rows(widths: LayerWidths, head_dim: int) -> tuple[list[int], list[int]]:
    """Rows of W_k (n_kv * d) that become the rotary key (per head: pairs P, then P + d/2) and the
    rows that go into the latent (per head: the other dims, ascending): LatentKVAttention's order."""
    half = head_dim // 2
    rope, nope = [], []
    for g, pairs in enumerate(widths.pairs):
        dims = list(pairs) + [p + half for p in pairs]
        rope += [g * head_dim + i for i in dims]
        nope += [g * head_dim + i for i in range(head_dim) if i not in set(dims)]
    return rope, nope


def factorize(
    stacked: torch.Tensor, rank: int, covariance: torch.Tensor | None = None, damping: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_a, W_b) with W_b @ W_a the best rank-``rank`` approximation of ``stacked`` (rows x d_model):
    in the weights' norm, or with ``covariance`` (d_model x d_model, the inputs' second moment) in the
    norm of the outputs on those inputs. Computed in float64."""
    m = stacked.double()
    if covariance is None:
        u, s, vh = torch.linalg.svd(m, full_matrices=False)
        root = s[:rank].sqrt()
        return (root[:, None] * vh[:rank]).float(), (u[:, :rank] * root).float()
    c = covariance.double()
    c = c + damping * c.diagonal().mean() * torch.eye(c.shape[0], dtype=c.dtype)
    lam, q = torch.linalg.eigh(c)
    lam = lam.clamp_min(lam.max() * 1e-12)
    c_half = (q * lam.sqrt()) @ q.T
    c_inv_half = (q / lam.sqrt()) @ q.T
    u, s, vh = torch.linalg.svd(m @ c_half, full_matrices=False)
    root = s[:rank].sqrt()
    return (root[:, None] * vh[:rank] @ c_inv_half).float(), (u[:, :rank] * root).float()


def convert_layer(
    read, prefix: str, widths: LayerWidths, head_dim: int, covariance: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of one converted attention (names under ``prefix``, e.g. model.layers.3.self_attn)."""
    wk, wv = read(f"{prefix}.k_proj.weight").float(), read(f"{prefix}.v_proj.weight").float()
    rope, nope = rope_and_nope_rows(widths, head_dim)
    n_kv = len(widths.pairs)
    d_nope = head_dim - 2 * len(widths.pairs[0])
    hidden = wk.shape[1]
    stack = torch.cat((wk[nope].view(n_kv, d_nope, hidden), wv.view(n_kv, head_dim, hidden)), dim=1)
    stack = stack.reshape(n_kv * (d_nope + head_dim), hidden)  # per head: its k_nope rows, then its v rows
    w_a, w_b = factorize(stack, widths.rank, covariance)
    out = {f"{prefix}.kv_a_proj.weight": w_a.contiguous(), f"{prefix}.kv_b_proj.weight": w_b.contiguous()}
    if rope:
        out[f"{prefix}.k_rope_proj.weight"] = wk[rope].contiguous()
    bias_k = f"{prefix}.k_proj.bias"
    try:
        bk, bv = read(bias_k).float(), read(f"{prefix}.v_proj.bias").float()
    except (KeyError, HFModelError):
        return out
    if rope:
        out[f"{prefix}.k_rope_proj.bias"] = bk[rope].contiguous()
    out[f"{prefix}.kv_b_proj.bias"] = torch.cat(
        (bk[nope].view(n_kv, d_nope), bv.view(n_kv, head_dim)), dim=1
    ).reshape(-1)
    return out


def converted_config(config, widths: list[LayerWidths], record: dict) -> dict:
    """The converted folder's config.json: the source's with the latent attention's fields."""
    doc = config.to_dict()
    qkv_bias = config.model_type == "qwen2"  # Qwen2: biased q/k/v, unbiased o
    doc.update(
        model_type=MODEL_TYPE,
        architectures=["LlamaMLAForCausalLM"],
        attention_bias=bool(getattr(config, "attention_bias", False)) and not qkv_bias,
        mla_rotary_pairs=[w.pairs for w in widths],
        mla_latent_ranks=[w.rank for w in widths],
        mla_qkv_bias=qkv_bias,
        mla_conversion=record,
    )
    for key in ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types"):
        doc.pop(key, None)
    return doc


def convert_to_mla(
    source: str | os.PathLike,
    out: str | os.PathLike,
    widths: list[LayerWidths],
    covariances: list[torch.Tensor] | None = None,
    record: dict | None = None,
    progress=None,
) -> Path:
    """Write the converted model of ``source`` as a folder at ``out`` (atomically: a temporary
    folder beside it, renamed into place; an existing ``out`` is replaced only when complete)."""
    from safetensors.torch import save_file

    folder, config = source_config(source)
    files = TensorFiles(folder)
    d = head_dim_of(config)
    if len(widths) != config.num_hidden_layers:
        raise ValueError(f"convert-mla: {len(widths)} layer plans for {config.num_hidden_layers} layers")
    state: dict[str, torch.Tensor] = {}
    converted = set()
    for layer, w in enumerate(widths):
        prefix = f"model.layers.{layer}.self_attn"
        cov = covariances[layer] if covariances is not None else None
        state.update(convert_layer(files.get, prefix, w, d, cov))
        converted |= {f"{prefix}.{p}_proj.{k}" for p in "kv" for k in ("weight", "bias")}
        if progress is not None:
            progress(layer + 1, len(widths))
    for name in files.files:
        if name not in converted:
            state[name] = files.get(name).float().contiguous()
    with atomic_folder(out) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        doc = converted_config(config, widths, record or {})
        (tmp / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        for extra in folder.iterdir():  # the tokenizer (every file of it) and generation config
            if extra.is_file() and extra.name not in WEIGHT_FILES and not extra.name.endswith(".safetensors"):
                shutil.copy(extra, tmp / extra.name)
    return Path(out)


def kv_cache_elements(config) -> list[int]:
    """Per layer, the elements one token caches: a converted model's latent and rotary keys, or a
    fixed-width model's keys and values (2 n_kv d)."""
    if config.model_type == MODEL_TYPE:
        n_kv = config.num_key_value_heads
        return [
            int(r) + n_kv * 2 * len(p[0]) for p, r in zip(config.mla_rotary_pairs, config.mla_latent_ranks)
        ]
    n_kv = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    return [2 * n_kv * head_dim_of(config)] * config.num_hidden_layers

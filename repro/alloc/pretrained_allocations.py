"""Budgeted coverage allocations of a pretrained model, tested: each allocation of ``repro allocate``
(profiled, phase-off-k, uniform, first-k, last-k, spaced-k, random-k, inverse, ...; one file per
budget) becomes a rotation (layer l keeps its rotated dims / head width of its pairs), evaluated on
the test chunks zero-shot or after a short fine-tune of each (``pretrained_rotations``), paired over
the chunks against a reference allocation of the same budget (``uniform`` by default) and reported
beside the model with every pair rotating (full RoPE, fine-tuned the same way when the rows are).
"""

from __future__ import annotations

import os
from typing import Any

from repro.runs.provenance import provenance_header
from repro.stats import mean_interval

from .pretrained_profile import pretrained_model_and_data, token_mean
from .pretrained_rotations import Chunks, Finetune, Rotation, finetuned_losses, zero_shot_losses

FULL = "full RoPE"


def allocation_name(budget: float, record: dict[str, Any]) -> str:
    draw = record.get("record", {}).get("draw")
    return f"B{budget:g} {record['method']}" + ("" if draw is None else f" #{int(draw) + 1}")


def allocation_rotations(docs: list[dict[str, Any]], head_dim: int) -> tuple[dict[str, Rotation], dict]:
    """Every allocation of every file as a rotation (by name ``B<budget> <method>``) and its record."""
    rotations: dict[str, Rotation] = {}
    records: dict[str, dict[str, Any]] = {}
    for doc in docs:
        budget = float(doc["levels"]["budget"])
        for a in doc["allocations"]:
            name = allocation_name(budget, a)
            if name in rotations:
                raise ValueError(f"allocation {name!r} appears twice; give one file per budget")
            rotations[name] = {i: w / head_dim for i, w in enumerate(a["widths"])}
            records[name] = {"budget": budget, **a}
    return rotations, records


def evaluate_allocations(
    config_path: str | os.PathLike,
    docs: list[dict[str, Any]],
    reference: str = "uniform",
    finetune: Finetune | None = None,
    order: str | None = None,
    cache_dir: str | None = None,
    progress=None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Every allocation's test loss, paired over the chunks against ``reference`` of its budget."""
    model, datamodule = pretrained_model_and_data(config_path, cache_dir)
    rotations, records = allocation_rotations(docs, model.head_dim)
    budgets = sorted({r["budget"] for r in records.values()})
    for b in budgets:
        if f"B{b:g} {reference}" not in rotations:
            raise ValueError(f"--reference {reference!r}: the budget {b:g} file has no such allocation")
    for name, r in records.items():
        if len(r["widths"]) != model.n_layer:
            raise ValueError(f"allocation {name!r}: {len(r['widths'])} layers, the model has {model.n_layer}")
    split = "test" if datamodule.test_set is not datamodule.val_set else "validation (no test split)"
    everything = {FULL: {}} | rotations
    curves = None
    if finetune is None:
        losses = zero_shot_losses(model, list(datamodule.test_dataloader()), everything, order, progress)
    else:
        losses, curves = finetuned_losses(
            config_path,
            finetune,
            everything,
            model.n_layer,
            "test",
            order,
            cache_dir,
            quiet,
            "allocation fine-tune",
        )
    full = losses[FULL]
    rows = []
    for name, r in records.items():
        chunks = losses[name]
        ref_name = f"B{r['budget']:g} {reference}"
        row = {
            "name": name,
            "budget": r["budget"],
            "method": r["method"],
            "draw": r.get("record", {}).get("draw"),
            "pairs_per_layer": [int(w) // 2 for w in r["widths"]],
            "high_layers": r.get("high_layers", []),
            "mean_coverage": r.get("mean_level"),
            "loss": token_mean(chunks),
            "increase_over_full_rope": token_mean(chunks) - token_mean(full),
            "chunks": [list(c) for c in chunks],  # (loss, tokens) per test chunk: any other pairing later
        }
        row.update(_paired(chunks, losses[ref_name], name == ref_name, reference))
        if curves is not None:
            row["curves"] = curves[name]
        rows.append(row)
    return {
        **provenance_header(),  # commit, time, machine
        "split": split,
        "chunks": len(full),
        "context": int(datamodule.block_size),
        "eval_tokens": sum(n for _, n in full),
        "reference": reference,
        "loss_full_rope": token_mean(full),
        "full_rope_chunks": [list(c) for c in full],
        "full_rope_curves": None if curves is None else curves[FULL],
        "pair_order": "highest frequencies (p-RoPE order)" if order is None else str(order),
        "finetune": None if finetune is None else finetune.record(),
        "rows": rows,
    }


def _paired(chunks: Chunks, ref: Chunks, is_ref: bool, reference: str) -> dict[str, Any]:
    """The difference to ``ref`` (token-weighted) and the 95 % CI of the mean chunk difference (the
    same when the chunks hold equal tokens, as blocks do)."""
    if is_ref:
        return {"delta_vs_reference": None, "delta": None, "ci95": None, "verdict": None}
    mean, low, high = mean_interval([a - b for (a, _), (b, _) in zip(chunks, ref)])
    verdict = (
        f"worse than {reference}" if low > 0 else f"better than {reference}" if high < 0 else "unresolved"
    )
    delta = token_mean(chunks) - token_mean(ref)
    return {"delta_vs_reference": delta, "delta": delta, "mean_chunk_delta": mean, "ci95": [low, high],
            "verdict": verdict}  # fmt: skip


def allocations_markdown(result: dict[str, Any]) -> str:
    tuned = result.get("finetune")
    how = (
        f"after a {tuned['steps']}-step fine-tune of each (seeds {tuned['seeds']})" if tuned else "zero-shot"
    )
    ref = result["reference"]
    lines = [
        f"Coverage allocations {how}, {result['context']} tokens of context, on {result['chunks']} {result['split']} "
        f"chunks ({result['eval_tokens']} tokens); full RoPE {result['loss_full_rope']:.4f}. "
        f"Δ = loss − `{ref}`'s at the same budget, 95% CI over the chunks.",
        "",
        f"| budget | allocation | high layers | loss | over full RoPE | Δ vs {ref} | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        name = r["method"] + ("" if r["draw"] is None else f" #{r['draw'] + 1}")
        high = ", ".join(map(str, r["high_layers"])) if r["high_layers"] else "-"
        high = "all" if len(r["high_layers"]) == len(r["pairs_per_layer"]) else high
        delta = "" if r["delta_vs_reference"] is None else f"{r['delta_vs_reference']:+.4f}"
        ci = "" if r["ci95"] is None else f"{r['ci95'][0]:+.4f} .. {r['ci95'][1]:+.4f}"
        lines.append(
            f"| {r['budget']:g} | {name} | {high} | {r['loss']:.4f} | {r['increase_over_full_rope']:+.4f} | "
            f"{delta} | {ci} | {r['verdict'] or ''} |"
        )
    return "\n".join(lines) + "\n"


def context_batches(datamodule, context: int, chunk_tokens: int) -> list[dict]:
    """The test text (validation where there is none) cut into chunks of ``chunk_tokens`` tokens, each
    one batch of blocks of ``context`` tokens: every context reads the same text in the same chunks."""
    import torch

    split = "test" if datamodule.has_test_split else "validation"
    stream = torch.from_numpy(datamodule.token_stream(split).astype("int64"))
    n = (len(stream) - 1) // chunk_tokens
    if n < 2:
        raise ValueError(
            f"--contexts: the {split} text holds {len(stream)} tokens, fewer than 2 chunks of {chunk_tokens}"
        )
    out = []
    for c in range(n):
        piece = stream[c * chunk_tokens : (c + 1) * chunk_tokens + 1]
        out.append({"input_ids": piece[:-1].view(-1, context), "targets": piece[1:].view(-1, context)})
    return out


def evaluate_contexts(
    config_path: str | os.PathLike,
    docs: list[dict[str, Any]],
    contexts: list[int],
    reference: str = "uniform",
    order: str | None = None,
    progress=None,
) -> dict[str, Any]:
    """Every allocation (and full RoPE) zero-shot at each context on the same text: chunks of the
    longest context's length, the CI over them; Δ paired against ``reference`` of the same budget."""
    model, datamodule = pretrained_model_and_data(config_path)
    rotations, records = allocation_rotations(docs, model.head_dim)
    chunk = max(contexts)
    if any(chunk % c for c in contexts):
        raise ValueError(f"--contexts {contexts}: each must divide the longest ({chunk})")
    everything = {FULL: {}} | rotations
    by_context = []
    for i, context in enumerate(sorted(contexts)):
        batches = context_batches(datamodule, context, chunk)
        losses = zero_shot_losses(model, batches, everything, order)
        rows = []
        for name, r in records.items():
            ref = f"B{r['budget']:g} {reference}"
            row = {
                "name": name,
                "budget": r["budget"],
                "method": r["method"],
                "loss": token_mean(losses[name]),
            }
            row.update(_paired(losses[name], losses[ref], name == ref, reference))
            row["vs_full_rope"] = _paired(losses[name], losses[FULL], False, FULL)
            rows.append(row)
        by_context.append(
            {
                "context": context,
                "chunks": len(batches),
                "loss_full_rope": token_mean(losses[FULL]),
                "rows": rows,
            }
        )
        if progress is not None:
            progress(i + 1, len(contexts))
    return {
        **provenance_header(),  # commit, time, machine
        "chunk_tokens": chunk,
        "reference": reference,
        "contexts": sorted(contexts),
        "by_context": by_context,
    }


def contexts_markdown(result: dict[str, Any]) -> str:
    names = [r["name"] for r in result["by_context"][0]["rows"]]
    lines = [
        f"Zero-shot test loss at each context on the same text ({result['by_context'][0]['chunks']} chunks of "
        f"{result['chunk_tokens']} tokens); Δ vs full RoPE with its 95% CI over the chunks.",
        "",
        "| allocation | " + " | ".join(f"{c['context']} tokens" for c in result["by_context"]) + " |",
        "|---|" + "---|" * len(result["by_context"]),
        "| full RoPE | " + " | ".join(f"{c['loss_full_rope']:.4f}" for c in result["by_context"]) + " |",
    ]
    for name in names:
        cells = []
        for c in result["by_context"]:
            r = next(x for x in c["rows"] if x["name"] == name)
            v = r["vs_full_rope"]
            cells.append(f"{r['loss']:.4f} ({v['delta']:+.4f} [{v['ci95'][0]:+.4f}, {v['ci95'][1]:+.4f}])")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

"""The table of ``repro mla-plane``: every row's cache (elements and bf16 bytes per token), attention
FLOPs per token at each context, its zero-shot test loss at each context and, for the fine-tuned rows,
its loss after the fine-tune; differences paired over the test chunks (95 % CIs) against the source
(zero-shot: the unconverted model; fine-tuned: the unconverted model fine-tuned the same way) and
against the budget's uniform rows; the Pareto front of bytes and loss. Written atomically as
``mla_plane.{json,md,csv}`` with the scale, commit and time it came from.

A row more than ``BROKEN`` nats above its source is reported as broken and not ranked (its
differences to other rows are shown, no verdict drawn from them; it is on no Pareto front).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from repro.files import write_json_atomic, write_text_atomic
from repro.runs.provenance import provenance_header
from repro.stats import mean_interval

from .rows import SOURCE

BROKEN = 0.5  # nats above the source: a conversion this far off is broken, not ranked
BYTES_PER_ELEMENT = 2  # bf16 cache


def token_mean(chunks) -> float:
    return sum(loss * n for loss, n in chunks) / sum(n for _, n in chunks)


def paired(chunks, reference) -> dict[str, Any]:
    mean, low, high = mean_interval([a - b for (a, _), (b, _) in zip(chunks, reference)])
    verdict = "worse" if low > 0 else "better" if high < 0 else "unresolved"
    return {"delta": token_mean(chunks) - token_mean(reference), "mean_chunk_delta": mean, "ci95": [low, high],
            "verdict": verdict}  # fmt: skip


def pareto(points: dict[str, tuple[float, float]]) -> set[str]:
    """Names of the points no other point beats in both bytes and loss (and strictly in one)."""
    front = set()
    for name, (x, y) in points.items():
        if not any(
            (x2 <= x and y2 <= y) and (x2 < x or y2 < y)
            for other, (x2, y2) in points.items()
            if other != name
        ):
            front.add(name)
    return front


def write_report(plane, rows, zero_shot, finetuned, accounts, profiles, seconds: float) -> dict[str, Any]:
    settings = plane.settings
    contexts = [Path(c).stem for c in plane.contexts]
    primary = contexts[0]
    source_elements = accounts[SOURCE][primary]["total"]["kv_cache_elements"]
    records = []
    for row in [None, *rows]:
        name = SOURCE if row is None else row.name
        account = accounts[name]
        record: dict[str, Any] = {
            "name": name,
            "budget": 1.0 if row is None else row.budget,
            "method": "source" if row is None else row.method,
            "split": None if row is None else f"N{row.split.pairs} R{row.split.rank}",
            "svd": None if row is None else row.svd,
            "pair_order": None if row is None else row.order,
            "pairs_per_layer": None if row is None else list(row.pairs),
            "ranks_per_layer": None if row is None else list(row.ranks),
            "kv_elements_per_token": account[primary]["total"]["kv_cache_elements"],
            "kv_bytes_per_token": account[primary]["total"]["kv_cache_elements"] * BYTES_PER_ELEMENT,
            "kv_fraction": account[primary]["total"]["kv_cache_elements"] / source_elements,
        }
        for c in contexts:
            record[f"attention_flops_per_token@{c}"] = account[c]["total"]["attention_flops"]
            record[f"context@{c}"] = account[c]["context"]
            chunks = zero_shot[name][c]
            record[f"zero_shot_loss@{c}"] = token_mean(chunks)
            if row is not None:
                vs_source = paired(chunks, zero_shot[SOURCE][c])
                record[f"zero_shot_vs_source@{c}"] = vs_source
                record[f"zero_shot_broken@{c}"] = vs_source["delta"] > BROKEN
                main = plane.splits[row.budget][0]
                uniform = f"B{row.budget:g} uniform N{main.pairs} R{main.rank}"
                if uniform in zero_shot and uniform != name:
                    record[f"zero_shot_vs_uniform@{c}"] = paired(chunks, zero_shot[uniform][c])
        if name in finetuned:
            tuned = finetuned[name]
            record["finetuned_loss"] = token_mean(tuned["chunks"])
            record["finetune_curves"] = tuned["curves"]
            if row is not None and SOURCE in finetuned:
                record["finetuned_vs_source"] = paired(tuned["chunks"], finetuned[SOURCE]["chunks"])
                record["finetuned_broken"] = record["finetuned_vs_source"]["delta"] > BROKEN
                for base in ("uniform (weights)", "uniform"):
                    other = next((r.name for r in rows if r.budget == row.budget and r.kind == base
                                  and r.split == row.split and r.name != name), None)  # fmt: skip
                    if other in finetuned:
                        record[f"finetuned_vs_{base}"] = paired(tuned["chunks"], finetuned[other]["chunks"])
        records.append(record)
    front = pareto({r["name"]: (r["kv_bytes_per_token"], r[f"zero_shot_loss@{primary}"]) for r in records
                    if not r.get(f"zero_shot_broken@{primary}")})  # fmt: skip
    tuned_front = pareto({r["name"]: (r["kv_bytes_per_token"], r["finetuned_loss"]) for r in records
                          if "finetuned_loss" in r and not r.get("finetuned_broken")})  # fmt: skip
    for r in records:
        r["pareto_zero_shot"] = r["name"] in front
        r["pareto_finetuned"] = r["name"] in tuned_front if "finetuned_loss" in r else None
    doc = {
        "experiment": "mla-plane",
        "scale": settings.scale,
        **provenance_header(),
        "settings": settings.to_dict(),
        "source": plane.source,
        "contexts": contexts,
        "broken_threshold_nats": BROKEN,
        "bytes_per_element": BYTES_PER_ELEMENT,
        "chunks": {c: len(zero_shot[SOURCE][c]) for c in contexts},
        "finetune": {
            "steps": settings.finetune_steps,
            "lr": settings.finetune_lr,
            "batch_size": settings.finetune_batch_size,
            "seeds": list(settings.seeds),
            "config": settings.finetune_config,
        },  # fmt: skip
        "profiles": profiles,
        "command_wall_s": seconds,
        "rows": records,
    }
    out = Path(settings.out)
    write_json_atomic(out / "mla_plane.json", doc)
    write_text_atomic(out / "mla_plane.md", markdown(doc))
    write_text_atomic(out / "mla_plane.csv", flat_csv(records))
    print(markdown(doc))
    return doc


def _delta(d: dict[str, Any] | None) -> str:
    if not d:
        return ""
    return f"{d['delta']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"


def markdown(doc: dict[str, Any]) -> str:
    contexts, primary = doc["contexts"], doc["contexts"][0]
    ctx = {c: next(r[f"context@{c}"] for r in doc["rows"]) for c in contexts}
    head = ["budget", "row", "split", "KV bytes/token", f"attn FLOPs/token @{ctx[primary]}"]
    head += [f"zero-shot @{ctx[c]}" for c in contexts] + [f"Δ vs source @{ctx[c]}" for c in contexts]
    head += [
        f"Δ vs uniform @{ctx[primary]}",
        "fine-tuned",
        "Δ vs source fine-tuned",
        "Δ vs uniform fine-tuned",
        "Δ vs MHA2MLA fine-tuned",
        "front",
    ]
    chunks = ", ".join(f"{doc['chunks'][c]} chunks of {ctx[c]} tokens" for c in contexts)
    tune = doc["finetune"]
    lines = [
        f"MLA conversions of {doc['source']} ({doc['scale']}, {doc['git_commit'][:7]}, {doc['created'][:10]}): "
        f"test loss on {chunks}; Δ paired over the chunks (95% CI). Fine-tuned: {tune['steps']} steps, "
        f"lr {tune['lr']:g}, seeds {tune['seeds']}. Rows more than {doc['broken_threshold_nats']} nats above "
        "the source are broken (not ranked, nor on the front). front: on the "
        "Pareto front of bytes and loss (z: zero-shot, f: fine-tuned).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in doc["rows"]:
        cells = [f"{r['budget']:g}", r["method"], r["split"] or "-", f"{r['kv_bytes_per_token']:,}",
                 f"{r[f'attention_flops_per_token@{primary}']:,}"]  # fmt: skip
        for c in contexts:
            broken = " (broken)" if r.get(f"zero_shot_broken@{c}") else ""
            cells.append(f"{r[f'zero_shot_loss@{c}']:.4f}{broken}")
        cells += [_delta(r.get(f"zero_shot_vs_source@{c}")) for c in contexts]
        cells.append(_delta(r.get(f"zero_shot_vs_uniform@{primary}")))
        broken = " (broken)" if r.get("finetuned_broken") else ""
        cells.append(f"{r['finetuned_loss']:.4f}{broken}" if "finetuned_loss" in r else "")
        cells.append(_delta(r.get("finetuned_vs_source")))
        cells.append(_delta(r.get("finetuned_vs_uniform")))
        cells.append(_delta(r.get("finetuned_vs_uniform (weights)")))
        cells.append(
            "".join(t for t, on in (("z", r["pareto_zero_shot"]), ("f", r["pareto_finetuned"])) if on)
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def flat_csv(records: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    flat_rows = []
    for r in records:
        flat: dict[str, Any] = {}
        for k, v in r.items():
            if isinstance(v, dict):
                flat[f"{k}.delta"], flat[f"{k}.ci_low"], flat[f"{k}.ci_high"] = v["delta"], *v["ci95"]
            elif k != "finetune_curves":
                flat[k] = " ".join(map(str, v)) if isinstance(v, list) else v
        flat_rows.append(flat)
        keys += [k for k in flat if k not in keys]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(flat_rows)
    return buffer.getvalue()

"""The files of Table 1: markdown (what the README pastes), csv (one row per method) and json
(everything, written last: its presence marks a finished table)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from repro.files import write_text_atomic
from repro.stats import ALPHA, CI_LABEL, CONFIDENCE

from .rows import ArchCells, Table1Row

ARCH_TITLE = {"mha": "fixed width (MHA)", "mla": "MLA"}


def _fmt(value: float | None, digits: int = 4, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _pm(mean: float, std: float | None, signed: bool = False) -> str:
    return _fmt(mean, signed=signed) + (f" ± {std:.4f}" if std is not None else "")


def _ci(c: ArchCells) -> str:
    delta = _fmt(c.delta_vs_uniform, signed=True)
    return delta if c.delta_ci_low is None else f"{delta} [{c.delta_ci_low:+.4f}, {c.delta_ci_high:+.4f}]"


def _p(c: ArchCells) -> str:
    if c.p_holm is None:
        return "-"
    return f"**{c.p_holm:.3f}**" if c.resolved else f"{c.p_holm:.3f}"


def to_markdown(doc: dict[str, Any]) -> str:
    archs = list(doc["architectures"])
    a0 = doc["architectures"][archs[0]]
    rows = [Table1Row.from_record(r, archs) for r in doc["rows"]]
    lines = [
        "# Table 1: validation loss of budget-matched RoPE allocations trained from scratch",
        "",
        f"Scale `{doc['scale']}`, commit `{doc['git_commit']}`, created {doc['created']}, "
        f"wall time of this call {doc['wall_s'] / 60:.1f} min ({doc['runs_trained']} runs trained, "
        f"{doc['runs_reused']} reused); the {doc['runs_total']} runs took {doc['training_s_summed'] / 60:.1f} min "
        f"of training summed over runs ({doc['settings']['workers']} side by side).",
        f"Every row trained for seeds {doc['seeds']} ({a0['steps']} steps, {a0['tokens_per_run']:,} tokens per run); "
        "loss = final validation loss (mean ± std over seeds); Δ = paired difference to `uniform` (mean over seeds, "
        f"{CONFIDENCE:.0%} CI); p = paired t-test, Holm-corrected over the rows of each half; **bold**: resolved "
        f"(p < {ALPHA:g}).",
    ]
    for arch in archs:
        a = doc["architectures"][arch]
        lv = a["levels"]
        lines.append(
            f"{ARCH_TITLE[arch]}: target `{a['target_config']}` ({a['target_layers']} layers), source "
            f"`{a['source_config']}` ({a['source_layers']} layers); high={lv['high']:g}, low={lv['low']:g}, "
            f"B={lv['budget']:g} ({lv['unit']}), k={a['k']} high layers; profiles of {a['profile_steps']} steps."
        )
    lines.append("")
    head = ["method"]
    for arch in archs:
        t = "MHA" if arch == "mha" else "MLA"
        head += [f"{t} high layers", f"{t} val loss", f"{t} Δ vs uniform [{CI_LABEL}]", "p (Holm)"]
    if "mla" in archs:
        head += ["MLA KV elems/token"]
    head += ["RoPE FLOPs/token (" + " / ".join(a.upper() for a in archs) + ")"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.method + ("" if row.budget_matched else " †")]
        for c in row.cells.values():
            cells += [
                c.high_layers,
                _pm(c.loss_mean, c.loss_std),
                "-" if row.is_reference else _ci(c),
                "-" if row.is_reference else _p(c),
            ]
        if "mla" in archs:
            cells.append(f"{row.cells['mla'].kv_elements_per_token:,}")
        cells.append(" / ".join(f"{c.rope_flops_per_token:,}" for c in row.cells.values()))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "† reference point, not budget-matched (different total rotary width).", ""]
    lines += ["## What the seeds can resolve", ""]
    for arch in archs:
        st = doc["architectures"][arch]["statistics"]
        resolved = [r.method for r in rows if r.cells[arch].resolved and r.budget_matched]
        if st["paired_diff_std"] is None:
            lines.append(f"- {ARCH_TITLE[arch]}: one seed; no difference can be resolved.")
            continue
        lines.append(
            f"- {ARCH_TITLE[arch]}: seed-to-seed std {_fmt(st['seed_std'])}, std of the paired differences "
            f"{_fmt(st['paired_diff_std'])}; with {st['seeds']} seeds a difference of "
            f"{_fmt(st['detectable_difference'])} nats is detected with {st['power']:.0%} power; detecting "
            f"{st['target_difference']:g} nats needs about {st['seeds_for_target']} seeds. Budget-matched rows "
            f"resolved against uniform: {', '.join(resolved) if resolved else 'none'}."
        )
    if doc.get("float_spread"):
        lines += [
            "",
            "Float-level spread (the uniform row of every seed retrained; differences to the table's runs):",
            "",
        ]
        for arch, variants in doc["float_spread"].items():
            for variant, v in variants.items():
                diffs = ", ".join(f"{d:+.4f}" for d in v["difference"])
                lines.append(
                    f"- {ARCH_TITLE[arch]}, {variant} ({v['cpu_capability']}, {v['torch_threads']} thread(s)): "
                    f"{diffs}; max |Δ| {v['max_abs_difference']:.4f}"
                )
        lines += ["", "Resolved marks with each variant's uniform losses in place of the table's:", ""]
        for arch in doc["float_spread"]:
            flips = [r.method for r in rows if r.cells[arch].mark_holds_under_float_spread is False]
            held = [
                r.method
                for r in rows
                if r.cells[arch].resolved and r.cells[arch].mark_holds_under_float_spread
            ]
            lines.append(
                f"- {ARCH_TITLE[arch]}: marks that hold: {', '.join(held) or 'none resolved'}; "
                f"marks that flip: {', '.join(flips) or 'none'}"
            )
    lines += ["", "## Analysis", ""]
    for arch in archs:
        an = doc["architectures"][arch]["analysis"]
        tf = an["transfer_fidelity"]
        parts = [
            f"phase-off vs coverage-benefit Spearman {_fmt(an['phase_off_vs_benefit_spearman'], 2)}",
            f"transfer fidelity: Spearman {_fmt(tf['spearman'], 2)}, "
            f"top-{tf['top_k']} Jaccard {_fmt(tf['jaccard'], 2)} "
            f"(transferred {tf['top_k_transferred']} vs direct {tf['top_k_direct']})",
        ]
        if an.get("profile_seed_stability"):
            parts.append(
                f"profile seed stability (Spearman) {_fmt(an['profile_seed_stability']['mean_spearman'], 2)}"
            )
        if an.get("calibration"):
            c = an["calibration"]
            parts.append(
                f"calibration over {c['n']} allocations: slope {_fmt(c['slope'], 2)}, Spearman {_fmt(c['spearman'], 2)}"
            )
        if an["interactions"]:
            parts.append(
                "interactions: "
                + ", ".join(f"{t['layers']} {t['interaction']:+.4f}" for t in an["interactions"])
            )
        lines.append(f"- {ARCH_TITLE[arch]}: " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


def to_csv(doc: dict[str, Any]) -> str:
    rows = [{"scale": doc["scale"], "git_commit": doc["git_commit"], **r} for r in doc["rows"]]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(
            {k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in r.items()}
        )
    return buf.getvalue()


def write_table(doc: dict[str, Any], out: Path) -> None:
    """table1.json, .csv, .md, each atomically (the json last: it marks a finished table)."""
    write_text_atomic(out / "table1.md", to_markdown(doc))
    write_text_atomic(out / "table1.csv", to_csv(doc))
    write_text_atomic(out / "table1.json", json.dumps(doc, indent=2, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")

"""The Clapping table (md, csv, json) from the runs' results.

One row per (regime, method, compressor, p): final validation loss (mean +- std over seeds), its
paired difference to ``none`` of the same regime (95 % CI, paired t-test, Holm-corrected over the
regime's rows), total bytes sent (mean over seeds), compression ratio against ``none`` of the same
seed, the bytes needed to reach a target loss (``none``'s final loss + ``target_margin``), the
largest buffer memory of a rank, training wall time, and the emulated network time at
``bandwidth_mbps`` (the busiest rank's bytes x 8 / bandwidth). Then the paper's claims as this
scale can test them: resolved, failed, or unresolved.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

from repro.files import write_json_atomic, write_text_atomic
from repro.runs.provenance import git_commit, machine, now
from repro.stats import ALPHA, CI_LABEL, ITSELF, mean_std, paired_comparison, power_figures, with_holm

from .link_times import with_link_times
from .settings import ClappingSettings
from .table_rows import CSV_COLUMNS, TableRow


def bytes_at_loss(run: dict[str, Any], target: float) -> float | None:
    """Bytes sent by the first evaluation at or below ``target`` (None: never reached)."""
    for (_, loss), sent in zip(run["val_curve"], run["val_bytes"] or []):
        if loss <= target:
            return sent
    return None


def row_key(run: dict[str, Any]) -> tuple[str, str, float, str]:
    """The table row of a run: (method, compressor, p, tied-sum compressor)."""
    return run["method"], run["compressor"], run["p"], run.get("tied_compressor", "identity")


def is_none(run: dict[str, Any]) -> bool:
    """A run of the reference row: none, with the exact tied sum."""
    return row_key(run)[0] == "none" and row_key(run)[3] == "identity"


def regime_rows(settings: ClappingSettings, regime: str, runs: list[dict[str, Any]]) -> list[TableRow]:
    none = {r["seed"]: r for r in runs if is_none(r)}
    seeds = sorted(none)
    target = statistics.fmean(r["final_val_loss"] for r in none.values()) + settings.target_margin
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(row_key(r), []).append(r)
    compared = with_holm(
        {
            key: paired_comparison(
                [next(r for r in g if r["seed"] == s)["final_val_loss"] for s in seeds],
                [none[s]["final_val_loss"] for s in seeds],
            )
            for key, g in groups.items()
            if not is_none(g[0])
        }
    )
    rows = []
    for (method, compressor, p, tied), group in groups.items():
        loss, loss_std = mean_std([r["final_val_loss"] for r in group])
        ratios = [
            r["bytes_total"] / none[r["seed"]]["bytes_total"] for r in group if none[r["seed"]]["bytes_total"]
        ]
        reached = [b for b in (bytes_at_loss(r, target) for r in group) if b is not None]
        c = compared.get((method, compressor, p, tied), ITSELF)
        rows.append(
            TableRow(
                *(regime, method, compressor, p, loss, loss_std),
                *(c.mean, c.ci_low, c.ci_high, c.p, c.p_holm, c.resolved),
                bytes_total=statistics.fmean(r["bytes_total"] for r in group),
                compression_ratio=statistics.fmean(ratios) if ratios else None,
                bytes_to_target=statistics.fmean(reached) if len(reached) == len(group) else None,
                reached_target=f"{len(reached)}/{len(group)}",
                buffer_bytes_max_rank=max(max(r["buffer_bytes_per_rank"]) for r in group),
                train_wall_s=statistics.fmean(r["train_wall_s"] for r in group),
                emulated_net_s=statistics.fmean(
                    max(r["bytes_sent_per_rank"]) * 8 / (settings.bandwidth_mbps * 1e6) for r in group
                ),
                seeds=sorted(r["seed"] for r in group),
                seed_losses=[r["final_val_loss"] for r in sorted(group, key=lambda r: r["seed"])],
                tied_compressor=tied,
            )
        )
    return rows


def claims(settings: ClappingSettings, rows: list[TableRow]) -> list[dict[str, str]]:
    """The paper's claims as this scale can test them."""
    out = []
    ft = [r for r in rows if r.regime == "finetune"] or rows
    small = [r for r in ft if r.compression_ratio is not None and r.compression_ratio <= 0.05]
    if not small:
        best = min((r for r in ft if r.compression_ratio), key=lambda r: r.compression_ratio, default=None)
        verdict = "fails at this byte accounting" if best else "untested"
        detail = (
            (
                f"no row sends 5 % of none's bytes or less; the smallest ratio is {best.compression_ratio:.3f} "
                f"({best.method} {best.label} p={best.p:g})"
            )
            if best
            else "no compressed row"
        )
    else:
        within = [
            r for r in small if r.delta_ci_high is not None and r.delta_ci_high <= settings.minimal_loss
        ]
        beyond = [r for r in small if r.delta_ci_low is not None and r.delta_ci_low > settings.minimal_loss]
        verdict = "holds" if within else "fails" if len(beyond) == len(small) else "unresolved"
        detail = ", ".join(
            f"{r.method} {r.label} p={r.p:g}: ratio {r.compression_ratio:.3f}, Δ "
            f"{r.delta_vs_none:+.4f} [{r.delta_ci_low:+.4f}, {r.delta_ci_high:+.4f}]"
            for r in small
            if r.delta_ci_low is not None
        )
    out.append(
        {
            "claim": f"up to 95% less communication with minimal loss (at most {settings.minimal_loss:g} nats "
            "over none, by the CI)",
            "regime": "finetune",
            "verdict": verdict,
            "detail": detail,
        }
    )
    for method in ("clapping_fc", "clapping_fu"):
        for compressor in sorted({r.label for r in ft if r.method == method}):
            by_p = {r.p: r for r in ft if r.method == method and r.label == compressor}
            if 1.0 not in by_p or len(by_p) < 2:
                continue
            tests = with_holm(
                {
                    p: paired_comparison(by_p[p].seed_losses, by_p[1.0].seed_losses)
                    for p in sorted(by_p)
                    if p < 1.0 and by_p[p].seeds == by_p[1.0].seeds
                }
            )
            better = [p for p, c in tests.items() if c.resolved and c.mean < 0]
            worse = [p for p, c in tests.items() if c.resolved and c.mean > 0]
            verdict = "holds" if better else "fails" if tests and len(worse) == len(tests) else "unresolved"
            detail = "; ".join(
                f"p={p:g}: {by_p[p].val_loss:.4f} vs p=1 {by_p[1.0].val_loss:.4f}, Δ {c.mean:+.4f}"
                + (
                    f" [{c.ci_low:+.4f}, {c.ci_high:+.4f}], Holm p {c.p_holm:.3f}"
                    if c.ci_low is not None
                    else ""
                )
                + f", bytes ratio {by_p[p].compression_ratio:.3f} vs {by_p[1.0].compression_ratio:.3f}"
                for p, c in tests.items()
            )
            out.append(
                {
                    "claim": f"lazy sampling (p < 1) lowers the loss of {method} with {compressor} at equal steps",
                    "regime": "finetune",
                    "verdict": verdict,
                    "detail": detail,
                }
            )
    return out


def _pm(mean: float, std: float | None) -> str:
    return f"{mean:.4f}" + ("" if std is None else f" ± {std:.4f}")


def build_report(
    settings: ClappingSettings,
    runs: list[dict[str, Any]],
    memory: list[dict[str, Any]],
    quantizer_errors: list[dict[str, Any]] | None,
    *,
    dataset_sizes: dict[str, int],
    wall_s: float,
    trained_runs: int,
    model_config: str,
    base: dict[str, Any] | None,
    link_times: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``runs``: one flat record per run (row, seed, loss, bytes); ``link_times``: measured step
    times on shaped links by run label (``link_times.measure_link_times``), or None."""
    rows, power = [], {}
    for regime in settings.regimes:
        regime_runs = [r for r in runs if r["regime"] == regime]
        rows += regime_rows(settings, regime, regime_runs)
        none = sorted((r for r in regime_runs if is_none(r)), key=lambda r: r["seed"])
        diffs, groups = [], []
        for key in {row_key(r) for r in regime_runs if not is_none(r)}:
            group = sorted(
                (r for r in regime_runs if row_key(r) == key),
                key=lambda r: r["seed"],
            )
            diffs.append([a["final_val_loss"] - b["final_val_loss"] for a, b in zip(group, none)])
            groups.append([r["final_val_loss"] for r in group])
        power[regime] = power_figures(diffs, groups, len(settings.seeds), settings.minimal_loss)
    rows = with_link_times(rows, link_times)
    return {
        "scale": settings.scale,
        "git_commit": git_commit(),
        "created": now(),
        "machine": machine(),
        "settings": settings.as_dict(),
        "model_config": model_config,
        "seeds": list(settings.seeds),
        "dataset_sizes": dataset_sizes,
        "bandwidth_mbps": settings.bandwidth_mbps,
        "link": None
        if link_times is None
        else {
            "timed_steps": settings.link_steps,
            "warmup_steps": settings.link_warmup_steps,
            "repeats": settings.link_repeats,
        },
        "wall_s": wall_s,
        "total_runs": len(runs) + (base is not None),  # the rows and the base model
        "trained_runs": trained_runs,
        "base": base,
        "rows": [r.record() for r in rows],  # flat records at the file boundary
        "claims": claims(settings, rows),
        "statistics": power,
        "quantizer_errors": quantizer_errors,
        "memory": memory,
        "runs": runs,
    }


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1000
    return f"{n:.1f} GB"


def _delta(r: TableRow) -> str:
    if r.is_reference:
        return "-"
    if r.delta_ci_low is None:
        return f"{r.delta_vs_none:+.4f}"
    text = f"{r.delta_vs_none:+.4f} [{r.delta_ci_low:+.4f}, {r.delta_ci_high:+.4f}]"
    return f"**{text}**" if r.resolved else text


LINK_HEAD = " measured s/step on the shaped link | measured speed-up vs none [95% CI] (Amdahl bound) |"


def _link_cells(r: TableRow) -> str:
    m = r.link
    if m is None:
        return " - | - |"
    ci = m.get("speedup_ci")
    speedup = f"{m['speedup']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
    return f" {m['step_s']:.3f} | {speedup} ({m['speedup_bound']:.2f}) |"


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    rows = [TableRow.from_record(r) for r in report["rows"]]
    lines = [
        f"# Clapping (scale `{report['scale']}`): every method, compressor and p against none, "
        "pipeline-parallel with compressed messages",
        "",
    ]
    for regime in s["regimes"]:
        grid = s[regime]
        lines += [
            f"### Regime `{regime}` ({grid['steps']} steps, N = {report['dataset_sizes'][regime]} training samples)",
            "",
            f"| method | compressor | p | val loss | Δ vs none [{CI_LABEL}] | p (Holm) | total bytes | ratio vs none "
            "| bytes to target | buffer / rank (max) | train wall (s) "
            f"| link-time bound at {report['bandwidth_mbps']:g} Mbps (s) |"
            + LINK_HEAD
            * bool(report.get("link")),
            "|" + "---|" * (12 + 2 * bool(report.get("link"))),
        ]
        for r in (r for r in rows if r.regime == regime):
            ratio = "-" if r.compression_ratio is None else f"{r.compression_ratio:.3f}"
            p_holm = "-" if r.p_holm is None else f"{r.p_holm:.3f}"
            lines.append(
                f"| {r.method} | {r.label} | {r.p:g} | {_pm(r.val_loss, r.val_loss_std)} | "
                f"{_delta(r)} | {p_holm} | {_fmt_bytes(r.bytes_total)} | {ratio} | "
                f"{_fmt_bytes(r.bytes_to_target)} ({r.reached_target}) | "
                f"{_fmt_bytes(r.buffer_bytes_max_rank)} | "
                f"{r.train_wall_s:.1f} | {r.emulated_net_s:.2f} |"
                + (_link_cells(r) if report.get("link") else "")
            )
        st = report["statistics"][regime]
        if st["paired_diff_std"] is not None:
            lines += [
                "",
                f"Seeds {report['seeds']}: std of the paired differences {st['paired_diff_std']:.4f}; a difference of "
                f"{st['detectable_difference']:.4f} nats is detected with {st['power']:.0%} power; "
                f"{st['target_difference']:g} nats would need about {st['seeds_for_target']} seeds.",
            ]
        lines.append("")
    lines += [
        f"Scale `{report['scale']}`, K = {s['stages']} stages, M = {s['micro_batches']} micro-batches, seeds "
        f"{report['seeds']}, model `{report['model_config']}`, commit `{report['git_commit']}`. Loss: last "
        f"evaluation, mean ± std over seeds; Δ paired by seed, **bold**: resolved (Holm p < {ALPHA:g}); bytes to "
        f"target: bytes sent by the first evaluation within {s['target_margin']:g} nats of none's final loss "
        "(mean over seeds, when every seed got there); link-time bound: the busiest rank's bytes x 8 / "
        "bandwidth, computed from the bytes, not measured"
        + (
            f"; measured: {report['link']['timed_steps']} steps of each row's method after "
            f"{report['link']['warmup_steps']} untimed, its K ranks in K network namespaces joined by veth links "
            f"shaped to {report['bandwidth_mbps']:g} Mbit/s (tc tbf), on the bench's synthetic tokens at this "
            f"model's shape, {report['link'].get('repeats', 1)} interleaved repeat(s) (the CI with 2 or more); "
            "the Amdahl bound from none's compute (its ranks' CPU time per step in the same run) and link time."
            if report.get("link")
            else " (`repro clapping --link_steps N` measures each row's step time on real shaped links)."
        ),
        "",
    ]
    lines += ["Claims:", ""] + [
        f"- {c['claim']} ({c['regime']}): **{c['verdict']}**; {c['detail']}." for c in report["claims"]
    ]
    if report.get("quantizer_errors"):
        lines += [
            "",
            "Relative error ||C(x) - x|| / ||x|| of quant on real boundary messages of the base model:",
            "",
            "| direction | grid | " + " | ".join(f"{b} bits" for b in s["quant_error_bits"]) + " |",
            "|" + "---|" * (2 + len(s["quant_error_bits"])),
        ]
        for direction in ("fwd", "bwd"):
            for grid in ("fixed", "span"):
                cells = [
                    f"{e['relative_error']:.3f}"
                    for e in report["quantizer_errors"]
                    if e["direction"] == direction and e["grid"] == grid
                ]
                lines.append(f"| {direction} | {grid} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: Path) -> None:
    """md, csv, then json (written last: its presence marks a finished table)."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "clapping_table.md", markdown(report))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in report["rows"]:
        writer.writerow(TableRow.from_record(r).csv_record())
    write_text_atomic(out / "clapping_table.csv", buf.getvalue())
    write_json_atomic(out / "clapping_table.json", report)

"""The Clapping table (md, csv, json) from the runs' results.

One row per (method, compressor, p): final validation loss (mean +- std over seeds), total bytes
sent (mean over seeds), compression ratio against ``none`` of the same seed, the largest buffer
memory of a rank, training wall time, and the emulated network time at ``bandwidth_mbps``: the
busiest rank's bytes x 8 / bandwidth (a lower bound on the time a link of that speed needs).
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

from repro.files import write_json_atomic, write_text_atomic
from repro.runs.provenance import git_commit, machine, now

from .settings import ClappingSettings

COLUMNS = (
    "method",
    "compressor",
    "p",
    "val_loss",
    "val_loss_std",
    "bytes_total",
    "compression_ratio",
    "buffer_bytes_max_rank",
    "train_wall_s",
    "emulated_net_s",
    "seeds",
)


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def build_report(
    settings: ClappingSettings,
    results: list[dict[str, Any]],
    memory: list[dict[str, Any]],
    *,
    seeds,
    dataset_size: int,
    wall_s: float,
    trained_runs: int,
    model_config: str,
) -> dict[str, Any]:
    """``results``: one flat record per run (row, seed, loss, bytes); ``memory``: the memory figure's points."""
    none_bytes = {r["seed"]: r["bytes_total"] for r in results if r["method"] == "none"}
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["method"], r["compressor"], r["p"]), []).append(r)
    rows = []
    for (method, compressor, p), runs in groups.items():
        loss, loss_std = _mean_std([r["final_val_loss"] for r in runs])
        ratios = [r["bytes_total"] / none_bytes[r["seed"]] for r in runs if none_bytes.get(r["seed"])]
        emulated = [max(r["bytes_sent_per_rank"]) * 8 / (settings.bandwidth_mbps * 1e6) for r in runs]
        rows.append(
            {
                "method": method,
                "compressor": compressor,
                "p": p,
                "val_loss": loss,
                "val_loss_std": loss_std,
                "bytes_total": statistics.fmean(r["bytes_total"] for r in runs),
                "compression_ratio": statistics.fmean(ratios) if ratios else None,
                "buffer_bytes_max_rank": max(max(r["buffer_bytes_per_rank"]) for r in runs),
                "train_wall_s": statistics.fmean(r["train_wall_s"] for r in runs),
                "emulated_net_s": statistics.fmean(emulated),
                "seeds": sorted(r["seed"] for r in runs),
            }
        )
    return {
        "scale": settings.scale,
        "git_commit": git_commit(),
        "created": now(),
        "machine": machine(),
        "settings": settings.as_dict(),
        "model_config": model_config,
        "seeds": list(seeds),
        "dataset_size": dataset_size,
        "bandwidth_mbps": settings.bandwidth_mbps,
        "wall_s": wall_s,
        "total_runs": len(results),
        "trained_runs": trained_runs,
        "rows": rows,
        "memory": memory,
        "runs": results,
    }


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1000
    return f"{n:.1f} GB"


def markdown(report: dict[str, Any]) -> str:
    head = (
        "| method | compressor | p | val loss | total bytes | ratio vs none | buffer / rank (max) | "
        f"train wall (s) | emulated {report['bandwidth_mbps']:g} Mbps (s) |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in report["rows"]:
        ratio = "-" if r["compression_ratio"] is None else f"{r['compression_ratio']:.3f}"
        lines.append(
            f"| {r['method']} | {r['compressor']} | {r['p']:g} | {r['val_loss']:.4f} ± {r['val_loss_std']:.4f} | "
            f"{_fmt_bytes(r['bytes_total'])} | {ratio} | {_fmt_bytes(r['buffer_bytes_max_rank'])} | "
            f"{r['train_wall_s']:.1f} | {r['emulated_net_s']:.2f} |"
        )
    s = report["settings"]
    lines.append("")
    lines.append(
        f"Scale `{report['scale']}`, K = {s['stages']} stages, M = {s['micro_batches']} micro-batches, "
        f"{s['steps']} steps, seeds {report['seeds']}, N = {report['dataset_size']} training samples, "
        f"model `{report['model_config']}`, commit `{report['git_commit']}`. Validation loss: last "
        f"evaluation, mean ± std over seeds. Emulated time: the busiest rank's bytes x 8 / bandwidth."
    )
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "clapping_table.md", markdown(report))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    for r in report["rows"]:
        writer.writerow({**r, "seeds": " ".join(str(s) for s in r["seeds"])})
    write_text_atomic(out / "clapping_table.csv", buf.getvalue())
    write_json_atomic(out / "clapping_table.json", report)

"""``make bench`` / ``repro bench``: speed, communication and memory of the suite measured side by
side with the alternatives a user would pick (a plain PyTorch loop, torch.distributed.pipelining,
one process), on this machine, in one run. Writes ``results/bench/bench.json`` (atomically) and
``bench.md``, and prints the table. Every timed row is a median over interleaved repeats, with
min..max, and the median of the per-repeat ratios to its reference."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from repro.files import table_head, write_report
from repro.runs.build import quiet_lightning
from repro.runs.provenance import git_commit, machine, now

from .compile_section import bench_compile
from .compressor_bench import bench_compressors
from .data_section import bench_data
from .hf_section import bench_hf
from .link_section import bench_link
from .measure import all_finite
from .memory_bench import bench_memory
from .pipeline_sections import bench_network, bench_pipeline, bench_scale
from .settings import PRESETS, SECTIONS, BenchSettings, load_settings
from .single_process import bench_lightning, bench_rope


def _progress_printer(quiet: bool, start: float) -> Callable[[str], None]:
    def progress(message: str) -> None:
        if not quiet:
            print(f"[bench {time.perf_counter() - start:6.0f}s] {message}", file=sys.stderr, flush=True)

    return progress


def run_bench(s: BenchSettings, out: Path, quiet: bool = False) -> dict[str, Any]:
    start = time.perf_counter()
    progress = _progress_printer(quiet, start)
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    store: dict[str, Any] = {}
    sections: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "lightning": lambda: bench_lightning(s, progress),
        "rope": lambda: bench_rope(s, progress),
        "compile": lambda: bench_compile(s, progress),
        "pipeline": lambda: bench_pipeline(s, progress, store),
        "compressors": lambda: bench_compressors(s, progress),
        "network": lambda: bench_network(s, progress),
        "memory": lambda: bench_memory(s, progress, store),
        "scale": lambda: bench_scale(s, progress, store),
        "data": lambda: bench_data(s, progress),
        "hf": lambda: bench_hf(s, progress),
        "link": lambda: bench_link(s, progress),
    }
    rows: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}
    for name in SECTIONS:  # fixed order: memory and scale reuse the pipeline section's runs
        if name not in s.sections:
            continue
        t0 = time.perf_counter()
        rows.extend(sections[name]())
        seconds[name] = time.perf_counter() - t0
    report = {
        "preset": s.preset,
        "git_commit": git_commit(),
        "created": now(),
        "machine": {**machine(cores), "cpus": cores},
        "settings": s.as_dict(),
        "section_seconds": seconds,
        "wall_s": time.perf_counter() - start,
        "rows": rows,
    }
    if not all_finite(report):
        raise RuntimeError("a benchmark produced a non-finite number; bench.json was not written")
    write_report(out, "bench", report, format_table(report))  # bench.json last: the run finished
    return report


def _fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.1f} {name}"
        return f"{value:.0f} B"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return f"{value:.3g}"


def _note(r: dict[str, Any]) -> str:
    sec = r["section"]
    if sec == "compressors":
        ok = "ok" if r["bytes_goal_met"] else "MISSED"
        t = "ok" if r["time_goal_met"] else "MISSED"
        return (
            f"ratio {r['compression_ratio']:.3f}; bytes {r['achieved_bytes']} vs {r['analytical_bytes']} ({ok}); "
            f"codec {r['codec_s'] * 1e3:.2f} ms vs link saves {r['link_saved_s'] * 1e3:.1f} ms ({t})"
        )
    if sec == "network":
        out = f"ratio {r['compression_ratio']:.3f}; link {r['link_time_per_step_s']:.3f} s/step"
        if r.get("reference"):
            out += f"; bound 1/ratio {r['speedup_bound_1_over_ratio']:.2f}, Amdahl {r['speedup_bound_amdahl']:.2f}"
        return out
    if sec == "link":
        out = (
            f"{r['fraction_of_limit']:.2f} of the limit {r['limit_s']:.3f} s (uplink {r['link_s_per_step']:.3f} s, "
            f"compute {r['compute_s_per_step']:.3f} s); {r['fraction_of_limit_with_fill']:.2f} with the fill"
        )
        if r.get("reference"):
            out += f"; serial bound {r['speedup_bound_amdahl']:.2f}"
        return out
    if sec == "scale":
        return f"{r['bytes_per_step'] / 2**20:.2f} MiB sent per step"
    if sec == "memory" and "analytical_bytes" in r:
        return f"analytical {_fmt(r['analytical_bytes'], 'bytes')}"
    if sec == "rope":
        return f"{r['params']:,} params"
    if sec == "compile":
        out = f"{r['device']}: {r['step_s'] * 1e3:.1f} ms/step, {r['tflops_per_s']:.3g} TFLOP/s"
        if r.get("mfu") is not None:
            out += f" (MFU {100 * r['mfu']:.0f}%)"
        if r["peak_memory_bytes"]:
            out += f", peak {r['peak_memory_bytes'] / 2**30:.1f} GiB"
        return out + f"; first steps up to {r['warmup_s']:.0f} s (untimed)"
    return ""


def format_table(report: dict[str, Any]) -> str:
    title = (
        f"Benchmark `{report['preset']}` at commit {report['git_commit']}, {report['created']}, "
        f"{report['machine']['cpus']} CPUs, torch {report['machine']['torch']}, {report['wall_s'] / 60:.1f} min."
    )
    ratio_column = "ratio (median, min..max; 95% CI of the mean)"
    columns = ["section", "row", "median", "min..max", "n", ratio_column, "goal", "notes"]
    lines = table_head(title, columns)
    for r in report["rows"]:
        unit = r["unit"]
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f} ({r['ratio_min']:.3f}..{r['ratio_max']:.3f})"
        if r.get("ratio_ci_low") is not None:
            ratio += f"; CI {r['ratio_ci_low']:.3f}..{r['ratio_ci_high']:.3f}"
        goal = ""
        if r["goal"] is not None:
            goal = f"{'>=' if r['goal_kind'] == 'min' else '<='} {r['goal']:g}: {'met' if r['goal_met'] else 'MISSED'}"
            if r.get("goal_resolved") is False:
                goal += " (unresolved: the CI spans the goal)"
        lines.append(
            f"| {r['section']} | {r['name']} | {_fmt(r['median'], unit)} {'' if unit == 'bytes' else unit} | "
            f"{_fmt(r['min'], unit)}..{_fmt(r['max'], unit)} | {r['repeats']} | {ratio} | {goal} | {_note(r)} |"
        )
    lines.append("")
    lines.append(
        "Ratios are medians of per-repeat ratios (the repeats are interleaved), with the 95% CI of their mean "
        "(Student t); a goal is unresolved when that CI spans it. What each ratio is:"
    )
    lines.append("")
    seen = set()
    for r in report["rows"]:
        key = (r["section"], r.get("ratio_meaning"))
        if r.get("ratio_meaning") and key not in seen:
            seen.add(key)
            lines.append(f"- {r['section']}: {r['ratio_meaning']}")
    links = [r for r in report["rows"] if r["section"] == "link"]
    if links:
        lines += ["", link_table(links)]
    return "\n".join(lines).rstrip() + "\n"


def link_table(rows: list[dict[str, Any]]) -> str:
    """The link rows against their physical limit (docs/performance.md's table); placement: where the
    embedding ran (ours: as run, ``auto``'s choice included; torch's V schedules: v)."""
    lines = [
        "| K | rate | run | placement | schedule, M | step (s) | busiest uplink on the wire (MB/step) | counted by the "
        "strategy (MB/step) | its link time (s) | compute (s) | limit (s) | fraction of the limit | with the fill "
        "| speed-up over none [95% CI] | serial bound |",
        "|" + "---|" * 15,
    ]
    for r in rows:
        speedup = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        if r.get("ratio_ci_low") is not None:
            speedup += f" [{r['ratio_ci_low']:.2f}, {r['ratio_ci_high']:.2f}]"
        bound = f"{r['speedup_bound_amdahl']:.2f}" if r["ratio"] is not None else ""
        counted = r.get("uplink_bytes_per_step")
        counted = "-" if counted is None else f"{max(counted) / 1e6:.3f}"
        lines.append(
            f"| {r['stages']} | {r['rate_mbit']:g} Mbit/s | {r['name'].split(' @ ')[0]} | "
            f"{r.get('placement') or '-'} | {r['schedule']}, {r['micro_batches']} | {r['median']:.3f} | "
            f"{max(r['wire_bytes_per_step']) / 1e6:.3f} | {counted} | "
            f"{r['link_s_per_step']:.3f} | {r['compute_s_per_step']:.3f} | {r['limit_s']:.3f} | "
            f"**{r['fraction_of_limit']:.2f}** | {r['fraction_of_limit_with_fill']:.2f} | {speedup} | {bound} |"
        )
    return "\n".join(lines)


def bench(
    preset: Literal[PRESETS] | None = None,
    settings: str | None = None,
    sections: tuple[Literal[SECTIONS], ...] | None = None,
    out: Path = Path("results/bench"),
    quiet: bool = False,
) -> int:
    """Speed, communication and memory of the suite's parts (make bench).

    Args:
        preset: the shipped settings (default full)
        settings: a settings YAML instead of --preset
        sections: run only these sections (default: the settings')
        out: results directory
        quiet: no progress lines
    """
    quiet_lightning()
    if preset and settings:
        raise ValueError("give at most one of --preset or --settings")
    chosen = load_settings(settings or preset or "full")
    if sections:
        chosen = dataclasses.replace(chosen, sections=tuple(sections))
    report = run_bench(chosen, out, quiet)
    print((out / "bench.md").read_text())
    print(f"[bench] wrote {out / 'bench.json'} in {report['wall_s'] / 60:.1f} min", file=sys.stderr)
    return 0

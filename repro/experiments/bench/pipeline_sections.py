"""The pipeline sections of ``make bench``: throughput against torch.distributed.pipelining and
one process, the emulated slow network, and the growth of step time and bytes with K and T."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from .measure import pairwise, row
from .pipelines import clapping_run, one_process_run
from .settings import BenchSettings
from .versus_torch import OURS, paired_runs, versus_torch_rows
from .workload import gpt_config


def bench_pipeline(
    s: BenchSettings, progress: Callable[[str], None], store: dict[str, Any]
) -> list[dict[str, Any]]:
    cfg = gpt_config(s)
    tokens = s.batch_size * s.block_size
    one: list[float] = []
    ours: dict[int, list[dict]] = {k: [] for k in s.stages}
    ref: dict[int, list[dict]] = {k: [] for k in s.stages}
    for r in range(s.pipe_repeats):
        progress(f"pipeline: repeat {r + 1} of {s.pipe_repeats}: one process")
        one.append(one_process_run(cfg, s, seed=r)["step_s"])
        for k in s.stages:
            progress(
                f"pipeline: repeat {r + 1} of {s.pipe_repeats}: K={k} clapping and torch.distributed.pipelining, "
                f"taking turns"
            )
            mine, theirs = paired_runs(cfg, s, k, seed=r)
            ours[k].append(mine)
            ref[k].append(theirs)
    store["pipeline"] = {"ours": ours, "torch": ref, "one_process_step_s": one}
    one_tps = [tokens / t for t in one]
    rows = [row("pipeline", "one process (Lightning, all cores)", "throughput", "tokens/s", one_tps)]
    for k in s.stages:
        rows += versus_torch_rows("pipeline", "", k, tokens, ours[k], ref[k])
        ours_tps = [tokens / x["step_s"] for x in ours[k]]
        rows.append(
            row(
                "pipeline",
                f"{OURS} K={k} vs one process",
                "throughput",
                "tokens/s",
                ours_tps,
                reference="one process (Lightning, all cores)",
                ratios=pairwise(ours_tps, one_tps),
                ratio_meaning="tokens/s at K stages / tokens/s of one process (the bubble and transfer cost)",
                extra={"stages": k},
            )
        )
    return rows


def bench_network(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    cfg = gpt_config(s)
    k = s.network_stages
    results: dict[str, list[dict]] = {run.label: [] for run in s.network_runs}
    for r in range(s.network_repeats):
        for run in s.network_runs:
            progress(f"network {s.bandwidth_mbps:g} Mbps: repeat {r + 1} of {s.network_repeats}: {run.label}")
            results[run.label].append(clapping_run(cfg, s, k, run, bandwidth_mbps=s.bandwidth_mbps, seed=r))
    base = s.network_runs[0].label
    base_step = [x["step_s"] for x in results[base]]
    base_net = [x["net_time_per_step_s"] for x in results[base]]
    rows = []
    for run in s.network_runs:
        res = results[run.label]
        step = [x["step_s"] for x in res]
        ratio = res[0]["compression_ratio"]
        # Amdahl: only the link time shrinks, by the compression ratio (at best)
        bound = [b / (b - n + n * ratio) for b, n in zip(base_step, base_net)]
        is_ref = run.label == base
        rows.append(
            row(
                "network",
                f"{run.label} @ {s.bandwidth_mbps:g} Mbps K={k}",
                "step time",
                "s/step",
                step,
                reference=None if is_ref else f"{base} @ {s.bandwidth_mbps:g} Mbps K={k}",
                ratios=None if is_ref else pairwise(base_step, step),
                ratio_meaning=None if is_ref else "speed-up: step time of none / step time of this method",
                extra={
                    "compression_ratio": ratio,
                    "speedup_bound_1_over_ratio": 1.0 / ratio,
                    "speedup_bound_amdahl": statistics.median(bound),
                    "link_time_per_step_s": statistics.median(x["net_time_per_step_s"] for x in res),
                    "bytes_per_step": res[0]["bytes_per_step"],
                    "stages": k,
                },
            )
        )
    return rows


def bench_scale(
    s: BenchSettings, progress: Callable[[str], None], store: dict[str, Any]
) -> list[dict[str, Any]]:
    rows = []
    # K curve: the pipeline section's runs (rerun here when that section was skipped)
    measured = store.get("pipeline", {}).get("ours")
    cfg = gpt_config(s)
    if not measured:
        measured = {k: [] for k in s.stages}
        for r in range(s.repeats):
            for k in s.stages:
                progress(f"scale: repeat {r + 1} of {s.repeats}: K={k}")
                measured[k].append(clapping_run(cfg, s, k, seed=r))
    for k in s.stages:
        res = measured[k]
        rows.append(
            row(
                "scale",
                f"K curve: {OURS} K={k} T={s.block_size}",
                "step time",
                "s/step",
                [x["step_s"] for x in res],
                extra={"stages": k, "seq_len": s.block_size, "bytes_per_step": res[0]["bytes_per_step"]},
            )
        )
    k = s.seq_stages
    by_t: dict[int, list[dict]] = {}
    if k in measured:
        by_t[s.block_size] = measured[k]
    todo = [t for t in s.seq_lengths if t not in by_t]
    for r in range(s.repeats):
        for t in todo:
            progress(f"scale: repeat {r + 1} of {s.repeats}: K={k} T={t}")
            by_t.setdefault(t, []).append(clapping_run(gpt_config(s, block_size=t), s, k, seed=r))
    for t in s.seq_lengths:
        res = by_t[t]
        rows.append(
            row(
                "scale",
                f"T curve: {OURS} K={k} T={t}",
                "step time",
                "s/step",
                [x["step_s"] for x in res],
                extra={
                    "stages": k,
                    "seq_len": t,
                    "bytes_per_step": res[0]["bytes_per_step"],
                    "tied_bytes_per_step": res[0]["tied_bytes_per_step"],  # within bytes_per_step; not T's
                },
            )
        )
    return rows

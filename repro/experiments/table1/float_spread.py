"""How far float-level differences move a run: the ``uniform`` row of every seed trained again
under another CPU kernel path (``ATEN_CPU_CAPABILITY=avx2`` instead of what this processor
offers) and with another torch thread count (all cores instead of the table's one per worker).
The same code and seed give bitwise the same run only on the same machine type with the same
threads; this spread is what a rerun elsewhere may move a row by, and it counts in the noise."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from repro.alloc.allocation import allocate
from repro.runs import Progress, RunResult, train_all

from .plan import ArchPlan
from .settings import Table1Settings

# variant -> (environment of its worker processes, workers side by side)
VARIANTS = {"avx2 kernels": ({"ATEN_CPU_CAPABILITY": "avx2"}, None), "all cores per run": (None, 1)}


def float_spread(
    settings: Table1Settings,
    plans: list[ArchPlan],
    results: dict[str, RunResult],
    cache_dir: str | None,
    progress: Progress,
) -> dict[str, Any]:
    """Per architecture and variant: the final losses of the uniform row's seeds, and their
    differences to the table's own runs."""
    out: dict[str, Any] = {}
    for plan in plans:
        widths = allocate("uniform", plan.shape, plan.levels).widths
        table = {seed: results[plan.row_spec(widths, seed).key].final_val_loss for seed in settings.seeds}
        out[plan.arch] = {}
        for variant, (env, workers) in VARIANTS.items():
            folder = plan.out / "float_spread" / variant.replace(" ", "_")
            specs = [
                replace(
                    plan.row_spec(widths, seed),
                    folder=str(folder),
                    label=f"{plan.arch} uniform s{seed} ({variant})",
                )
                for seed in settings.seeds
            ]
            progress.extend(len(specs), sum(s.steps for s in specs))
            trained = train_all(
                specs, settings.accelerator, workers or settings.workers, cache_dir, progress, env=env
            )
            losses = {s.seed: trained[s.key].final_val_loss for s in specs}
            diffs = [losses[seed] - table[seed] for seed in settings.seeds]
            first = trained[specs[0].key].provenance["machine"]
            out[plan.arch][variant] = {
                "seeds": list(settings.seeds),
                "table_loss": [table[s] for s in settings.seeds],
                "variant_loss": [losses[s] for s in settings.seeds],
                "difference": diffs,
                "max_abs_difference": max(abs(d) for d in diffs),
                "mean_abs_difference": statistics.fmean(abs(d) for d in diffs),
                "cpu_capability": first["cpu_capability"],
                "torch_threads": first["torch_threads"],
            }
    return out

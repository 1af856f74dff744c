"""``repro table1 --probe``: how much noise a scale's rows carry at a given length, and what the
seeds could resolve there: the numbers a scale is sized by.

For each run length and architecture, a few rows that need no profile (``uniform``, budget-matched
baselines, reference points) are trained for every seed on the target model, one evaluation at
the end (the table's final loss). Per length: uniform's mean and seed std, and for every other
row the paired difference to uniform (mean, std of the differences, p); then, from the pooled
std of the paired differences, the seeds a paired t-test needs to detect each target difference
with 80 % power at Holm's strictest level (alpha / m for the m rows a table compares).

    repro table1 --scale cpu --probe --probe_steps 300 1200 --seeds 0 1 2 3 4 5
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from repro.alloc.allocation import allocate
from repro.experiments.kit.probe_report import probe_table
from repro.files import write_report
from repro.runs import Progress, train_all
from repro.runs.provenance import provenance_header
from repro.stats import probe_noise

from .plan import ROW_METHODS, make_plan
from .settings import Table1Settings

PROBE_ROWS = ("uniform", "last-k", "all-low")
PROFILE_FREE = ("uniform", "first-k", "last-k", "spaced-k", "all-high", "all-low", "nope")
TARGETS = (0.015, 0.02)  # nats: the differences the sizing asks about


def probe(
    settings: Table1Settings,
    out: Path,
    steps: list[int],
    rows: tuple[str, ...] = PROBE_ROWS,
    cache_dir: str | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    bad = [r for r in rows if r not in PROFILE_FREE]
    if bad or "uniform" not in rows:
        raise ValueError(
            f"--probe_rows {list(rows)}: include uniform; rows that need no profile: {PROFILE_FREE}"
        )
    if not steps or any(s <= 0 for s in steps):
        raise ValueError(f"--probe_steps {steps}: positive step counts")
    plans = [make_plan(settings, arch, out) for arch in settings.architectures]
    specs = {}
    for plan in plans:
        for n in steps:
            for method in rows:
                widths = allocate(method, plan.shape, plan.levels).widths
                for seed in settings.seeds:
                    spec = plan.row_spec(widths, seed)
                    specs[(plan.arch, n, method, seed)] = replace(
                        spec,
                        folder=str(out / plan.arch / f"steps{n}"),
                        steps=n,
                        eval_every=n,
                        save_checkpoint=False,
                        label=f"{plan.arch} {method} {n} steps s{seed}",
                    )
    progress = Progress(
        "table1 probe", len(specs), sum(s.steps for s in specs.values()), settings.workers, quiet
    )
    results = train_all(list(specs.values()), settings.accelerator, settings.workers, cache_dir, progress)
    m = len(ROW_METHODS) - 1  # the rows a table compares with uniform (Holm's count)
    probes = []
    for plan in plans:
        for n in steps:
            loss = {
                method: [results[specs[(plan.arch, n, method, s)].key].final_val_loss for s in settings.seeds]
                for method in rows
            }
            uniform = loss["uniform"]
            probes.append(
                {
                    "arch": plan.arch,
                    "steps": n,
                    "seeds": list(settings.seeds),
                    "uniform_mean": statistics.fmean(uniform),
                    "uniform_std": statistics.stdev(uniform) if len(uniform) > 1 else None,
                    "losses": loss,
                    **probe_noise(loss, "uniform", TARGETS, m),
                    "run_wall_s": statistics.fmean(
                        results[specs[(plan.arch, n, mm, s)].key].wall_s
                        for mm in rows
                        for s in settings.seeds
                    ),
                }
            )
    doc = {"scale": settings.scale, **provenance_header(), "holm_rows": m, "probes": probes}
    write_report(out, "probe", doc, probe_markdown(doc))
    return doc


def probe_markdown(doc: dict[str, Any]) -> str:
    return probe_table(
        f"Noise probe, scale {doc['scale']}, commit {doc['git_commit'][:7]}",
        "uniform",
        doc,
        ["arch", "steps", "uniform val loss"],
        lambda p: [
            p["arch"].upper(),
            str(p["steps"]),
            f"{p['uniform_mean']:.4f} +- {p['uniform_std'] or 0:.4f}",
        ],
        TARGETS,
    )

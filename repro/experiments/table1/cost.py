"""``repro table1 --plan``: the runs of both stages, their steps and tokens, and the GPU-hours they
need, without training. Stage 1 (profiles and the reference) is known exactly; stage 2 depends on
the profiles, so it is counted as if every method allocated differently (equal allocations share
runs, so the real stage 2 has at most this many runs)."""

from __future__ import annotations

from math import comb
from pathlib import Path

from repro.experiments.kit.compute_plan import PlannedRun, config_facts, planned_runs, print_plan
from repro.experiments.kit.data_use import check_data_use, data_lines

from .plan import ROW_METHODS, make_plan, stage1_specs
from .settings import Table1Settings


def planned_table1(settings: Table1Settings, out: Path) -> list[PlannedRun]:
    runs: list[PlannedRun] = []
    for arch in settings.architectures:
        plan = make_plan(settings, arch, out)
        runs += planned_runs(stage1_specs(plan, settings), 1)
        tokens, flops = config_facts(plan.target.path)
        methods = len(ROW_METHODS) - 1 + settings.random_draws
        rows = methods * len(settings.seeds) - 1  # the reference (all-high, first seed) is in stage 1
        if arch == "mla":
            rows += len(settings.sweep_high_layers) * len(settings.sweep_methods) * len(settings.sweep_seeds)
        for i in range(rows):
            runs.append(
                PlannedRun(
                    f"{arch} row {i}", 2, settings.steps, settings.steps * tokens, settings.steps * flops
                )
            )
        pairs = (
            comb(settings.interaction_top, 2) * len(settings.profile_seeds) if settings.interaction_top else 0
        )
        for i in range(pairs):
            steps = plan.profile.steps
            runs.append(PlannedRun(f"{arch} pair {i}", 2, steps, steps * tokens, steps * flops))
    return runs


def print_table1_plan(
    settings: Table1Settings, out: Path, step_time: float | None, member: str = "target"
) -> None:
    """``member``: the model ``step_time`` is of, 'target' or 'source' (first architecture)."""
    plan = make_plan(settings, settings.architectures[0], out)
    reference = (plan.target if member == "target" else plan.source).path
    title = f"table1 {settings.scale} (stage 2 at most: equal allocations share runs)"
    print_plan(title, planned_table1(settings, out), reference, settings.accelerator, step_time)
    for line in data_lines(table1_data_use(settings, out, strict=False), settings.max_epochs_over_data):
        print(line)


def table1_data_use(settings: Table1Settings, out: Path, cache_dir: str | None = None, strict: bool = True):
    """How much of its training split each kind of run reads (the profile runs and the reference
    row; every row trains like the reference), checked against max_epochs_over_data."""
    specs = [
        s for arch in settings.architectures for s in stage1_specs(make_plan(settings, arch, out), settings)
    ]
    return check_data_use(specs, settings.max_epochs_over_data, f"table1 {settings.scale}", cache_dir, strict)

"""`make reproduce-table1`: the from-scratch comparison of budget-matched RoPE allocations.

For each architecture (fixed-width MHA and MLA), in two stages of training runs:

1. profiles: the coverage-benefit profile of the target model and of the smaller source member,
   and the all-high reference (the all-high row's first seed, saved as a checkpoint) whose
   phase-off profile is then measured;
2. rows: the source profile is transferred to the target by normalized depth, every method of
   spec section 4 allocates, and every allocation is trained for every seed (same init seed and
   data order per seed across rows), plus the pair runs of the interaction terms and the extra
   budgets of the quality-storage-compute figure.

Every run writes its own result JSON and TensorBoard log under ``<out>/<arch>/``; a finished
run found there is reused, so an interrupted reproduction continues where it stopped. The table
(md, csv, json) is written atomically at the end by ``table1_report``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import combinations
from pathlib import Path
from typing import Any

from repro.alloc.allocation import Allocation, allocate, random_allocations, top_k_layers
from repro.alloc.budget import BudgetLevels, default_levels, level_to_width, num_high_layers
from repro.alloc.coverage_profile import (
    CoverageProfileSettings,
    coverage_benefit_profile,
    layer_groups,
    pair_benefits,
    pair_specs,
    specs_for_sets,
)
from repro.alloc.profile import LayerProfile
from repro.alloc.training_runs import Progress, RunJob, RunSpec, data_key, train_jobs
from repro.run_config import RunConfig, load_run_config

from .table1_settings import Table1Settings

ROW_METHODS = ("profiled", "transferred", "uniform", "first-k", "last-k", "spaced-k", "random-k", "inverse",
               "phase-off-k", "all-high", "all-low", "nope")


@dataclass
class ArchPlan:
    """One architecture's half of the experiment: configs, levels, folders."""

    arch: str
    target: RunConfig
    source: RunConfig
    levels: BudgetLevels
    out: Path  # <out>/<arch>
    steps: int  # full-run steps of a row
    eval_every: int  # validation interval of a row

    @property
    def runs_dir(self) -> Path:
        return self.out / "runs"

    @property
    def shape(self):
        return self.target.shape_config()

    def widths(self, level: float, config: RunConfig | None = None) -> int:
        return level_to_width(level, (config or self.target).shape_config(), self.levels.unit)


def widths_name(widths: list[int] | tuple[int, ...], seed: int) -> str:
    """Run name of a row run: its per-layer widths and seed (equal allocations share runs)."""
    return "w" + "-".join(str(w) for w in widths) + f"-s{seed}"


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


# ------------------------------------------------------------------------------------------- planning
def make_plan(settings: Table1Settings, arch: str, out: Path, steps: int | None = None) -> ArchPlan:
    target = load_run_config(settings.target[arch])
    source = load_run_config(settings.source[arch])
    t_shape, s_shape = target.shape_config(), source.shape_config()
    for name, shape, path in (("target", t_shape, target.path), ("source", s_shape, source.path)):
        if shape.attention != arch:
            raise ValueError(f"table1 settings {settings.path!r}: {name}.{arch} = {path!r} has attention={shape.attention!r}")
    if s_shape.n_layer >= t_shape.n_layer:
        raise ValueError(f"table1 {arch}: the source ({source.path}, {s_shape.n_layer} layers) must be shallower than "
                         f"the target ({target.path}, {t_shape.n_layer} layers)")
    per_head = (lambda c: c.head_dim) if arch == "mha" else (lambda c: c.qk_nope_head_dim)
    if per_head(t_shape) != per_head(s_shape):
        raise ValueError(f"table1 {arch}: source and target are not one family (width per head {per_head(s_shape)} vs "
                         f"{per_head(t_shape)})")
    if target.data != source.data:
        raise ValueError(f"table1 {arch}: source and target must share the data section (same corpus and tokenizer)")
    levels = default_levels(t_shape)
    num_high_layers(t_shape.n_layer, levels)  # fail early on an infeasible budget
    num_high_layers(s_shape.n_layer, levels)
    full = int(steps or target.trainer.get("max_steps") or 0)
    if full <= 0:
        raise ValueError(f"{target.path}: trainer.max_steps must be a positive integer (the steps of a Table 1 run)")
    eval_every = min(settings.eval_every, full)
    if full % eval_every:
        raise ValueError(f"table1: steps={full} is not a multiple of eval_every={eval_every}; the last evaluation "
                         "must fall on the final step")
    return ArchPlan(arch, target, source, levels, out / arch, full, eval_every)


def profile_settings(settings: Table1Settings, plan: ArchPlan) -> CoverageProfileSettings:
    early = max(1, round(settings.profile_fraction * plan.steps))
    eval_every = max(1, early // settings.profile_evals)
    return CoverageProfileSettings(
        steps=early,
        seeds=settings.profile_seeds,
        eval_every=eval_every,
        last_n=min(settings.profile_last_n, early // eval_every),
        schedule_steps=plan.steps if settings.profile_lr_schedule == "full-run" else None,
    )


def profile_jobs(plan: ArchPlan, config: RunConfig, runs_dir: Path, ps: CoverageProfileSettings) -> list[RunJob]:
    n = config.shape_config().n_layer
    high_w, low_w = plan.widths(plan.levels.high, config), plan.widths(plan.levels.low, config)
    specs = specs_for_sets([[]] + layer_groups(n, 1), n, high_w, low_w, ps)
    return [RunJob(config, spec, runs_dir, dict(config.data)) for spec in specs]


def row_spec(plan: ArchPlan, widths: list[int], seed: int, reference: bool = False) -> RunSpec:
    return RunSpec(widths_name(widths, seed), tuple(widths), seed, plan.steps, plan.eval_every, save_checkpoint=reference)


def reference_widths(plan: ArchPlan) -> list[int]:
    return [plan.widths(plan.levels.high)] * plan.shape.n_layer


def allocations_for(plan: ArchPlan, settings: Table1Settings, benefit: LayerProfile, transferred: LayerProfile,
                    phase_off: LayerProfile) -> list[Allocation]:
    out = []
    for method in ROW_METHODS:
        if method == "random-k":
            out.extend(random_allocations(plan.shape, plan.levels, settings.random_draws, seed=0))
        else:
            out.append(allocate(method, plan.shape, plan.levels, benefit=benefit, phase_off=phase_off,
                                transferred=transferred))
    return out


def sweep_allocations(plan: ArchPlan, settings: Table1Settings, benefit: LayerProfile) -> list[Allocation]:
    """Allocations at the extra budgets (k high layers) of the quality-storage-compute figure."""
    n = plan.shape.n_layer
    out = []
    for k in settings.sweep_high_layers:
        if k > n:
            raise ValueError(f"table1 sweep_high_layers: k={k} is more than the target's {n} layers")
        lv = plan.levels
        levels = BudgetLevels(lv.high, lv.low, lv.low + (lv.high - lv.low) * k / n, lv.unit)
        for method in settings.sweep_methods:
            a = allocate(method, plan.shape, levels, benefit=benefit)
            a.record["sweep_k"] = k
            out.append(a)
    return out


# ------------------------------------------------------------------------------------------- running
def check_accelerator(accelerator: str) -> None:
    """Fail before any run when the settings ask for a GPU that this machine does not have."""
    import torch

    if accelerator not in ("cpu", "gpu", "cuda"):
        raise ValueError(f"accelerator={accelerator!r}: allowed 'cpu' or 'gpu'")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(f"accelerator={accelerator!r} but no CUDA GPU is visible here; run SCALE=paper on a GPU "
                         "machine, or pass --accelerator cpu to force it onto the CPU")


def run_table1(
    settings: Table1Settings,
    out: Path,
    steps: int | None = None,
    log=print,
) -> dict[str, Any]:
    """Run (or resume) the whole Table 1 pipeline and write the table; returns the table document."""
    from repro.alloc.analysis import interaction_terms
    from repro.alloc.phase_off_profile import measure_phase_off_profile
    from repro.alloc.transfer import transfer_profile

    from .table1_report import build_table, write_table

    started = time.perf_counter()
    check_accelerator(settings.accelerator)
    plans = [make_plan(settings, arch, out, steps) for arch in settings.architectures]
    datamodules: dict[str, Any] = {}
    for plan in plans:
        for config in (plan.target, plan.source):
            key = data_key(dict(config.data))
            if key not in datamodules:
                datamodules[key] = config.datamodule()
                datamodules[key].setup("fit")

    # stage 1: profiles and the reference
    stage1: list[RunJob] = []
    psettings = {}
    for plan in plans:
        ps = psettings[plan.arch] = profile_settings(settings, plan)  # the same for source and target
        stage1 += [RunJob(plan.target, row_spec(plan, reference_widths(plan), settings.seeds[0], reference=True),
                          plan.runs_dir, dict(plan.target.data))]
        stage1 += profile_jobs(plan, plan.target, plan.out / "profile_target", ps)
        stage1 += profile_jobs(plan, plan.source, plan.out / "profile_source", ps)
    estimate_rows = sum(len(ROW_METHODS) + settings.random_draws - 1 for _ in plans) * len(settings.seeds)
    workers = settings.workers if settings.accelerator == "cpu" else 1
    progress = Progress(len(stage1) + estimate_rows, "table1", workers,
                        total_steps=sum(j.spec.steps for j in stage1) + estimate_rows * plans[0].steps)
    log(f"[table1] scale={settings.scale}: stage 1 of 2, {len(stage1)} profile and reference runs "
        f"({', '.join(settings.architectures)}); about {estimate_rows} row runs follow")
    results = train_jobs(stage1, datamodules, settings.accelerator, workers, label="table1", progress=progress)

    # profiles, transfer, allocations
    import torch

    eval_device = "cuda" if settings.accelerator in ("gpu", "cuda") and torch.cuda.is_available() else "cpu"
    arch_data: dict[str, dict[str, Any]] = {}
    stage2: list[RunJob] = []
    for plan in plans:
        pdir = plan.out / "profiles"
        dm_t = datamodules[data_key(dict(plan.target.data))]
        benefit = coverage_benefit_profile(plan.target, plan.levels, psettings[plan.arch], plan.out / "profile_target",
                                           settings.accelerator, datamodule=dm_t, quiet=True)
        benefit.save(pdir / "coverage_target.json")
        source = coverage_benefit_profile(plan.source, plan.levels, psettings[plan.arch], plan.out / "profile_source",
                                          settings.accelerator, datamodule=datamodules[data_key(dict(plan.source.data))],
                                          quiet=True)
        source.save(pdir / "coverage_source.json")
        transferred = transfer_profile(source, plan.shape.n_layer, settings.transfer_method,
                                       plan.target.gpt_config(dm_t.vocab_size).to_dict(),
                                       source_path=str(pdir / "coverage_source.json"))
        transferred.save(pdir / "transferred.json")
        ckpt = plan.runs_dir / f"{widths_name(reference_widths(plan), settings.seeds[0])}.ckpt"
        phase_off = measure_phase_off_profile(plan.target, ckpt, datamodule=dm_t, device=eval_device)
        phase_off.save(pdir / "phase_off_target.json")
        allocations = allocations_for(plan, settings, benefit, transferred, phase_off)
        sweep = sweep_allocations(plan, settings, benefit) if plan.arch == "mla" else []
        pairs = list(combinations(top_k_layers(benefit.values, settings.interaction_top), 2)) \
            if settings.interaction_top >= 2 else []
        arch_data[plan.arch] = dict(plan=plan, benefit=benefit, source=source, transferred=transferred,
                                    phase_off=phase_off, allocations=allocations, sweep=sweep, pairs=pairs)
        specs: dict[str, RunSpec] = {}
        for a in allocations:
            for seed in settings.seeds:
                ref = a.widths == reference_widths(plan) and seed == settings.seeds[0]
                specs.setdefault(widths_name(a.widths, seed), row_spec(plan, a.widths, seed, reference=ref))
        for a in sweep:
            for seed in settings.sweep_seeds:
                specs.setdefault(widths_name(a.widths, seed), row_spec(plan, a.widths, seed))
        stage2 += [RunJob(plan.target, spec, plan.runs_dir, dict(plan.target.data)) for spec in specs.values()]
        stage2 += [RunJob(plan.target, s, plan.out / "profile_target", dict(plan.target.data))
                   for s in pair_specs(benefit, pairs, with_base=False)]
    stage2 = [j for j in stage2 if j.key not in {s.key for s in stage1}]  # the reference is done
    progress.extend(len(stage2) - estimate_rows,
                    sum(j.spec.steps for j in stage2) - estimate_rows * plans[0].steps)
    log(f"[table1] stage 2 of 2: {len(stage2)} runs (every row x {len(settings.seeds)} seeds, interaction pairs, "
        f"extra budgets)")
    results.update(train_jobs(stage2, datamodules, settings.accelerator, workers, label="table1", progress=progress))

    for d in arch_data.values():
        plan = d["plan"]
        d["runs"] = {}
        for a in d["allocations"] + d["sweep"]:
            for seed in (settings.sweep_seeds if "sweep_k" in a.record else settings.seeds):
                name = widths_name(a.widths, seed)
                d["runs"][name] = results[str(plan.runs_dir / name)]
        measured = pair_benefits(plan.target, d["benefit"], d["pairs"], plan.out / "profile_target",
                                 settings.accelerator, datamodules[data_key(dict(plan.target.data))], quiet=True) \
            if d["pairs"] else {}
        d["interactions"] = interaction_terms(d["benefit"].values, measured)

    wall = time.perf_counter() - started
    doc = build_table(settings, arch_data, steps_override=steps, wall_s=wall, commit=git_commit(),
                      created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      trained=progress.trained, reused=progress.done - progress.trained,
                      run_walls=[float(r["wall_s"]) for r in results.values()])
    write_table(doc, out)
    log(f"[table1] wrote {out}/table1.md, .csv, .json in {wall:.0f}s ({progress.trained} runs trained, "
        f"{progress.done - progress.trained} reused)")
    return doc


def main(argv: list[str] | None = None) -> int:
    import argparse
    import logging

    from .table1_settings import SCALES, load_table1_settings, settings_path

    parser = argparse.ArgumentParser(prog="repro table1", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="cpu", choices=SCALES, help="which settings: paper_configs/table1/<scale>.yaml")
    parser.add_argument("--settings", type=Path, default=None, help="a settings YAML instead of the scale's own")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds of the rows (default: the settings')")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps of a row run instead of the configs' trainer.max_steps (quick checks; recorded)")
    parser.add_argument("--workers", type=int, default=None, help="runs trained side by side on CPU (default: the settings')")
    parser.add_argument("--accelerator", default=None, help="cpu or gpu (default: the settings')")
    parser.add_argument("--out", type=Path, default=Path("results/table1"), help="output folder (default results/table1)")
    args = parser.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    try:
        settings = load_table1_settings(args.settings or settings_path(args.scale))
        settings = settings.with_overrides(seeds=tuple(args.seeds) if args.seeds else None, workers=args.workers,
                                           accelerator=args.accelerator)
        if args.steps is not None and args.steps <= 0:
            raise ValueError(f"--steps={args.steps}: must be a positive integer")
        run_table1(settings, args.out, steps=args.steps, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ValueError, FileNotFoundError) as exc:
        print(f"repro table1: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

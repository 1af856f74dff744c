"""``make reproduce-table1``: the from-scratch comparison of budget-matched RoPE allocations.

For each architecture (fixed-width MHA and MLA), in two stages of training runs:

1. profiles: the coverage-benefit profile of the target model and of the smaller source member,
   and the all-high reference (the all-high row's first seed, saved as a checkpoint) whose
   phase-off profile is then measured;
2. rows: the source profile is transferred to the target by normalized depth, every method of
   PROTOCOL.md §R4 allocates, and every allocation is trained for every seed (same init seed and
   data order per seed across rows), plus the pair runs of the interaction terms and the extra
   budgets of the quality-storage-compute figure.

Every run is a run of the engine (``repro.runs``): its result JSON and TensorBoard log go under
``<out>/<arch>/``, and a finished run found there is reused, so an interrupted reproduction
continues where it stopped. The table (md, csv, json) is written atomically at the end.

    repro table1 --scale cpu [--seeds 0 1 2] [--steps N] [--workers W] [--out results/table1]
    repro table1 --scale paper --plan [--step_time S]       # runs, tokens, GPU-hours; trains nothing
    repro table1 --scale gpu --shard 3/8 [--stage profiles|rows|all]   # one of 8 machines

Sharding: every shard computes the same plan and trains its part of each stage into the shared
``--out`` folder; stage 2 needs all of stage 1 (a shard waits for it under ``--stage all``, or
run ``--stage profiles`` then ``--stage rows`` as two dependent job arrays). The last shard to
finish writes the table.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path
from typing import Literal

import torch

from repro.alloc.analysis import interaction_terms
from repro.alloc.coverage_profile import pair_benefits_from_results, profile_from_results
from repro.alloc.phase_off_profile import measure_phase_off_profile
from repro.alloc.transfer import transfer_profile
from repro.arguments import NonNegativeInt, PositiveInt, documented_by, fields_help
from repro.experiments.kit.scale_args import ScaleOptions, settings_file
from repro.runs import Progress, RunResult, check_accelerator, train_all
from repro.runs.shards import Shard, finished_results, gather
from repro.stop import interrupted_line, remember_interrupts

from .cost import print_table1_plan, table1_data_use
from .float_spread import float_spread
from .plan import (
    ROW_METHODS,
    interaction_pairs,
    make_plan,
    row_allocations,
    seeds_of,
    stage1_specs,
    stage2_specs,
    sweep_allocations,
    widths_name,
)
from .probe import PROBE_ROWS, probe_markdown
from .probe import probe as noise_probe
from .report import build_table
from .results import ArchAllocations, ArchOutcome
from .settings import SCALES, Table1Settings, load_table1_settings, settings_path
from .table_files import write_table

STAGES = ("all", "profiles", "rows")


def run_table1(
    settings: Table1Settings,
    out: Path,
    cache_dir: str | None = None,
    quiet: bool = False,
    with_float_spread: bool = False,
    shard: Shard | None = None,
    stage: str = "all",
) -> dict | None:
    """Run (or resume) the Table 1 pipeline and write the table; returns the table document, or
    None when this call does not write it (``stage='profiles'``, or a shard whose peers are not
    done: the last shard to finish writes it)."""
    started = time.perf_counter()
    if stage not in STAGES:
        raise ValueError(f"--stage {stage!r}: allowed {STAGES}")
    if with_float_spread and shard is not None:
        raise ValueError("--float_spread runs in one process: give it without --shard")
    check_accelerator(settings.accelerator)
    plans = [make_plan(settings, arch, out) for arch in settings.architectures]
    table1_data_use(settings, out, cache_dir)  # no run may pass over its data more than the limit
    vocab = {}
    for plan in plans:  # the tokenizer and token caches, once, before any worker starts
        dm = plan.target.datamodule(**({"cache_dir": cache_dir} if cache_dir else {}))
        dm.setup("fit")
        vocab[plan.arch] = dm.model_vocab_size

    stage1 = [spec for plan in plans for spec in stage1_specs(plan, settings)]
    mine1 = shard.select(stage1) if shard else stage1
    estimate = sum(len(plan_rows_estimate(settings)) for _ in plans) * len(settings.seeds)
    first = mine1 if stage != "rows" else []
    later = round(estimate / shard.count) if shard else estimate
    later = later if stage != "profiles" else 0
    progress = Progress(
        f"table1 {shard}" if shard else "table1",
        len(first) + later,
        sum(s.steps for s in first) + later * settings.steps,
        settings.workers if settings.accelerator == "cpu" else settings.runs_per_gpu * max(1, _gpus()),
        quiet,
    )
    train = partial(
        train_all,
        accelerator=settings.accelerator,
        workers=settings.workers,
        cache_dir=cache_dir,
        progress=progress,
        runs_per_gpu=settings.runs_per_gpu,
    )
    with remember_interrupts():
        if stage != "rows":
            progress.note(
                f"scale {settings.scale}: stage 1 of 2, {len(mine1)} profile and reference runs "
                f"({', '.join(settings.architectures)}){f' of {len(stage1)} (shard {shard})' if shard else ''}"
                + ("" if stage == "profiles" else f"; about {estimate} row runs follow")
            )
            results = train(mine1)
            if stage == "profiles":
                progress.note(f"stage 1 done ({len(mine1)} runs); the rows: --stage rows")
                return None
        if stage == "all":
            results = gather(stage1, results, shard, progress.note, wait=True)
        else:  # --stage rows: stage 1 was trained by an earlier call (or job array)
            results, missing = finished_results(stage1)
            if missing:
                raise ValueError(
                    f"--stage rows needs every stage-1 run, {len(missing)} are not finished in {out} "
                    f"(e.g. {missing[0].display}): run --stage profiles first"
                )
        progress.note("stage 1 done: profiles, transfer, phase-off profile and allocations")
        staged, stage2 = _allocate(plans, settings, results, vocab, cache_dir)
        done = {s.key for s in stage1}
        stage2 = [s for s in stage2 if s.key not in done]  # the reference is already trained
        mine2 = shard.select(stage2) if shard else stage2
        progress.extend(len(mine2) - later, sum(s.steps for s in mine2) - later * settings.steps)
        progress.note(
            f"stage 2 of 2: {len(mine2)} runs{f' of {len(stage2)} (shard {shard})' if shard else ''} (every row x "
            f"{len(settings.seeds)} seeds, interaction pairs, extra budgets)"
        )
        results.update(train(mine2))
    results = gather(stage1 + stage2, results, shard, progress.note)
    if results is None:
        return None

    outcomes = [_outcome(settings, results, entry) for entry in staged]
    spread = None
    if with_float_spread:
        progress.note("float spread: the uniform row again under other kernels and thread counts")
        with remember_interrupts():
            spread = float_spread(settings, plans, results, cache_dir, progress)
    doc = build_table(
        settings,
        outcomes,
        wall_s=time.perf_counter() - started,
        trained=progress.trained,
        reused=progress.done - progress.trained,
        all_runs=list(results.values()),
        float_spread=spread,
    )
    write_table(doc, out)
    progress.note(
        f"wrote {out}/table1.md, .csv, .json in {time.perf_counter() - started:.0f} s "
        f"({progress.trained} runs trained, {progress.done - progress.trained} reused)"
    )
    return doc


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _allocate(plans, settings: Table1Settings, results: dict[str, RunResult], vocab, cache_dir):
    """From the stage-1 results: the profiles (saved), the allocations, and the stage-2 runs."""
    device = "cuda" if settings.accelerator == "gpu" and torch.cuda.is_available() else "cpu"
    staged, stage2 = [], []
    for plan in plans:
        benefit, source = (
            profile_from_results(
                getattr(plan, member),
                plan.levels,
                plan.profile,
                _by_name(results, plan.profile_specs(member)),
                plan.profile_dir(member),
                vocab[plan.arch],
            )
            for member in ("target", "source")
        )
        transferred = transfer_profile(
            source,
            plan.shape.n_layer,
            settings.transfer_method,
            plan.target.gpt_config(vocab[plan.arch]).to_dict(),
            source_path=str(plan.profiles_dir / "coverage_source.json"),
        )
        reference = results[plan.row_spec(plan.reference_widths, settings.seeds[0], reference=True).key]
        phase_off = measure_phase_off_profile(
            plan.target, reference.checkpoint, cache_dir=cache_dir, device=device
        )
        for name, profile in (
            ("coverage_target", benefit),
            ("coverage_source", source),
            ("transferred", transferred),
            ("phase_off_target", phase_off),
        ):
            profile.save(plan.profiles_dir / f"{name}.json")
        allocations = row_allocations(plan, settings, benefit, transferred, phase_off)
        sweep = sweep_allocations(plan, settings, benefit)
        pairs = interaction_pairs(settings, benefit)
        staged.append(
            ArchAllocations(
                plan, benefit, source, transferred, phase_off, tuple(allocations), tuple(sweep), tuple(pairs)
            )
        )
        stage2 += stage2_specs(plan, settings, allocations, sweep, benefit, pairs)
    return staged, stage2


def _outcome(settings: Table1Settings, results: dict[str, RunResult], a: ArchAllocations) -> ArchOutcome:
    plan = a.plan
    runs = {
        widths_name(row.widths, seed): results[plan.row_spec(row.widths, seed).key]
        for row in a.allocations + a.sweep
        for seed in seeds_of(row, settings)
    }
    pair_runs = {s.name: results[s.key] for s in plan.profile_specs("target")}
    pair_specs = stage2_specs(plan, settings, [], [], a.benefit, list(a.pairs))
    pair_runs.update({s.name: results[s.key] for s in pair_specs})
    measured = pair_benefits_from_results(a.benefit, list(a.pairs), pair_runs) if a.pairs else {}
    return ArchOutcome(
        **vars(a), runs=runs, interactions=tuple(interaction_terms(a.benefit.values, measured))
    )


def plan_rows_estimate(settings: Table1Settings) -> list[str]:
    """The row allocations before the profiles exist (for the progress estimate)."""
    return [m for m in ROW_METHODS if m != "random-k"] + ["random-k"] * settings.random_draws


def _by_name(results: dict[str, RunResult], specs) -> dict[str, RunResult]:
    return {s.name: results[s.key] for s in specs}


@documented_by(Table1Settings)
def table1(
    scale: Literal[SCALES] | None = None,
    settings: Path | None = None,
    seeds: tuple[NonNegativeInt, ...] | None = None,
    steps: PositiveInt | None = None,
    workers: PositiveInt | None = None,
    accelerator: Literal["cpu", "gpu"] | None = None,
    out: Path = Path("results/table1"),
    cache_dir: str | None = None,
    quiet: bool = False,
    float_spread: bool = False,
    at_scale: ScaleOptions = ScaleOptions(),
    step_time_of: Literal["target", "source"] = "target",
    stage: Literal[STAGES] = "all",
    probe: bool = False,
    probe_steps: tuple[PositiveInt, ...] | None = None,
    probe_rows: tuple[str, ...] = PROBE_ROWS,
) -> int:
    """The from-scratch comparison of budget-matched RoPE allocations (make reproduce-table1).

    Args:
        scale: which shipped settings: paper_configs/experiments/table1/<scale>.yaml (default cpu)
        settings: a settings YAML instead of a shipped scale (not with --scale)
        seeds: the settings' seeds instead
        steps: the settings' steps instead
        workers: the settings' workers instead
        accelerator: the settings' accelerator instead
        out: output folder
        cache_dir: tokenizer and token cache (default: the configs' data.cache_dir)
        quiet: no progress lines
        float_spread: also train the uniform row of every seed under avx2 kernels and with all cores per
            run, and report how far those float-level differences move it (reuses the table's runs)
        step_time_of: with --step_time: the member it was measured on (at paper scale the source is the
            12-layer paper_mha that make bench-gpu times)
        stage: profiles: stage 1 only (profiles and the reference); rows: stage 2 only (needs stage 1
            finished); all: both (a shard waits for the other shards' stage-1 runs before stage 2)
        probe: train only the noise probe: rows that need no profile, every seed, at each --probe_steps;
            prints the seed noise and the seeds a target difference needs (writes <out>/probe.{md,json})
        probe_steps: run lengths of the probe (default: the settings' steps)
        probe_rows: rows of the probe
    """
    path = settings_file(scale, settings, settings_path)
    try:
        chosen = load_table1_settings(
            path, seeds=tuple(seeds) if seeds else None, steps=steps, workers=workers, accelerator=accelerator,
            runs_per_gpu=at_scale.runs_per_gpu,
        )  # fmt: skip
        if at_scale.plan:
            print_table1_plan(chosen, out, at_scale.step_time, step_time_of)
        elif probe:
            doc = noise_probe(
                chosen, out, list(probe_steps or [chosen.steps]), tuple(probe_rows), cache_dir, quiet
            )
            print(probe_markdown(doc), end="")
        else:
            run_table1(chosen, out, cache_dir, quiet, float_spread, Shard.parse(at_scale.shard), stage)
    except KeyboardInterrupt:
        print(interrupted_line("table1", out), file=sys.stderr)
        return 130
    return 0


table1.epilog = "settings file fields:\n" + fields_help(Table1Settings)  # type: ignore[attr-defined]

"""Coverage-benefit profile (PROTOCOL.md §R3): what upgrading one layer to high coverage buys early on.

Base run: every layer low. Upgrade run l: layer l high, the others low (or a contiguous group of
g layers at once: ceil(L/g) + 1 runs). Each run trains T_early steps from the same init seed;
its loss is the mean of its last n evaluations. ``benefit[l] = loss_base - loss_up(l)``, averaged
over seeds (std across seeds is recorded). A group's benefit is spread over its layers
(``group_spread``: 'divide' gives each layer benefit/|group|, 'copy' gives each the whole).
The runs are ordinary runs of the engine (``repro.runs``): resumable and reused by fingerprint.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from repro.arguments import NonNegativeInt, PositiveInt, check_fields
from repro.runs import Progress, RunResult, RunSpec, train_all
from repro.runs.model_config import ModelConfig
from repro.runs.shards import Shard, gather

from .budget import BudgetLevels, level_to_width
from .profile import LayerProfile

EARLY_FRACTION = 0.15  # T_early as a fraction of the full run, by default (the spec's early part)
EVALUATIONS = 6  # evaluations of a profile run, by default: eval_every = T_early // this
SEEDS = (0, 1)  # S_profile seeds, by default
LAST_N = 3  # a profile run's loss = the mean of its last n evaluations, by default


def early_steps(full_steps: int, fraction: float = EARLY_FRACTION, name: str = "early fraction") -> int:
    """T_early: the first ``fraction`` of a run of ``full_steps`` steps (at least one step); a
    fraction outside (0, 1] fails naming it as ``name``."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{name}={fraction!r}: must be in (0, 1]")
    return max(1, round(fraction * full_steps))


def early_eval_every(steps: int, evaluations: int = EVALUATIONS) -> int:
    """The validation interval that gives a profile run of ``steps`` steps ``evaluations`` evaluations."""
    return max(1, steps // evaluations)


@dataclass(frozen=True)
class CoverageProfileSettings:
    steps: PositiveInt
    """T_early: optimizer steps of every run"""
    seeds: tuple[NonNegativeInt, ...] = SEEDS
    """S_profile seeds; each seed = one init and one data order"""
    eval_every: PositiveInt = 10
    """evaluate the validation loss every this many steps"""
    last_n: PositiveInt = LAST_N
    """loss of a run = mean of its last n evaluations"""
    group_size: PositiveInt = 1
    """g: upgrade contiguous groups of g layers (1 = one run per layer)"""
    group_spread: Literal["divide", "copy"] = "divide"
    """how a group's benefit is spread over its layers"""
    schedule_steps: PositiveInt | None = None
    """lr schedule length (the full run's steps); None = T_early"""

    def __post_init__(self) -> None:
        check_fields(self, "coverage profile ")  # each field's type and range
        if not self.seeds:
            raise ValueError("coverage profile seeds: give at least one seed")
        if self.steps // self.eval_every < self.last_n:
            raise ValueError(
                f"coverage profile: {self.steps} steps with eval_every={self.eval_every} give "
                f"{self.steps // self.eval_every} evaluations, fewer than last_n={self.last_n}"
            )
        if self.schedule_steps is not None and self.schedule_steps < self.steps:
            raise ValueError(
                f"coverage profile schedule_steps={self.schedule_steps}: must be >= steps={self.steps} "
                "(the profile runs are an early part of a run of that length)"
            )

    @classmethod
    def of(cls, profile: LayerProfile) -> CoverageProfileSettings:
        """The settings a coverage-benefit profile was measured with (from its meta)."""
        meta = profile.meta
        return cls(
            steps=meta["steps"],
            seeds=tuple(meta["seeds"]),
            eval_every=meta["eval_every"],
            last_n=meta["last_n"],
            schedule_steps=meta.get("schedule_steps"),
        )


def run_name(high_layers, seed: int, prefix: str = "high") -> str:
    layers = "none" if not high_layers else "_".join(str(i) for i in sorted(high_layers))
    return f"{prefix}-{layers}-s{seed}"


def layer_groups(n_layer: int, group_size: int) -> list[list[int]]:
    return [list(range(start, min(n_layer, start + group_size))) for start in range(0, n_layer, group_size)]


def upgrade_specs(
    config: ModelConfig,
    high_sets: list[list[int]],
    high_w: int,
    low_w: int,
    settings: CoverageProfileSettings,
    folder: Path,
    label: str = "",
) -> list[RunSpec]:
    """One run per (seed, set of high layers), the other layers low; seeds outermost."""
    n_layer = config.shape_config().n_layer
    specs = []
    for seed in settings.seeds:
        for high in high_sets:
            widths = [high_w if layer in high else low_w for layer in range(n_layer)]
            overrides = {f"model.gpt.{config.width_field}": widths}
            if settings.schedule_steps is not None:
                overrides["model.optim.decay_steps"] = settings.schedule_steps
            name = run_name(high, seed)
            specs.append(
                RunSpec.make(
                    name,
                    folder,
                    config.path,
                    seed,
                    settings.steps,
                    settings.eval_every,
                    overrides,
                    label=f"{label}{name}",
                )
            )
    return specs


def profile_specs(
    config: ModelConfig,
    levels: BudgetLevels,
    settings: CoverageProfileSettings,
    folder: Path,
    label: str = "",
) -> list[RunSpec]:
    """Every run of the profile: per seed, the base run (all low) then one upgrade run per group."""
    shape = config.shape_config()
    high_w, low_w = (
        level_to_width(levels.high, shape, levels.unit),
        level_to_width(levels.low, shape, levels.unit),
    )
    groups = layer_groups(shape.n_layer, settings.group_size)
    return upgrade_specs(config, [[]] + groups, high_w, low_w, settings, folder, label)


def profile_from_results(
    config: ModelConfig,
    levels: BudgetLevels,
    settings: CoverageProfileSettings,
    results: Mapping[str, RunResult],
    folder: Path,
    vocab_size: int,
) -> LayerProfile:
    """The profile from its finished runs (``run name -> result``)."""
    shape = config.shape_config()
    high_w, low_w = (
        level_to_width(levels.high, shape, levels.unit),
        level_to_width(levels.low, shape, levels.unit),
    )
    losses = {name: r.mean_last(settings.last_n) for name, r in results.items()}
    per_seed: dict[str, list[float]] = {}
    base_losses: dict[str, float] = {}
    for seed in settings.seeds:
        base = losses[run_name([], seed)]
        values = [0.0] * shape.n_layer
        for group in layer_groups(shape.n_layer, settings.group_size):
            gain = base - losses[run_name(group, seed)]
            share = gain / len(group) if settings.group_spread == "divide" else gain
            for layer in group:
                values[layer] = share
        per_seed[str(seed)] = values
        base_losses[str(seed)] = base
    columns = list(zip(*per_seed.values()))
    return LayerProfile(
        kind="coverage_benefit",
        values=[statistics.fmean(c) for c in columns],
        std=[statistics.stdev(c) for c in columns] if len(settings.seeds) > 1 else None,
        per_seed=per_seed,
        model=config.gpt_config(vocab_size, **{config.width_field: [low_w] * shape.n_layer}).to_dict(),
        meta={
            "source": config.path,
            "levels": levels.to_dict(),
            "high_width": high_w,
            "low_width": low_w,
            "steps": settings.steps,
            "seeds": list(settings.seeds),
            "eval_every": settings.eval_every,
            "last_n": settings.last_n,
            "group_size": settings.group_size,
            "group_spread": settings.group_spread,
            "schedule_steps": settings.schedule_steps,
            "runs": len(results),
            "runs_dir": str(folder),
            "base_loss": base_losses,
            "run_losses": losses,
            "run_curves": {name: [list(point) for point in r.val_curve] for name, r in results.items()},
            "tokens_per_run": settings.steps * config.batch_size * config.block_size,
            "training_wall_s": sum(r.wall_s for r in results.values()),
        },
    )


def coverage_benefit_profile(
    config: ModelConfig,
    levels: BudgetLevels,
    settings: CoverageProfileSettings,
    folder: Path,
    accelerator: str = "cpu",
    workers: int = 1,
    cache_dir: str | None = None,
    quiet: bool = False,
    shard: Shard | None = None,
    runs_per_gpu: int = 1,
    writes: str = "the profile",
) -> LayerProfile | None:
    """Measure the coverage-benefit profile of the config's model (L + 1 runs per seed, or fewer
    with groups). With ``shard``, train that shard's runs; the profile comes back (and is written
    by the caller) only from the shard that finds every run finished."""
    datamodule = config.datamodule(**({"cache_dir": cache_dir} if cache_dir else {}))
    datamodule.setup("fit")  # the tokenizer and token caches, once, before any worker starts
    specs = profile_specs(config, levels, settings, folder)
    mine = shard.select(specs) if shard else specs
    progress = Progress("coverage", len(mine), sum(s.steps for s in mine), workers, quiet=quiet)
    trained = train_all(mine, accelerator, workers, cache_dir, progress, runs_per_gpu)
    results = gather(specs, trained, shard, progress.note, writes=writes)
    if results is None:
        return None
    profile = profile_from_results(
        config, levels, settings, {s.name: results[s.key] for s in specs}, folder, datamodule.model_vocab_size
    )
    profile.meta["workers"] = workers
    return profile


def pair_specs(
    config: ModelConfig,
    profile: LayerProfile,
    pairs: list[tuple[int, int]],
    folder: Path,
    with_base: bool = True,
    label: str = "",
) -> list[RunSpec]:
    """The runs of benefit[i, j]: per seed, (the base run and) one run per pair with both layers high."""
    sets = ([[]] if with_base else []) + [sorted(p) for p in pairs]
    return upgrade_specs(
        config,
        sets,
        profile.meta["high_width"],
        profile.meta["low_width"],
        CoverageProfileSettings.of(profile),
        folder,
        label,
    )


def pair_benefits_from_results(
    profile: LayerProfile, pairs: list[tuple[int, int]], results: Mapping[str, RunResult]
) -> dict[tuple[int, int], float]:
    """benefit[i, j] from the base and pair runs (``run name -> result``)."""
    settings = CoverageProfileSettings.of(profile)
    out = {}
    for i, j in pairs:
        gains = [
            results[run_name([], s)].mean_last(settings.last_n)
            - results[run_name([i, j], s)].mean_last(settings.last_n)
            for s in settings.seeds
        ]
        out[(i, j)] = statistics.fmean(gains)
    if any(not math.isfinite(v) for v in out.values()):
        raise ValueError("a pair run produced a non-finite loss")
    return out


def pair_benefits(
    config: ModelConfig,
    profile: LayerProfile,
    pairs: list[tuple[int, int]],
    folder: Path,
    accelerator: str = "cpu",
    workers: int = 1,
    cache_dir: str | None = None,
    quiet: bool = False,
) -> dict[tuple[int, int], float]:
    """benefit[i, j] (both layers high) with the profile's own settings and seeds, reusing its base runs."""
    specs = pair_specs(config, profile, pairs, folder)
    progress = Progress("interactions", len(specs), sum(s.steps for s in specs), workers, quiet=quiet)
    results = train_all(specs, accelerator, workers, cache_dir, progress)
    return pair_benefits_from_results(profile, pairs, {s.name: results[s.key] for s in specs})

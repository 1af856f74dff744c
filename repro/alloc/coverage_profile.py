"""Coverage-benefit profile (spec section 3): what upgrading one layer to high coverage buys early on.

Base run: every layer low. Upgrade run l: layer l high, the others low (or a contiguous group of
g layers at once: ceil(L/g) + 1 runs). Each run trains T_early steps from the same init seed;
its loss is the mean of its last n evaluations. ``benefit[l] = loss_base - loss_up(l)``, averaged
over seeds (std across seeds is recorded). A group's benefit is spread over its layers
(``group_spread``: 'divide' gives each layer benefit/|group|, 'copy' gives each the whole).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from repro.run_config import RunConfig

from .budget import BudgetLevels, level_to_width
from .profile import LayerProfile
from .training_runs import RunSpec, mean_last, run_name, train_runs


@dataclass(frozen=True)
class CoverageProfileSettings:
    steps: int  # T_early: optimizer steps of every run
    seeds: tuple[int, ...] = (0, 1)  # S_profile seeds; each seed = one init and one data order
    eval_every: int = 10  # evaluate the validation loss every this many steps
    last_n: int = 3  # loss of a run = mean of its last n evaluations
    group_size: int = 1  # g: upgrade contiguous groups of g layers (1 = one run per layer)
    group_spread: Literal["divide", "copy"] = "divide"  # how a group's benefit is spread over its layers
    schedule_steps: int | None = None  # lr schedule length (the full run's steps); None = T_early

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every", "last_n", "group_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"coverage profile {name}={value!r}: must be a positive integer")
        if not self.seeds:
            raise ValueError("coverage profile seeds: give at least one seed")
        if self.steps // self.eval_every < self.last_n:
            raise ValueError(
                f"coverage profile: {self.steps} steps with eval_every={self.eval_every} give "
                f"{self.steps // self.eval_every} evaluations, fewer than last_n={self.last_n}"
            )
        if self.group_spread not in ("divide", "copy"):
            raise ValueError(f"coverage profile group_spread={self.group_spread!r}: allowed 'divide', 'copy'")
        if self.schedule_steps is not None and self.schedule_steps < self.steps:
            raise ValueError(
                f"coverage profile schedule_steps={self.schedule_steps}: must be >= steps={self.steps} "
                "(the profile runs are an early part of a run of that length)"
            )


def layer_groups(n_layer: int, group_size: int) -> list[list[int]]:
    return [list(range(start, min(n_layer, start + group_size))) for start in range(0, n_layer, group_size)]


def specs_for_sets(
    high_sets: list[list[int]], n_layer: int, high_w: int, low_w: int, settings: CoverageProfileSettings
) -> list[RunSpec]:
    """One run per (seed, set of high layers), the other layers low; seeds outermost."""
    specs = []
    for seed in settings.seeds:
        for high in high_sets:
            widths = tuple(high_w if layer in high else low_w for layer in range(n_layer))
            specs.append(
                RunSpec(run_name(high, seed), widths, seed, settings.steps, settings.eval_every, settings.schedule_steps)
            )
    return specs


def upgrade_specs(n_layer: int, high_w: int, low_w: int, settings: CoverageProfileSettings) -> list[RunSpec]:
    """Every run of the profile: per seed, the base run (all low) then one upgrade run per group."""
    return specs_for_sets([[]] + layer_groups(n_layer, settings.group_size), n_layer, high_w, low_w, settings)


def run_losses(
    run_config: RunConfig,
    specs: list[RunSpec],
    runs_dir: Path,
    datamodule,
    last_n: int,
    accelerator: str = "cpu",
    label: str = "coverage",
    workers: int = 1,
    threads: int | None = None,
    quiet: bool = False,
) -> dict[str, dict[str, Any]]:
    """Train (or reuse) every run; returns name -> result with its 'loss' (mean of the last n evaluations)."""
    results = train_runs(run_config, specs, runs_dir, datamodule, accelerator, workers, threads, label, quiet=quiet)
    for name, result in results.items():
        result["loss"] = mean_last(result["val_curve"], last_n, name)
    return results


def coverage_benefit_profile(
    run_config: RunConfig,
    levels: BudgetLevels,
    settings: CoverageProfileSettings,
    runs_dir: Path,
    accelerator: str = "cpu",
    datamodule=None,
    workers: int = 1,
    threads: int | None = None,
    quiet: bool = False,
) -> LayerProfile:
    """Measure the coverage-benefit profile of the config's model (L + 1 runs per seed, or fewer with groups)."""
    shape = run_config.shape_config()
    n_layer = shape.n_layer
    high_w = level_to_width(levels.high, shape, levels.unit)
    low_w = level_to_width(levels.low, shape, levels.unit)
    datamodule = datamodule or run_config.datamodule()
    datamodule.setup("fit")
    specs = upgrade_specs(n_layer, high_w, low_w, settings)
    results = run_losses(run_config, specs, runs_dir, datamodule, settings.last_n, accelerator,
                         workers=workers, threads=threads, quiet=quiet)
    groups = layer_groups(n_layer, settings.group_size)
    per_seed: dict[str, list[float]] = {}
    base_losses: dict[str, float] = {}
    for seed in settings.seeds:
        base = results[run_name([], seed)]["loss"]
        values = [0.0] * n_layer
        for group in groups:
            gain = base - results[run_name(group, seed)]["loss"]
            share = gain / len(group) if settings.group_spread == "divide" else gain
            for layer in group:
                values[layer] = share
        per_seed[str(seed)] = values
        base_losses[str(seed)] = base
    columns = list(zip(*per_seed.values()))
    mean = [statistics.fmean(c) for c in columns]
    std = [statistics.stdev(c) for c in columns] if len(settings.seeds) > 1 else None
    total_wall = sum(r["wall_s"] for r in results.values())
    return LayerProfile(
        kind="coverage_benefit",
        values=mean,
        std=std,
        per_seed=per_seed,
        model=run_config.gpt_config(datamodule.vocab_size, **{_list_field(shape): [low_w] * n_layer}).to_dict(),
        meta={
            "source": run_config.path,
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
            "runs": len(specs),
            "runs_dir": str(runs_dir),
            "base_loss": base_losses,
            "run_losses": {name: r["loss"] for name, r in results.items()},
            "tokens_per_run": settings.steps * datamodule.batch_size * datamodule.block_size,
            "training_wall_s": total_wall,
            "workers": workers,
        },
    )


def _list_field(shape) -> str:
    return "rope_dims" if shape.attention == "mha" else "qk_rope_head_dim"


def profile_settings_of(profile: LayerProfile) -> CoverageProfileSettings:
    """The settings a coverage-benefit profile was measured with (from its meta)."""
    meta = profile.meta
    return CoverageProfileSettings(
        steps=meta["steps"], seeds=tuple(meta["seeds"]), eval_every=meta["eval_every"], last_n=meta["last_n"],
        schedule_steps=meta.get("schedule_steps"),
    )


def pair_specs(profile: LayerProfile, pairs: list[tuple[int, int]], with_base: bool = True) -> list[RunSpec]:
    """The runs of benefit[i, j]: per seed, (the base run and) one run per pair with both layers high."""
    sets = ([[]] if with_base else []) + [sorted(p) for p in pairs]
    return specs_for_sets(sets, profile.n_layer, profile.meta["high_width"], profile.meta["low_width"],
                          profile_settings_of(profile))


def pair_benefits(
    run_config: RunConfig,
    profile: LayerProfile,
    pairs: list[tuple[int, int]],
    runs_dir: Path,
    accelerator: str = "cpu",
    datamodule=None,
    workers: int = 1,
    quiet: bool = False,
) -> dict[tuple[int, int], float]:
    """benefit[i, j] (both layers high) with the profile's own settings and seeds, reusing its base runs."""
    settings = profile_settings_of(profile)
    datamodule = datamodule or run_config.datamodule()
    datamodule.setup("fit")
    results = run_losses(run_config, pair_specs(profile, pairs), runs_dir, datamodule, settings.last_n, accelerator,
                         label="interactions", workers=workers, quiet=quiet)
    out = {}
    for i, j in pairs:
        gains = [results[run_name([], s)]["loss"] - results[run_name([i, j], s)]["loss"] for s in settings.seeds]
        out[(i, j)] = statistics.fmean(gains)
    if any(not math.isfinite(v) for v in out.values()):
        raise ValueError("a pair run produced a non-finite loss")
    return out

"""The plan of Table 1: for each architecture, the model family, the budget levels, and every run
of both stages (profiles and the reference; then the rows, the interaction pairs and the extra
budgets), as run specs of the engine."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from repro.alloc.allocation import (
    METHODS,
    Allocation,
    allocate,
    random_allocations,
    top_k_layers,
)
from repro.alloc.budget import BudgetLevels, default_levels, level_to_width, num_high_layers
from repro.alloc.coverage_profile import (
    CoverageProfileSettings,
    early_eval_every,
    early_steps,
    layer_groups,
    pair_specs,
    upgrade_specs,
)
from repro.alloc.profile import LayerProfile
from repro.models.config import GPTConfig
from repro.runs import RunSpec
from repro.runs.model_config import ModelConfig, load_model_config

from .settings import Table1Settings

ROW_METHODS = METHODS  # the table's rows: every budget-matched method, then the reference points


@dataclass(frozen=True)
class ArchPlan:
    """One architecture's half of the experiment: configs, levels, folders, schedule."""

    arch: str  # 'mha' or 'mla'
    target: ModelConfig  # the deeper member (the table's rows train it)
    source: ModelConfig  # the shallower member (its profile is transferred)
    levels: BudgetLevels  # high, low, budget
    out: Path  # <out>/<arch>
    steps: int  # optimizer steps of a row run
    eval_every: int  # validation interval of a row run
    profile: CoverageProfileSettings  # the coverage-benefit profiles of both members

    @property
    def runs_dir(self) -> Path:
        return self.out / "runs"

    @property
    def profiles_dir(self) -> Path:
        return self.out / "profiles"

    def profile_dir(self, member: str) -> Path:
        return self.out / f"profile_{member}"

    @property
    def shape(self) -> GPTConfig:
        return self.target.shape_config()

    def width(self, level: float, config: ModelConfig | None = None) -> int:
        return level_to_width(level, (config or self.target).shape_config(), self.levels.unit)

    @property
    def reference_widths(self) -> list[int]:
        return [self.width(self.levels.high)] * self.shape.n_layer

    def row_spec(self, widths: list[int], seed: int, reference: bool = False) -> RunSpec:
        """A row run: the target with these widths (equal allocations share runs)."""
        name = widths_name(widths, seed)
        return RunSpec.make(
            name,
            self.runs_dir,
            self.target.path,
            seed,
            self.steps,
            self.eval_every,
            {f"model.gpt.{self.target.width_field}": list(widths)},
            save_checkpoint=reference,
            label=f"{self.arch} row {name}",
        )

    def profile_specs(self, member: str) -> list[RunSpec]:
        config = self.target if member == "target" else self.source
        n = config.shape_config().n_layer
        return upgrade_specs(
            config,
            [[]] + layer_groups(n, 1),
            self.width(self.levels.high, config),
            self.width(self.levels.low, config),
            self.profile,
            self.profile_dir(member),
            label=f"{self.arch} {member} profile ",
        )


def widths_name(widths: list[int] | tuple[int, ...], seed: int) -> str:
    """Run name of a row run: its per-layer widths and seed."""
    return "w" + "-".join(str(w) for w in widths) + f"-s{seed}"


def make_plan(settings: Table1Settings, arch: str, out: Path) -> ArchPlan:
    target = load_model_config(settings.target[arch])
    source = load_model_config(settings.source[arch])
    for name, config in (("target", target), ("source", source)):
        config.check_trainable_by_experiment(f"table1 {name}.{arch}")
        if config.shape_config().attention != arch:
            raise ValueError(
                f"table1 settings {settings.path!r}: {name}.{arch} = {config.path!r} has "
                f"attention={config.shape_config().attention!r}"
            )
    t_shape, s_shape = target.shape_config(), source.shape_config()
    if s_shape.n_layer >= t_shape.n_layer:
        raise ValueError(
            f"table1 {arch}: the source ({source.path}, {s_shape.n_layer} layers) must be shallower than "
            f"the target ({target.path}, {t_shape.n_layer} layers)"
        )
    if t_shape.rope_reference_dim != s_shape.rope_reference_dim:  # head_dim (MHA), d_nope (MLA)
        raise ValueError(
            f"table1 {arch}: source and target are not one family (width per head {s_shape.rope_reference_dim} vs "
            f"{t_shape.rope_reference_dim})"
        )
    if target.data != source.data:
        raise ValueError(
            f"table1 {arch}: source and target must share the data section (same corpus and tokenizer)"
        )
    levels = default_levels(t_shape)
    num_high_layers(t_shape.n_layer, levels)  # fail early on an infeasible budget
    num_high_layers(s_shape.n_layer, levels)
    early = early_steps(settings.steps, settings.profile_fraction)
    profile_eval = early_eval_every(early, settings.profile_evals)
    profile = CoverageProfileSettings(
        steps=early,
        seeds=settings.profile_seeds,
        eval_every=profile_eval,
        last_n=min(settings.profile_last_n, early // profile_eval),
        schedule_steps=settings.steps if settings.profile_lr_schedule == "full-run" else None,
    )
    return ArchPlan(arch, target, source, levels, out / arch, settings.steps, settings.eval_interval, profile)


def stage1_specs(plan: ArchPlan, settings: Table1Settings) -> list[RunSpec]:
    """The profiles of both members and the all-high reference (the all-high row's first seed, kept
    as a checkpoint for the phase-off profile)."""
    reference = plan.row_spec(plan.reference_widths, settings.seeds[0], reference=True)
    return [reference] + plan.profile_specs("target") + plan.profile_specs("source")


def row_allocations(
    plan: ArchPlan,
    settings: Table1Settings,
    benefit: LayerProfile,
    transferred: LayerProfile,
    phase_off: LayerProfile,
) -> list[Allocation]:
    out = []
    for method in ROW_METHODS:
        if method == "random-k":
            out.extend(random_allocations(plan.shape, plan.levels, settings.random_draws, seed=0))
        else:
            out.append(
                allocate(
                    method,
                    plan.shape,
                    plan.levels,
                    benefit=benefit,
                    phase_off=phase_off,
                    transferred=transferred,
                )
            )
    return out


def sweep_allocations(plan: ArchPlan, settings: Table1Settings, benefit: LayerProfile) -> list[Allocation]:
    """Allocations at the extra budgets (k high layers) of the quality-storage-compute figure (MLA)."""
    if plan.arch != "mla":
        return []
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


def interaction_pairs(settings: Table1Settings, benefit: LayerProfile) -> list[tuple[int, int]]:
    if settings.interaction_top < 2:
        return []
    return list(combinations(top_k_layers(benefit.values, settings.interaction_top), 2))


def stage2_specs(
    plan: ArchPlan,
    settings: Table1Settings,
    allocations: list[Allocation],
    sweep: list[Allocation],
    benefit: LayerProfile,
    pairs: list[tuple[int, int]],
) -> list[RunSpec]:
    """Every allocation for every seed (equal allocations share runs), the extra budgets, and the
    pair runs of the interaction terms (next to the target profile's runs, whose base they share)."""
    specs: dict[str, RunSpec] = {}
    for a in allocations:
        for seed in settings.seeds:
            reference = a.widths == plan.reference_widths and seed == settings.seeds[0]
            specs.setdefault(widths_name(a.widths, seed), plan.row_spec(a.widths, seed, reference))
    for a in sweep:
        for seed in settings.sweep_seeds:
            specs.setdefault(widths_name(a.widths, seed), plan.row_spec(a.widths, seed))
    pair_runs = pair_specs(
        plan.target,
        benefit,
        pairs,
        plan.profile_dir("target"),
        with_base=False,
        label=f"{plan.arch} target pair ",
    )
    return list(specs.values()) + pair_runs


def seeds_of(allocation: Allocation, settings: Table1Settings) -> tuple[int, ...]:
    return settings.sweep_seeds if "sweep_k" in allocation.record else settings.seeds

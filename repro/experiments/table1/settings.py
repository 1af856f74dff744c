"""Settings of ``make reproduce-table1``: one YAML per scale
(``paper_configs/experiments/table1/<scale>.yaml``), read by the engine's settings loader.

The model family (target and source members, fixed width and MLA) lives in model config files
that these settings name (paths relative to the settings file). The settings own the schedule of
every run (steps, evaluation interval, seeds) and say how the experiment is run around the
family: profile lengths, random draws, the extra budgets of the quality-storage-compute figure,
workers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from repro.alloc.allocation import BUDGET_MATCHED
from repro.alloc.coverage_profile import EARLY_FRACTION, EVALUATIONS, LAST_N, SEEDS
from repro.arguments import NonNegativeInt, PositiveFloat, PositiveInt, Probability, check_fields
from repro.experiments.kit.settings import ConfigPath, load_settings, shipped_settings

SCALES = ("smoke", "cpu-quick", "cpu", "gpu", "paper")
ARCHITECTURES = ("mha", "mla")
SWEEP_METHODS = ("profiled", "uniform", "first-k", "last-k", "spaced-k")


@dataclass(frozen=True)
class Table1Settings:
    scale: Literal[SCALES]
    """the name written into the results"""
    target: dict[str, ConfigPath]
    """arch ('mha', 'mla') -> model config of the target (deeper) member"""
    source: dict[str, ConfigPath]
    """arch -> model config of the source (smaller) family member"""
    steps: PositiveInt
    """optimizer steps of a row run (the full run whose fraction the profiles train)"""
    seeds: tuple[NonNegativeInt, ...] = (0, 1, 2)
    """one init seed and data order per seed, shared by every row"""
    eval_every: PositiveInt = 50
    """validation interval of the Table 1 runs (steps)"""
    profile_fraction: Probability = EARLY_FRACTION
    """T_early = this fraction of the full run's steps"""
    profile_seeds: tuple[NonNegativeInt, ...] = SEEDS
    """S_profile seeds of the coverage-benefit profiles"""
    profile_evals: PositiveInt = EVALUATIONS
    """evaluations per profile run (eval_every = T_early / this)"""
    profile_last_n: PositiveInt = LAST_N
    """a profile run's loss = mean of its last n evaluations"""
    profile_lr_schedule: Literal["full-run", "early-run"] = "full-run"
    """see repro profile coverage --help"""
    transfer_method: Literal["linear", "nearest"] = "linear"
    """interpolation of the source profile by depth"""
    random_draws: PositiveInt = 2
    """R seeded random-k draws (each trained for every seed)"""
    interaction_top: NonNegativeInt = 3
    """interaction terms among the top-m target layers (0 = skip)"""
    sweep_high_layers: tuple[NonNegativeInt, ...] = ()
    """extra budgets (as k = number of high layers) for the MLA figure"""
    sweep_methods: tuple[str, ...] = ("profiled", "uniform")
    """methods trained at the extra budgets"""
    sweep_seeds: tuple[NonNegativeInt, ...] = (0,)
    """seeds of the extra-budget runs"""
    accelerator: Literal["cpu", "gpu"] = "cpu"
    """where every run trains"""
    workers: PositiveInt = 2
    """runs trained side by side (CPU: each gets cores/workers threads)"""
    runs_per_gpu: PositiveInt = 1
    """GPU: runs sharing each GPU (small models leave a GPU idle); all GPUs are used"""
    architectures: tuple[Literal[ARCHITECTURES], ...] = ARCHITECTURES
    """which halves of the table to run"""
    target_difference: float = 0.01
    """the difference (nats) the power figures ask about"""
    max_epochs_over_data: PositiveFloat | None = None
    """a run's epochs over its training split, at most"""
    path: str = field(default="", compare=False)
    """the YAML these settings came from"""

    def __post_init__(self) -> None:
        where = f"table1 settings {self.path!r}" if self.path else "table1 settings"
        check_fields(self, f"{where}: ", skip=("target", "source"))  # each field's type and range
        if not self.architectures:
            raise ValueError(f"{where}: architectures=[]: give at least one of {ARCHITECTURES}")
        for name in ("target", "source"):
            value = getattr(self, name)
            missing = [a for a in self.architectures if not isinstance(value, dict) or a not in value]
            if missing:
                raise ValueError(
                    f"{where}: {name} has no config for {missing}; give {name}: {{mha: <yaml>, mla: <yaml>}}"
                )
        for name in ("seeds", "profile_seeds", "sweep_seeds"):
            value = getattr(self, name)
            if not value and name != "sweep_seeds":
                raise ValueError(f"{where}: {name}=[]: give at least one seed")
            if len(set(value)) != len(value):
                raise ValueError(f"{where}: {name}={list(value)!r}: seeds repeat")
        if self.steps % min(self.eval_every, self.steps):
            raise ValueError(
                f"{where}: steps={self.steps} is not a multiple of eval_every={self.eval_every}; the last "
                "evaluation must fall on the final step"
            )
        if self.interaction_top == 1:
            raise ValueError(f"{where}: interaction_top=1: 0 (skip) or an integer >= 2")
        if self.profile_last_n > self.profile_evals:
            raise ValueError(
                f"{where}: profile_last_n={self.profile_last_n} > profile_evals={self.profile_evals}"
            )
        bad = [m for m in self.sweep_methods if m not in SWEEP_METHODS or m not in BUDGET_MATCHED]
        if bad:
            raise ValueError(
                f"{where}: sweep_methods={list(self.sweep_methods)!r}: allowed {', '.join(SWEEP_METHODS)}"
            )

    @property
    def eval_interval(self) -> int:
        """The validation interval of a row run (capped at its steps)."""
        return min(self.eval_every, self.steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_table1_settings(path, **overrides: Any) -> Table1Settings:
    return load_settings(Table1Settings, path, "table1 settings", **overrides)


def settings_path(scale: str):
    return shipped_settings("table1", scale, SCALES)

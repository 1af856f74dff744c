"""Settings of ``make reproduce-table1``: one YAML per scale
(``paper_configs/experiments/table1/<scale>.yaml``), read by the engine's settings loader.

The model family (target and source members, fixed width and MLA) lives in model config files
that these settings name (paths relative to the settings file). The settings own the schedule of
every run (steps, evaluation interval, seeds) and say how the experiment is run around the
family: profile lengths, random draws, the extra budgets of the quality-storage-compute figure,
workers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from repro.alloc.allocation import BUDGET_MATCHED
from repro.alloc.coverage_profile import EARLY_FRACTION, EVALUATIONS, LAST_N, SEEDS
from repro.experiments.kit.settings import ConfigPath, load_settings, shipped_settings

SCALES = ("smoke", "cpu-quick", "cpu", "gpu", "paper")
ARCHITECTURES = ("mha", "mla")
SWEEP_METHODS = ("profiled", "uniform", "first-k", "last-k", "spaced-k")


@dataclass(frozen=True)
class Table1Settings:
    scale: Literal["smoke", "cpu-quick", "cpu", "gpu", "paper"]
    """the name written into the results"""
    target: dict[str, ConfigPath]
    """arch ('mha', 'mla') -> model config of the target (deeper) member"""
    source: dict[str, ConfigPath]
    """arch -> model config of the source (smaller) family member"""
    steps: int
    """optimizer steps of a row run (the full run whose fraction the profiles train)"""
    seeds: tuple[int, ...] = (0, 1, 2)
    """one init seed and data order per seed, shared by every row"""
    eval_every: int = 50
    """validation interval of the Table 1 runs (steps)"""
    profile_fraction: float = EARLY_FRACTION
    """T_early = this fraction of the full run's steps"""
    profile_seeds: tuple[int, ...] = SEEDS
    """S_profile seeds of the coverage-benefit profiles"""
    profile_evals: int = EVALUATIONS
    """evaluations per profile run (eval_every = T_early / this)"""
    profile_last_n: int = LAST_N
    """a profile run's loss = mean of its last n evaluations"""
    profile_lr_schedule: Literal["full-run", "early-run"] = "full-run"
    """see repro profile coverage --help"""
    transfer_method: Literal["linear", "nearest"] = "linear"
    """interpolation of the source profile by depth"""
    random_draws: int = 2
    """R seeded random-k draws (each trained for every seed)"""
    interaction_top: int = 3
    """interaction terms among the top-m target layers (0 = skip)"""
    sweep_high_layers: tuple[int, ...] = ()
    """extra budgets (as k = number of high layers) for the MLA figure"""
    sweep_methods: tuple[str, ...] = ("profiled", "uniform")
    """methods trained at the extra budgets"""
    sweep_seeds: tuple[int, ...] = (0,)
    """seeds of the extra-budget runs"""
    accelerator: Literal["cpu", "gpu"] = "cpu"
    """where every run trains"""
    workers: int = 2
    """runs trained side by side (CPU: each gets cores/workers threads)"""
    runs_per_gpu: int = 1
    """GPU: runs sharing each GPU (small models leave a GPU idle); all GPUs are used"""
    architectures: tuple[str, ...] = ARCHITECTURES
    """which halves of the table to run"""
    target_difference: float = 0.01
    """the difference (nats) the power figures ask about"""
    max_epochs_over_data: float | None = None
    """a run's epochs over its training split, at most"""
    path: str = field(default="", compare=False)
    """the YAML these settings came from"""

    def __post_init__(self) -> None:
        where = f"table1 settings {self.path!r}" if self.path else "table1 settings"
        if self.scale not in SCALES:
            raise ValueError(f"{where}: scale={self.scale!r}; allowed {SCALES}")
        bad = [a for a in self.architectures if a not in ARCHITECTURES]
        if bad or not self.architectures:
            raise ValueError(
                f"{where}: architectures={list(self.architectures)!r}; allowed a non-empty subset of "
                f"{ARCHITECTURES}"
            )
        for name in ("target", "source"):
            value = getattr(self, name)
            missing = [a for a in self.architectures if not isinstance(value, dict) or a not in value]
            if missing:
                raise ValueError(
                    f"{where}: {name} has no config for {missing}; give {name}: {{mha: <yaml>, mla: <yaml>}}"
                )
        for name in ("seeds", "profile_seeds", "sweep_seeds"):
            value = getattr(self, name)
            if (not value and name != "sweep_seeds") or any(not isinstance(s, int) or s < 0 for s in value):
                raise ValueError(f"{where}: {name}={list(value)!r}: give non-negative integer seeds")
            if len(set(value)) != len(value):
                raise ValueError(f"{where}: {name}={list(value)!r}: seeds repeat")
        for name in (
            "steps",
            "eval_every",
            "profile_evals",
            "profile_last_n",
            "random_draws",
            "workers",
            "runs_per_gpu",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{where}: {name}={value!r}: must be a positive integer")
        if self.steps % min(self.eval_every, self.steps):
            raise ValueError(
                f"{where}: steps={self.steps} is not a multiple of eval_every={self.eval_every}; the last "
                "evaluation must fall on the final step"
            )
        if not isinstance(self.interaction_top, int) or self.interaction_top < 0 or self.interaction_top == 1:
            raise ValueError(
                f"{where}: interaction_top={self.interaction_top!r}: 0 (skip) or an integer >= 2"
            )
        if not 0.0 < self.profile_fraction <= 1.0:
            raise ValueError(f"{where}: profile_fraction={self.profile_fraction!r}: must be in (0, 1]")
        if self.profile_last_n > self.profile_evals:
            raise ValueError(
                f"{where}: profile_last_n={self.profile_last_n} > profile_evals={self.profile_evals}"
            )
        if self.profile_lr_schedule not in ("full-run", "early-run"):
            raise ValueError(
                f"{where}: profile_lr_schedule={self.profile_lr_schedule!r}; allowed 'full-run', 'early-run'"
            )
        if self.transfer_method not in ("linear", "nearest"):
            raise ValueError(
                f"{where}: transfer_method={self.transfer_method!r}; allowed 'linear', 'nearest'"
            )
        if any(not isinstance(k, int) or k < 0 for k in self.sweep_high_layers):
            raise ValueError(
                f"{where}: sweep_high_layers={list(self.sweep_high_layers)!r}: non-negative integers"
            )
        bad = [m for m in self.sweep_methods if m not in SWEEP_METHODS or m not in BUDGET_MATCHED]
        if bad:
            raise ValueError(
                f"{where}: sweep_methods={list(self.sweep_methods)!r}: allowed {', '.join(SWEEP_METHODS)}"
            )
        if self.max_epochs_over_data is not None and not self.max_epochs_over_data > 0:
            raise ValueError(
                f"{where}: max_epochs_over_data={self.max_epochs_over_data!r}: a positive number or null"
            )
        if self.accelerator not in ("cpu", "gpu"):
            raise ValueError(f"{where}: accelerator={self.accelerator!r}; allowed 'cpu', 'gpu'")

    @property
    def eval_interval(self) -> int:
        """The validation interval of a row run (capped at its steps)."""
        return min(self.eval_every, self.steps)

    def with_overrides(self, **overrides: Any) -> Table1Settings:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_table1_settings(path, **overrides: Any) -> Table1Settings:
    return load_settings(Table1Settings, path, "table1 settings", **overrides)


def settings_path(scale: str):
    return shipped_settings("table1", scale, SCALES)

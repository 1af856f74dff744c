"""Settings of ``make reproduce-table1``: one YAML per scale (``paper_configs/table1/<scale>.yaml``).

The model family (target and source members, fixed width and MLA) lives in ordinary
``repro fit`` configs that these settings name; steps and batch are those configs' own. The
settings say how the experiment is run around them: seeds, profile lengths, random draws, the
extra budgets of the quality-storage-compute figure, workers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from repro.files import read_settings_fields

SCALES = ("smoke", "cpu", "paper")
ARCHITECTURES = ("mha", "mla")


@dataclass(frozen=True)
class Table1Settings:
    scale: str  # smoke | cpu | paper: the name written into the results
    target: dict[str, str]  # arch ('mha', 'mla') -> repro fit YAML of the target (deeper) model
    source: dict[str, str]  # arch -> repro fit YAML of the source (smaller) family member
    seeds: tuple[int, ...] = (0, 1, 2)  # one init seed and data order per seed, shared by every row
    eval_every: int = 50  # validation interval of the Table 1 runs (steps)
    profile_fraction: float = 0.15  # T_early = this fraction of the full run's steps
    profile_seeds: tuple[int, ...] = (0, 1)  # S_profile seeds of the coverage-benefit profiles
    profile_evals: int = 6  # evaluations per profile run (eval_every = T_early / this)
    profile_last_n: int = 3  # a profile run's loss = mean of its last n evaluations
    profile_lr_schedule: str = "full-run"  # full-run | early-run (see repro profile coverage --help)
    transfer_method: str = "linear"  # linear | nearest interpolation of the source profile by depth
    random_draws: int = 2  # R seeded random-k draws (each trained for every seed)
    interaction_top: int = 3  # interaction terms among the top-m target layers (0 = skip)
    sweep_high_layers: tuple[int, ...] = ()  # extra budgets (as k = number of high layers) for the MLA figure
    sweep_methods: tuple[str, ...] = ("profiled", "uniform")  # methods trained at the extra budgets
    sweep_seeds: tuple[int, ...] = (0,)  # seeds of the extra-budget runs
    accelerator: str = "cpu"  # Lightning accelerator of every run
    workers: int = 2  # runs trained side by side (CPU only; each gets cores/workers threads)
    architectures: tuple[str, ...] = ARCHITECTURES  # which halves of the table to run
    path: str = field(default="", compare=False)  # the YAML these settings came from

    def __post_init__(self) -> None:
        where = f"table1 settings {self.path!r}" if self.path else "table1 settings"
        if self.scale not in SCALES:
            raise ValueError(f"{where}: scale={self.scale!r}; allowed {SCALES}")
        for name in ("architectures",):
            bad = [a for a in getattr(self, name) if a not in ARCHITECTURES]
            if bad or not getattr(self, name):
                raise ValueError(f"{where}: {name}={list(getattr(self, name))!r}; allowed a non-empty subset of {ARCHITECTURES}")
        for name in ("target", "source"):
            value = getattr(self, name)
            missing = [a for a in self.architectures if not isinstance(value, dict) or a not in value]
            if missing:
                raise ValueError(f"{where}: {name} has no config for {missing}; give {name}: {{mha: <yaml>, mla: <yaml>}}")
        for name in ("seeds", "profile_seeds", "sweep_seeds"):
            value = getattr(self, name)
            if not value and name != "sweep_seeds" or any(not isinstance(s, int) or s < 0 for s in value):
                raise ValueError(f"{where}: {name}={list(value)!r}: give non-negative integer seeds")
            if len(set(value)) != len(value):
                raise ValueError(f"{where}: {name}={list(value)!r}: seeds repeat")
        for name in ("eval_every", "profile_evals", "profile_last_n", "random_draws", "workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{where}: {name}={value!r}: must be a positive integer")
        if not isinstance(self.interaction_top, int) or self.interaction_top < 0 or self.interaction_top == 1:
            raise ValueError(f"{where}: interaction_top={self.interaction_top!r}: 0 (skip) or an integer >= 2")
        if not 0.0 < self.profile_fraction <= 1.0:
            raise ValueError(f"{where}: profile_fraction={self.profile_fraction!r}: must be in (0, 1]")
        if self.profile_last_n > self.profile_evals:
            raise ValueError(f"{where}: profile_last_n={self.profile_last_n} > profile_evals={self.profile_evals}")
        if self.profile_lr_schedule not in ("full-run", "early-run"):
            raise ValueError(f"{where}: profile_lr_schedule={self.profile_lr_schedule!r}; allowed 'full-run', 'early-run'")
        if self.transfer_method not in ("linear", "nearest"):
            raise ValueError(f"{where}: transfer_method={self.transfer_method!r}; allowed 'linear', 'nearest'")
        if any(not isinstance(k, int) or k < 0 for k in self.sweep_high_layers):
            raise ValueError(f"{where}: sweep_high_layers={list(self.sweep_high_layers)!r}: non-negative integers")
        from repro.alloc.allocation import BUDGET_MATCHED

        bad = [m for m in self.sweep_methods if m not in BUDGET_MATCHED or m in ("random-k", "transferred", "phase-off-k", "inverse")]
        if bad:
            raise ValueError(f"{where}: sweep_methods={list(self.sweep_methods)!r}: allowed profiled, uniform, first-k, last-k, spaced-k")

    def with_overrides(self, **overrides: Any) -> "Table1Settings":
        values = {**asdict(self), **{k: v for k, v in overrides.items() if v is not None}}
        return Table1Settings(**_tuples(values))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tuples(values: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def load_table1_settings(path: str | Path) -> Table1Settings:
    path = Path(path)
    doc = read_settings_fields(path, "table1 settings file", {f.name for f in fields(Table1Settings)} - {"path"})
    base = path.parent
    for name in ("target", "source"):  # config paths are relative to the repository root or to the settings file
        if isinstance(doc.get(name), dict):
            doc[name] = {arch: _resolve(p, base) for arch, p in doc[name].items()}
    return Table1Settings(**_tuples(doc), path=str(path))


def _resolve(config: str, base: Path) -> str:
    p = Path(config)
    if p.is_absolute() or p.is_file():
        return str(p)
    return str(base / p) if (base / p).is_file() else str(p)


def settings_path(scale: str, root: str | Path | None = None) -> Path:
    """``<root>/<scale>.yaml``; root defaults to ``paper_configs/table1`` of the working folder, or
    of the repository this package was installed from (editable install) when run elsewhere."""
    if scale not in SCALES:
        raise ValueError(f"SCALE={scale!r}: allowed {SCALES}")
    if root is None:
        root = Path("paper_configs/table1")
        if not root.is_dir():
            beside_package = Path(__file__).resolve().parents[2] / "paper_configs" / "table1"
            root = beside_package if beside_package.is_dir() else root
    return Path(root) / f"{scale}.yaml"

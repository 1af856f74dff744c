"""Settings of ``repro mla-plane``: one YAML per scale (``paper_configs/experiments/mla_plane/<scale>.yaml``).

A pretrained model (``config``'s ``model.pretrained``) converted to latent attention at several KV
cache budgets (fractions of its own bytes per token). At each budget the rows are allocations of the
same cache: MHA2MLA's uniform conversion (every layer the same rotary pairs and latent rank, its
weight SVD), the same with the activation-aware SVD and with the q.k 2-norm pair order, its other
splits of the budget between pairs and latent, and the per-layer allocations by the profiles
(profiled, one lever at a time, inverse, random). Every row zero-shot at each evaluation context;
the ``finetune_methods`` rows (every row at ``finetune_every_row``) and the unconverted model also
after the same short fine-tune.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from repro.arguments import PositiveFloat, PositiveInt, Probability, check_fields
from repro.experiments.kit.settings import ConfigPath, load_settings, shipped_settings

SCALES = ("real", "gpu")
ROW_KINDS = (
    "uniform (weights)",  # MHA2MLA: the main split, weight SVD, highest frequencies
    "uniform",  # the main split, the settings' SVD
    "uniform (2-norm)",  # the main split, the q.k 2-norm pair order
    "uniform (split)",  # the other splits of the budget
    "profiled",
    "profiled-rotary",
    "profiled-rank",
    "inverse",
    "random-k",
)


@dataclass(frozen=True)
class MLAPlaneSettings:
    scale: Literal[SCALES]
    """which settings these are"""
    config: ConfigPath
    """repro fit YAML naming model.pretrained: the profiles' validation text and the rows' test text"""
    finetune_config: ConfigPath
    """repro fit YAML the fine-tunes train on (same model.pretrained; its context and batch)"""
    contexts: tuple[ConfigPath, ...] = ()
    """more evaluation configs (other contexts) for the zero-shot rows (their test chunks)"""
    budgets: tuple[Probability, ...] = (0.5, 0.25, 0.125)
    """KV cache budgets: fractions of the source's elements per token"""
    splits: tuple[tuple[int, ...], ...] = ((8, 4, 16), (4, 2, 8), (2, 1, 4))
    """per budget: rotary pairs per key/value head of its uniform splits; the first is the main split
    (the per-layer allocations keep its mean pairs and mean rank)"""
    rows: tuple[Literal[ROW_KINDS], ...] = ROW_KINDS
    """which rows every budget has"""
    svd: Literal["weights", "activations"] = "activations"
    """the factorization of every row but 'uniform (weights)'"""
    calibration_blocks: PositiveInt = 32
    """blocks of the config's training text for the activation moments and the 2-norm order"""
    random_draws: PositiveInt = 1
    """random-k draws per budget"""
    finetune_methods: tuple[Literal[ROW_KINDS], ...] = ("uniform (weights)", "uniform", "profiled")
    """rows (of the main split) fine-tuned at each of ``finetune_budgets``, beside the unconverted model"""
    finetune_budgets: tuple[PositiveFloat, ...] | None = None
    """the budgets whose rows are fine-tuned (each one of ``budgets``); null: every budget"""
    finetune_every_row: tuple[PositiveFloat, ...] = ()
    """budgets whose every row (every kind and split) is fine-tuned too, beyond ``finetune_methods``"""
    finetune_steps: PositiveInt = 100
    """optimizer steps of every fine-tune"""
    finetune_eval_every: PositiveInt = 25
    """validation interval of the fine-tunes (the loss against steps)"""
    finetune_lr: PositiveFloat = 1e-4
    """peak learning rate of the fine-tunes (warm-up over an eighth of the steps, then cosine)"""
    finetune_batch_size: PositiveInt = 2
    """blocks per fine-tune batch"""
    seeds: tuple[int, ...] = (0,)
    """fine-tune seeds (data order); a chunk's loss is its mean over them"""
    out: str = "results/mla_plane"
    """the results folder (converted models, profiles, runs, the table)"""
    path: str = ""
    """the settings file (set by the loader)"""

    RELATIVE_PATHS = ()  # out is relative to the working folder, as every results folder

    def __post_init__(self) -> None:
        check_fields(self, "")
        if len(self.splits) != len(self.budgets):
            raise ValueError(
                f"splits: {len(self.splits)} entries for {len(self.budgets)} budgets (one per budget)"
            )
        if any(not s for s in self.splits):
            raise ValueError("splits: every budget needs at least its main split")
        if self.finetune_steps % min(self.finetune_eval_every, self.finetune_steps):
            raise ValueError(
                f"finetune_steps={self.finetune_steps} is not a multiple of "
                f"finetune_eval_every={self.finetune_eval_every}"
            )
        missing = [m for m in self.finetune_methods if m not in self.rows]
        if missing:
            raise ValueError(f"finetune_methods {missing}: not among rows {list(self.rows)}")
        for field in ("finetune_budgets", "finetune_every_row"):
            stray = [b for b in getattr(self, field) or () if b not in self.budgets]
            if stray:
                raise ValueError(f"{field} {stray}: not among budgets {list(self.budgets)}")
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ValueError(f"seeds={list(self.seeds)}: one or more distinct seeds")

    def fine_tunes(self, kind: str, budget: float, main_split: bool) -> bool:
        """Whether a row of this kind, budget and split is fine-tuned."""
        if budget in self.finetune_every_row:
            return True
        return (
            main_split and kind in self.finetune_methods and budget in (self.finetune_budgets or self.budgets)
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def settings_path(scale: str):
    return shipped_settings("mla_plane", scale, SCALES)


def load_mla_settings(path, **overrides: Any) -> MLAPlaneSettings:
    return load_settings(MLAPlaneSettings, path, "mla-plane settings", **overrides)

"""Settings of ``make reproduce-clapping``: one YAML per scale
(``paper_configs/experiments/clapping/<scale>.yaml``), read by the engine's settings loader.

The model, data and optimizer come from a model config file (``model``, relative to the settings
file); the settings own the schedule of every run and say what is trained around it (spec
section 7). Two regimes, each with its own grid of methods, compressors and p:

- ``finetune`` (the paper's and AQ-SGD's setting): a base model is pretrained once, in one
  process without compression, on the training plays minus ``finetune_documents``; every row
  then fine-tunes it on those plays (text the base never saw) for a few epochs at
  ``finetune_lr``.
- ``from_scratch`` (the ablation): every row trains the model config from its initialization.

A compressor entry is ``C`` (both directions) or ``F/B`` (forward F, backward B), e.g.
``quant(4)/quant(8)``, AQ-SGD's reference pairing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from jsonargparse.typing import restricted_number_type

from repro.arguments import NonNegativeInt, PositiveFloat, PositiveInt, Probability, check_fields
from repro.experiments.kit.settings import ConfigPath, load_settings, shipped_settings
from repro.pipeline.compressors import build_compressor
from repro.pipeline.options import Placement

SCALES = ("smoke", "cpu", "real", "paper")
REGIMES = ("finetune", "from_scratch")
QuantBits = restricted_number_type("QuantBits", int, [(">=", 2), ("<=", 8)])  # bits of a quantizer
EXPERIMENT_METHODS = ("none", "none_lazy", "direct", "ef21", "aqsgd", "clapping_fc", "clapping_fu")


def split_compressor(entry: str) -> tuple[str, str]:
    """``C`` -> (C, C); ``F/B`` -> (F, B)."""
    fwd, _, bwd = entry.partition("/")
    return fwd.strip(), (bwd or fwd).strip()


@dataclass(frozen=True)
class Grid:
    """The rows of one regime."""

    steps: PositiveInt
    """optimizer steps of every run of this regime"""
    eval_every: PositiveInt
    """validation interval (steps); the last evaluation falls on the final step"""
    methods: tuple[Literal[EXPERIMENT_METHODS], ...] = EXPERIMENT_METHODS
    """rows; none_lazy is method none with p = lazy_p"""
    compressors: tuple[str, ...] = ("topk(0.05)", "quant(4)/quant(8)")
    """'C' both ways, or 'F/B'"""
    clapping_p: tuple[Probability, ...] = (0.25, 0.5, 1.0)
    """p of the clapping_fc and clapping_fu rows"""
    tied_compressors: tuple[str, ...] = ("identity",)
    """the tied embedding/head gradient sum: every row once per entry; identity (exact) first, the others
    compressed with error feedback (their none row is compared with the exact none)"""

    def check(self, where: str) -> None:
        check_fields(self, f"{where}.")  # each field's type and range
        if self.steps % min(self.eval_every, self.steps):
            raise ValueError(f"{where}: steps={self.steps} is not a multiple of eval_every={self.eval_every}")
        if not self.methods:
            raise ValueError(f"{where}.methods=[]: give at least one of {EXPERIMENT_METHODS}")
        for entry in self.compressors:
            fwd, bwd = split_compressor(entry)
            for spec in (fwd, bwd):
                if build_compressor(spec, f"{where}.compressors").is_identity:
                    raise ValueError(
                        f"{where}.compressors: {entry!r} does not compress (the none rows are identity)"
                    )
        if not self.tied_compressors or self.tied_compressors[0] != "identity":
            raise ValueError(
                f"{where}.tied_compressors={list(self.tied_compressors)!r}: must start with identity (the exact sum "
                f"of the reference none row)"
            )
        for spec in self.tied_compressors:
            build_compressor(spec, f"{where}.tied_compressors")


@dataclass(frozen=True)
class ClappingSettings:
    scale: Literal[SCALES]
    """the name written into the results"""
    model: ConfigPath
    """model config of the model, data and optimizer (relative to this file)"""
    finetune: Grid
    """the rows of the fine-tune regime"""
    from_scratch: Grid
    """the rows of the from-scratch ablation"""
    regimes: tuple[Literal[REGIMES], ...] = REGIMES
    """which regimes run"""
    finetune_documents: tuple[str, ...] = ("hamlet", "macbeth")
    """kept from pretraining; rows tune on them"""
    finetune_data: str | None = None
    """or a prepared folder the rows tune on (the base's tokenizer)"""
    finetune_blocks: PositiveInt | None = 320
    """N: fine-tune training blocks (evenly spaced); None = all"""
    finetune_lr: PositiveFloat = 3e-4
    """peak learning rate of the fine-tune rows"""
    finetune_warmup_steps: NonNegativeInt = 5
    """linear warm-up of the fine-tune rows"""
    base_steps: PositiveInt = 1000
    """pretraining steps of the base model (one process, exact)"""
    base_eval_every: PositiveInt = 250
    """validation interval of the base run"""
    val_batches: PositiveInt = 8
    """validation batches per evaluation"""
    seeds: tuple[NonNegativeInt, ...] = (0, 1, 2)
    """init seed and data order, shared by every row"""
    stages: PositiveInt = 4
    """K pipeline stages = processes"""
    micro_batches: PositiveInt = 4
    """M micro-batches per batch"""
    schedule: Literal["gpipe", "1f1b"] = "gpipe"
    """micro-batch schedule"""
    placement: Placement = "linear"
    """where the model's first part runs, the same for every row (auto: v for a tied head that outweighs)"""
    lazy_p: Probability = 0.5
    """p of the none_lazy ablation"""
    warmup_epochs: NonNegativeInt = 1
    """AQ-SGD's exact (warm-up) epochs"""
    bandwidth_mbps: PositiveFloat = 100.0
    """link speed of the link-time bound column (and of the measured one)"""
    link_steps: NonNegativeInt = 0
    """timed steps per row on veth links shaped to bandwidth_mbps (0 = off; root)"""
    link_warmup_steps: NonNegativeInt = 2
    """untimed steps before them"""
    link_repeats: PositiveInt = 1
    """interleaved repeats of every link run; 2 or more give each speed-up its 95 % CI"""
    target_margin: float = 0.02
    """bytes-to-target: the target is none's final loss + this (nats)"""
    minimal_loss: float = 0.02
    """"minimal loss": a row costs at most this much (nats) over none"""
    quant_error_bits: tuple[QuantBits, ...] = (2, 4, 8)
    """bits of the quantizer-error table on real messages"""
    memory_sizes: tuple[PositiveInt, ...] = (1000, 4000, 16000, 64000)
    """dataset sizes N of the memory figure"""
    accelerator: Literal["cpu", "gpu"] = "cpu"
    """where every run trains"""
    max_epochs_over_data: PositiveFloat | None = None
    """base, from_scratch rows: epochs over the data at most"""
    finetune_max_epochs_over_data: PositiveFloat | None = None
    """the fine-tune rows' limit (None: any)"""
    path: str = field(default="", compare=False)
    """the YAML these settings came from"""

    RELATIVE_PATHS = ("finetune_data",)  # folders named relative to the settings file

    def __post_init__(self) -> None:
        where = f"clapping settings {self.path!r}" if self.path else "clapping settings"
        check_fields(self, f"{where}: ", skip=("model", "finetune", "from_scratch"))  # types and ranges
        if not self.regimes:
            raise ValueError(f"{where}: regimes=[]: give at least one of {REGIMES}")
        self.finetune.check(f"{where}: finetune")
        self.from_scratch.check(f"{where}: from_scratch")
        if self.stages < 2:
            raise ValueError(f"{where}: stages={self.stages}: a pipeline needs at least 2 stages")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"{where}: seeds={list(self.seeds)!r}: give distinct seeds, at least one")
        if "finetune" in self.regimes and not self.finetune_documents and not self.finetune_data:
            raise ValueError(
                f"{where}: finetune_documents is empty and finetune_data is not set; name the plays the rows "
                f"fine-tune on, or a prepared folder"
            )
        if self.finetune_documents and self.finetune_data:
            raise ValueError(
                f"{where}: finetune_documents and finetune_data are both set; give finetune_documents: [] with a "
                f"prepared finetune_data folder"
            )
        if not self.memory_sizes:
            raise ValueError(f"{where}: memory_sizes=[]: give at least one dataset size")

    def grid(self, regime: str) -> Grid:
        return self.finetune if regime == "finetune" else self.from_scratch

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def settings_path(scale: str):
    return shipped_settings("clapping", scale, SCALES)


def load_clapping_settings(path, **overrides: Any) -> ClappingSettings:
    return load_settings(ClappingSettings, path, "clapping settings", **overrides)

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

from repro.experiments.kit.settings import ConfigPath, load_settings, shipped_settings
from repro.pipeline.compressors import build_compressor

SCALES = ("smoke", "cpu", "real", "paper")
REGIMES = ("finetune", "from_scratch")
EXPERIMENT_METHODS = ("none", "none_lazy", "direct", "ef21", "aqsgd", "clapping_fc", "clapping_fu")


def split_compressor(entry: str) -> tuple[str, str]:
    """``C`` -> (C, C); ``F/B`` -> (F, B)."""
    fwd, _, bwd = entry.partition("/")
    return fwd.strip(), (bwd or fwd).strip()


@dataclass(frozen=True)
class Grid:
    """The rows of one regime."""

    steps: int
    """optimizer steps of every run of this regime"""
    eval_every: int
    """validation interval (steps); the last evaluation falls on the final step"""
    methods: tuple[str, ...] = EXPERIMENT_METHODS
    """rows; none_lazy is method none with p = lazy_p"""
    compressors: tuple[str, ...] = ("topk(0.05)", "quant(4)/quant(8)")
    """'C' both ways, or 'F/B'"""
    clapping_p: tuple[float, ...] = (0.25, 0.5, 1.0)
    """p of the clapping_fc and clapping_fu rows"""
    # the tied embedding/head gradient sum of each row: every row once per entry; identity (exact) first,
    # the others compressed with error feedback (their none row is compared with the exact none)
    tied_compressors: tuple[str, ...] = ("identity",)

    def check(self, where: str) -> None:
        for name in ("steps", "eval_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{where}.{name}={value!r}: must be a positive integer")
        if self.steps % min(self.eval_every, self.steps):
            raise ValueError(f"{where}: steps={self.steps} is not a multiple of eval_every={self.eval_every}")
        bad = [m for m in self.methods if m not in EXPERIMENT_METHODS]
        if bad or not self.methods:
            raise ValueError(
                f"{where}.methods={list(self.methods)!r}; allowed a non-empty subset of {EXPERIMENT_METHODS}"
            )
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
        for p in self.clapping_p:
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
                raise ValueError(f"{where}: p={p!r}: lazy-sampling probabilities must be in (0, 1]")


@dataclass(frozen=True)
class ClappingSettings:
    scale: Literal["smoke", "cpu", "real", "paper"]
    """the name written into the results"""
    model: ConfigPath
    """model config of the model, data and optimizer (relative to this file)"""
    finetune: Grid
    """the rows of the fine-tune regime"""
    from_scratch: Grid
    """the rows of the from-scratch ablation"""
    regimes: tuple[str, ...] = REGIMES
    """which regimes run"""
    finetune_documents: tuple[str, ...] = ("hamlet", "macbeth")
    """kept from pretraining; rows tune on them"""
    finetune_data: str | None = None
    """or a prepared folder the rows tune on (the base's tokenizer)"""
    finetune_blocks: int | None = 320
    """N: fine-tune training blocks (evenly spaced); None = all"""
    finetune_lr: float = 3e-4
    """peak learning rate of the fine-tune rows"""
    finetune_warmup_steps: int = 5
    """linear warm-up of the fine-tune rows"""
    base_steps: int = 1000
    """pretraining steps of the base model (one process, exact)"""
    base_eval_every: int = 250
    """validation interval of the base run"""
    val_batches: int = 8
    """validation batches per evaluation"""
    seeds: tuple[int, ...] = (0, 1, 2)
    """init seed and data order, shared by every row"""
    stages: int = 4
    """K pipeline stages = processes"""
    micro_batches: int = 4
    """M micro-batches per batch"""
    schedule: Literal["gpipe", "1f1b"] = "gpipe"
    """micro-batch schedule"""
    lazy_p: float = 0.5
    """p of the none_lazy ablation"""
    warmup_epochs: int = 1
    """AQ-SGD's exact (warm-up) epochs"""
    bandwidth_mbps: float = 100.0
    """link speed of the link-time bound column (and of the measured one)"""
    link_steps: int = 0
    """timed steps per row on veth links shaped to bandwidth_mbps (0 = off; root)"""
    link_warmup_steps: int = 2
    """untimed steps before them"""
    link_repeats: int = 1
    """interleaved repeats of every link run; 2 or more give each speed-up its 95 % CI"""
    target_margin: float = 0.02
    """bytes-to-target: the target is none's final loss + this (nats)"""
    minimal_loss: float = 0.02
    """"minimal loss": a row costs at most this much (nats) over none"""
    quant_error_bits: tuple[int, ...] = (2, 4, 8)
    """bits of the quantizer-error table on real messages"""
    memory_sizes: tuple[int, ...] = (1000, 4000, 16000, 64000)
    """dataset sizes N of the memory figure"""
    accelerator: Literal["cpu", "gpu"] = "cpu"
    """where every run trains"""
    max_epochs_over_data: float | None = None
    """base, from_scratch rows: epochs over the data at most"""
    finetune_max_epochs_over_data: float | None = None
    """the fine-tune rows' limit (None: any)"""
    path: str = field(default="", compare=False)
    """the YAML these settings came from"""

    RELATIVE_PATHS = ("finetune_data",)  # folders named relative to the settings file

    def __post_init__(self) -> None:
        where = f"clapping settings {self.path!r}" if self.path else "clapping settings"
        if self.scale not in SCALES:
            raise ValueError(f"{where}: scale={self.scale!r}; allowed {SCALES}")
        if not self.regimes or any(r not in REGIMES for r in self.regimes):
            raise ValueError(
                f"{where}: regimes={list(self.regimes)!r}; allowed a non-empty subset of {REGIMES}"
            )
        self.finetune.check(f"{where}: finetune")
        self.from_scratch.check(f"{where}: from_scratch")
        for name in ("val_batches", "stages", "micro_batches", "base_steps", "base_eval_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{where}: {name}={value!r}: must be a positive integer")
        if self.stages < 2:
            raise ValueError(f"{where}: stages={self.stages}: a pipeline needs at least 2 stages")
        if (
            not self.seeds
            or len(set(self.seeds)) != len(self.seeds)
            or any(not isinstance(s, int) or s < 0 for s in self.seeds)
        ):
            raise ValueError(f"{where}: seeds={list(self.seeds)!r}: give distinct non-negative integers")
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
        for name in ("max_epochs_over_data", "finetune_max_epochs_over_data"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{where}: {name}={value!r}: a positive number or null")
        if not self.finetune_lr > 0:
            raise ValueError(f"{where}: finetune_lr={self.finetune_lr!r}: must be > 0")
        if not 0.0 < float(self.lazy_p) <= 1.0:
            raise ValueError(f"{where}: p={self.lazy_p!r}: lazy-sampling probabilities must be in (0, 1]")
        for name in ("link_steps", "link_warmup_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{where}: {name}={value!r}: must be an integer >= 0")
        if (
            not isinstance(self.link_repeats, int)
            or isinstance(self.link_repeats, bool)
            or self.link_repeats < 1
        ):
            raise ValueError(f"{where}: link_repeats={self.link_repeats!r}: must be a positive integer")
        if not self.bandwidth_mbps > 0:
            raise ValueError(f"{where}: bandwidth_mbps={self.bandwidth_mbps!r}: must be > 0")
        if any(not isinstance(b, int) or not 2 <= b <= 8 for b in self.quant_error_bits):
            raise ValueError(f"{where}: quant_error_bits={list(self.quant_error_bits)!r}: integers 2..8")
        if not self.memory_sizes or any(not isinstance(n, int) or n <= 0 for n in self.memory_sizes):
            raise ValueError(f"{where}: memory_sizes={list(self.memory_sizes)!r}: positive integers")
        if self.accelerator not in ("cpu", "gpu"):
            raise ValueError(f"{where}: accelerator={self.accelerator!r}; allowed 'cpu', 'gpu'")

    def grid(self, regime: str) -> Grid:
        return self.finetune if regime == "finetune" else self.from_scratch

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def settings_path(scale: str):
    return shipped_settings("clapping", scale, SCALES)


def load_clapping_settings(path, **overrides: Any) -> ClappingSettings:
    return load_settings(ClappingSettings, path, "clapping settings", **overrides)

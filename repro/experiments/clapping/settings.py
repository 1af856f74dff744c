"""Settings of ``make reproduce-clapping``: one YAML per scale
(``paper_configs/experiments/clapping/<scale>.yaml``), read by the engine's settings loader.

The model, data and optimizer come from a model config file (``model``, relative to the settings
file); the settings own the schedule of every run and say what grid is trained around it (spec
section 7): methods, compressors, the lazy sampling probabilities, seeds, steps, and the dataset
sizes of the memory figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from repro.pipeline.compressors import build_compressor
from repro.runs.settings import ConfigPath, load_settings, shipped_settings

SCALES = ("smoke", "cpu", "paper")
EXPERIMENT_METHODS = ("none", "none_lazy", "direct", "ef21", "aqsgd", "clapping_fc", "clapping_fu")


@dataclass(frozen=True)
class ClappingSettings:
    scale: Literal["smoke", "cpu", "paper"]  # the name written into the results
    model: ConfigPath  # model config of the model, data and optimizer (relative to this file)
    steps: int = 100  # optimizer steps of every run
    eval_every: int = 25  # validation interval (steps); the table's loss is the last validation
    val_batches: int = 8  # validation batches per evaluation
    seeds: tuple[int, ...] = (0, 1)  # init seed and data order, shared by every row
    stages: int = 4  # K pipeline stages = processes
    micro_batches: int = 4  # M micro-batches per batch
    schedule: Literal["gpipe", "1f1b"] = "gpipe"  # micro-batch schedule
    methods: tuple[str, ...] = EXPERIMENT_METHODS  # rows; none_lazy is method none with p = lazy_p
    compressors: tuple[str, ...] = ("topk(0.05)", "topk(0.1)", "quant(4)", "quant(2)")  # both directions
    clapping_p: tuple[float, ...] = (0.25, 0.5, 1.0)  # p of the clapping_fc and clapping_fu rows
    lazy_p: float = 0.5  # p of the none_lazy ablation
    warmup_epochs: int = 1  # AQ-SGD warm-up (uncompressed) epochs
    bandwidth_mbps: float = 100.0  # link speed of the emulated-network-time column
    memory_sizes: tuple[int, ...] = (1000, 4000, 16000, 64000)  # dataset sizes N of the memory figure
    accelerator: Literal["cpu", "gpu"] = "cpu"  # where every run trains
    path: str = field(default="", compare=False)  # the YAML these settings came from

    def __post_init__(self) -> None:
        where = f"clapping settings {self.path!r}" if self.path else "clapping settings"
        if self.scale not in SCALES:
            raise ValueError(f"{where}: scale={self.scale!r}; allowed {SCALES}")
        for name in ("steps", "eval_every", "val_batches", "stages", "micro_batches"):
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
        bad = [m for m in self.methods if m not in EXPERIMENT_METHODS]
        if bad or not self.methods:
            raise ValueError(
                f"{where}: methods={list(self.methods)!r}; allowed a non-empty subset of {EXPERIMENT_METHODS}"
            )
        for spec in self.compressors:
            if build_compressor(spec, f"{where}: compressors").is_identity:
                raise ValueError(
                    f"{where}: compressors: {spec!r} does not compress (the none rows are identity)"
                )
        for p in (*self.clapping_p, self.lazy_p):
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
                raise ValueError(f"{where}: p={p!r}: lazy-sampling probabilities must be in (0, 1]")
        if self.schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"{where}: schedule={self.schedule!r}; allowed 'gpipe', '1f1b'")
        if not self.bandwidth_mbps > 0:
            raise ValueError(f"{where}: bandwidth_mbps={self.bandwidth_mbps!r}: must be > 0")
        if not self.memory_sizes or any(not isinstance(n, int) or n <= 0 for n in self.memory_sizes):
            raise ValueError(f"{where}: memory_sizes={list(self.memory_sizes)!r}: positive integers")
        if self.accelerator not in ("cpu", "gpu", "cuda"):
            raise ValueError(f"{where}: accelerator={self.accelerator!r}; allowed 'cpu', 'gpu'")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def settings_path(scale: str):
    return shipped_settings("clapping", scale, SCALES)


def load_clapping_settings(path, **overrides: Any) -> ClappingSettings:
    return load_settings(ClappingSettings, path, "clapping settings", **overrides)

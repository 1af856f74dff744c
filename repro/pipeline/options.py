"""The options of the Clapping pipeline strategy, validated before anything starts. This dataclass
is their one owner: the strategy's ``__init__`` names each (what ``trainer.strategy.init_args`` of
a config accepts) with the type and default given here, and its help is these attribute docstrings
(a test checks that the two agree). Ranges and choices are types (``PositiveInt``, ``Literal``),
checked by jsonargparse from a config and by :func:`~repro.arguments.check_fields` from Python;
``__post_init__`` holds the rules across options."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

from repro.arguments import NonNegativeInt, PositiveFloat, PositiveInt, Probability, check_fields, field_docs
from repro.compile_option import check_compile_backend

from .codecs import METHODS
from .compressors import Compressor, build_compressor
from .sample_buffers import SAMPLE_STORAGE
from .schedule import SCHEDULES
from .stage_parts import PLACEMENTS

NONFINITE = ("raise", "skip")  # what a step with a NaN or inf message or loss does
BACKENDS = (None, "gloo", "nccl")
START_METHODS = ("popen", "spawn", "fork")
Schedule = Literal[SCHEDULES]  # the choices as types (the tuples stay their one owner)
Placement = Literal[("auto", *PLACEMENTS)]  # auto: auto_placement.py chooses one at setup
Method = Literal[METHODS]
Storage = Literal[SAMPLE_STORAGE]
Nonfinite = Literal[NONFINITE]
Backend = Literal[BACKENDS[1:]] | None
StartMethod = Literal[START_METHODS]


@dataclass
class PipelineOptions:
    stages: PositiveInt | None = None
    """pipeline stages K; None = the number of processes (devices x nodes)"""
    layers_per_stage: Sequence[PositiveInt] | None = None
    """layers of each stage; None = as even as possible"""
    micro_batches: PositiveInt = 4
    """M micro-batches per batch (the batch size must divide by M)"""
    schedule: Schedule = "gpipe"
    """'gpipe' (all forwards, then all backwards) or '1f1b'"""
    extra_warmup: NonNegativeInt | None = None
    """1f1b: forwards each stage runs ahead of 1F1B's K - 1 - k; None = 1 (0 with gpipe)"""
    placement: Placement = "auto"
    """'linear', 'v' (a token embedding on the last stage) or 'auto' (v when it sends fewer bytes)"""
    method: Method = "none"
    """none | direct | ef21 | aqsgd | clapping_fc | clapping_fu"""
    fwd_compressor: str = "identity"
    """activations: identity, fp16, bf16, topk(r), randk(r), quant(bits)"""
    bwd_compressor: str = "identity"
    """compressor of activation gradients (same choices)"""
    p: Probability = 1.0
    """lazy sampling: P(a step draws a fresh batch), in (0, 1]; 1 = ordinary"""
    sampler_seed: int | None = None
    """shuffle and lazy coins; None = the datamodule's shuffle_seed"""
    compression_seed: int = 0
    """base seed of the per-message seeds (randk entries, stochastic rounding)"""
    warmup_epochs: NonNegativeInt = 1
    """aqsgd: epochs sent uncompressed while the per-sample buffers fill"""
    aqsgd_num_samples: PositiveInt | None = None
    """aqsgd: N rows per buffer; None = the training set's size"""
    aqsgd_storage: Storage = "memory"
    """aqsgd buffers: 'memory' or 'memmap' (files under aqsgd_dir)"""
    aqsgd_dir: str | None = None
    """aqsgd: directory of the memmap files"""
    aqsgd_checkpoint_buffers: bool = False
    """aqsgd: N x T x d rows in checkpoints (GBs); off: refilled"""
    sample_id_key: str = "sample_id"
    """batch key of the sample ids (aqsgd)"""
    bandwidth_mbps: PositiveFloat | None = None
    """emulated link: each send waits bytes*8/bandwidth; None = off"""
    timeout_s: PositiveFloat = 300.0
    """seconds any receive or collective may wait before the rank gives up"""
    nonfinite: Nonfinite = "raise"
    """NaN/inf in a message or loss: 'raise' (stop, naming where), 'skip' the update"""
    process_group_backend: Backend = None
    """'gloo' or 'nccl'; None = gloo on CPU, nccl on CUDA"""
    start_method: StartMethod = "popen"
    """how ranks start: 'popen' (CLI, torchrun, SLURM), 'spawn' or 'fork'"""
    compile: bool | str = False
    """torch.compile each stage module: false, true (inductor), a backend"""
    tied_compressor: str = "identity"
    """the tied weights' gradient sum: identity (exact) or a compressor + EF"""
    timeline_dir: str | None = None
    """write each rank's step timeline there (Chrome trace); None = off"""
    fwd: Compressor = field(init=False, repr=False, compare=False)
    """built from fwd_compressor"""
    bwd: Compressor = field(init=False, repr=False, compare=False)
    """built from bwd_compressor"""
    tied: Compressor = field(init=False, repr=False, compare=False)
    """built from tied_compressor"""

    def __post_init__(self) -> None:
        check_fields(self, "strategy ")  # each option's type and range
        if self.layers_per_stage is not None:
            self.layers_per_stage = list(self.layers_per_stage)
        if self.extra_warmup is None:  # one more in flight hides a message on a slow link (docs/strategy.md)
            self.extra_warmup = 1 if self.schedule == "1f1b" else 0
        if self.extra_warmup and self.schedule != "1f1b":
            raise ValueError(
                f"strategy extra_warmup={self.extra_warmup}: applies to schedule='1f1b' (gpipe already runs every "
                f"forward first)"
            )
        if self.placement == "v" and self.stages == 1:
            raise ValueError(
                "strategy placement='v' runs the first part on the last stage: it needs stages >= 2"
            )
        self.fwd = build_compressor(self.fwd_compressor, "strategy fwd_compressor")
        self.bwd = build_compressor(self.bwd_compressor, "strategy bwd_compressor")
        self.tied = build_compressor(self.tied_compressor, "strategy tied_compressor")
        if self.method == "none" and not (self.fwd.is_identity and self.bwd.is_identity):
            raise ValueError(
                f"strategy method='none' sends exact messages, but fwd_compressor={self.fwd_compressor!r}, "
                f"bwd_compressor={self.bwd_compressor!r}; use method='direct' (or another) to compress"
            )
        self.p = float(self.p)
        if self.method == "aqsgd" and self.aqsgd_storage == "memmap" and not self.aqsgd_dir:
            raise ValueError(
                "strategy aqsgd_storage='memmap' needs aqsgd_dir (a directory for the buffer files)"
            )
        check_compile_backend(self.compile, "strategy compile")

    @property
    def compressors(self) -> dict[str, Compressor]:
        return {"fwd": self.fwd, "bwd": self.bwd}

    def as_dict(self) -> dict:
        """The options as given (compressors as their canonical spec strings)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        out["fwd_compressor"] = self.fwd.spec
        out["bwd_compressor"] = self.bwd.spec
        out["tied_compressor"] = self.tied.spec
        return out


OPTION_NAMES = frozenset(f.name for f in fields(PipelineOptions) if f.init)  # what a strategy takes


def options_doc() -> str:
    """``Args:`` of every option, from the attribute docstrings."""
    return "Args:\n" + "\n".join(
        f"    {name}: {doc}" for name, doc in field_docs(PipelineOptions).items() if name in OPTION_NAMES
    )

"""The options of the Clapping pipeline strategy, validated before anything starts. This dataclass
is their one owner: the strategy's ``__init__`` names each (what ``trainer.strategy.init_args`` of
a config accepts) with the type and default given here, and its help is these comments (a test
checks that the two agree)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from repro.compile_option import check_compile_backend
from repro.dataclass_docs import field_comments

from .codecs import METHODS
from .compressors import Compressor, build_compressor
from .sample_buffers import SAMPLE_STORAGE
from .schedule import SCHEDULES
from .stage_parts import PLACEMENTS

NONFINITE = ("raise", "skip")  # what a step with a NaN or inf message or loss does
BACKENDS = (None, "gloo", "nccl")
START_METHODS = ("popen", "spawn", "fork")


@dataclass
class PipelineOptions:
    stages: int | None = None  # pipeline stages K; None = the number of processes (devices x nodes)
    layers_per_stage: Sequence[int] | None = None  # layers of each stage; None = as even as possible
    micro_batches: int = 4  # M micro-batches per batch (the batch size must divide by M)
    schedule: str = "gpipe"  # 'gpipe' (all forwards, then all backwards) or '1f1b'
    extra_warmup: int = 0  # 1f1b: forwards each stage runs ahead of 1F1B's K - 1 - k (slow links; memory)
    placement: str = "linear"  # 'linear' or 'v' (the first part, a token embedding, on the last stage)
    method: str = "none"  # none | direct | ef21 | aqsgd | clapping_fc | clapping_fu
    fwd_compressor: str = "identity"  # activations: identity, fp16, bf16, topk(r), randk(r), quant(bits)
    bwd_compressor: str = "identity"  # compressor of activation gradients (same choices)
    p: float = 1.0  # lazy sampling: P(a step draws a fresh batch), in (0, 1]; 1 = ordinary
    sampler_seed: int | None = None  # shuffle and lazy coins; None = the datamodule's shuffle_seed
    compression_seed: int = 0  # base seed of the per-message seeds (randk entries, stochastic rounding)
    warmup_epochs: int = 1  # aqsgd: epochs sent uncompressed while the per-sample buffers fill
    aqsgd_num_samples: int | None = None  # aqsgd: N rows per buffer; None = the training set's size
    aqsgd_storage: str = "memory"  # aqsgd buffers: 'memory' or 'memmap' (files under aqsgd_dir)
    aqsgd_dir: str | None = None  # aqsgd: directory of the memmap files
    aqsgd_checkpoint_buffers: bool = False  # aqsgd: N x T x d rows in checkpoints (GBs); off: refilled
    sample_id_key: str = "sample_id"  # batch key of the sample ids (aqsgd)
    bandwidth_mbps: float | None = None  # emulated link: each send waits bytes*8/bandwidth; None = off
    timeout_s: float = 300.0  # seconds any receive or collective may wait before the rank gives up
    nonfinite: str = "raise"  # NaN/inf in a message or loss: 'raise' (stop, naming where), 'skip' the update
    process_group_backend: str | None = None  # 'gloo' or 'nccl'; None = gloo on CPU, nccl on CUDA
    start_method: str = "popen"  # how ranks start: 'popen' (CLI, torchrun, SLURM), 'spawn' or 'fork'
    compile: bool | str = False  # torch.compile each stage module: false, true (inductor), a backend
    tied_compressor: str = "identity"  # the tied weights' gradient sum: identity (exact) or a compressor + EF
    timeline_dir: str | None = None  # write each rank's step timeline there (Chrome trace); None = off
    fwd: Compressor = field(init=False, repr=False, compare=False)  # built from fwd_compressor
    bwd: Compressor = field(init=False, repr=False, compare=False)  # built from bwd_compressor
    tied: Compressor = field(init=False, repr=False, compare=False)  # built from tied_compressor

    def __post_init__(self) -> None:
        def positive_int(name, value, allow_none=False):
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"strategy {name}={value!r}: must be a positive integer{' or null' if allow_none else ''}"
                )

        positive_int("stages", self.stages, allow_none=True)
        positive_int("micro_batches", self.micro_batches)
        if self.layers_per_stage is not None:
            counts = list(self.layers_per_stage)
            if not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
                raise ValueError(
                    f"strategy layers_per_stage={self.layers_per_stage!r}: must be a list of integers >= 1"
                )
            self.layers_per_stage = counts
        if self.schedule not in SCHEDULES:
            raise ValueError(f"strategy schedule={self.schedule!r}: allowed values are {SCHEDULES}")
        if (
            isinstance(self.extra_warmup, bool)
            or not isinstance(self.extra_warmup, int)
            or self.extra_warmup < 0
        ):
            raise ValueError(f"strategy extra_warmup={self.extra_warmup!r}: must be an integer >= 0")
        if self.extra_warmup and self.schedule != "1f1b":
            raise ValueError(
                f"strategy extra_warmup={self.extra_warmup}: applies to schedule='1f1b' (gpipe already runs every "
                f"forward first)"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"strategy placement={self.placement!r}: allowed values are {PLACEMENTS}")
        if self.placement == "v" and self.stages == 1:
            raise ValueError(
                "strategy placement='v' runs the first part on the last stage: it needs stages >= 2"
            )
        if self.method not in METHODS:
            raise ValueError(f"strategy method={self.method!r}: allowed values are {METHODS}")
        self.fwd = build_compressor(self.fwd_compressor, "strategy fwd_compressor")
        self.bwd = build_compressor(self.bwd_compressor, "strategy bwd_compressor")
        self.tied = build_compressor(self.tied_compressor, "strategy tied_compressor")
        if self.method == "none" and not (self.fwd.is_identity and self.bwd.is_identity):
            raise ValueError(
                f"strategy method='none' sends exact messages, but fwd_compressor={self.fwd_compressor!r}, "
                f"bwd_compressor={self.bwd_compressor!r}; use method='direct' (or another) to compress"
            )
        if isinstance(self.p, bool) or not isinstance(self.p, (int, float)) or not 0.0 < float(self.p) <= 1.0:
            raise ValueError(f"strategy p={self.p!r}: the lazy-sampling probability must be in (0, 1]")
        self.p = float(self.p)
        if (
            isinstance(self.warmup_epochs, bool)
            or not isinstance(self.warmup_epochs, int)
            or self.warmup_epochs < 0
        ):
            raise ValueError(f"strategy warmup_epochs={self.warmup_epochs!r}: must be an integer >= 0")
        positive_int("aqsgd_num_samples", self.aqsgd_num_samples, allow_none=True)
        if self.aqsgd_storage not in SAMPLE_STORAGE:
            raise ValueError(
                f"strategy aqsgd_storage={self.aqsgd_storage!r}: allowed values are {SAMPLE_STORAGE}"
            )
        if self.method == "aqsgd" and self.aqsgd_storage == "memmap" and not self.aqsgd_dir:
            raise ValueError(
                "strategy aqsgd_storage='memmap' needs aqsgd_dir (a directory for the buffer files)"
            )
        if self.bandwidth_mbps is not None and (
            isinstance(self.bandwidth_mbps, bool)
            or not isinstance(self.bandwidth_mbps, (int, float))
            or self.bandwidth_mbps <= 0
        ):
            raise ValueError(f"strategy bandwidth_mbps={self.bandwidth_mbps!r}: must be > 0 or null")
        if self.nonfinite not in NONFINITE:
            raise ValueError(f"strategy nonfinite={self.nonfinite!r}: allowed values are {NONFINITE}")
        if self.process_group_backend not in BACKENDS:
            raise ValueError(
                f"strategy process_group_backend={self.process_group_backend!r}: allowed {BACKENDS}"
            )
        if self.start_method not in START_METHODS:
            raise ValueError(f"strategy start_method={self.start_method!r}: allowed {START_METHODS}")
        check_compile_backend(self.compile, "strategy compile")
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or self.timeout_s <= 0
        ):
            raise ValueError(f"strategy timeout_s={self.timeout_s!r}: must be > 0")

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
    """``Args:`` of every option, from the field comments."""
    return "Args:\n" + "\n".join(
        f"    {name}: {comment}"
        for name, comment in field_comments(PipelineOptions).items()
        if name not in ("fwd", "bwd", "tied")
    )

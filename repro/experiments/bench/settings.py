"""Settings of ``make bench``: one YAML per preset (``paper_configs/experiments/bench/<preset>.yaml``),
read by the engine's settings loader.

``full`` is the default ``make bench`` (about 10 minutes on a 2-core CPU); ``quick`` is the
subset the tests run (under 2 minutes): the same sections on a smaller model, fewer repeats;
``gpu`` is ``make bench-gpu``: the compile section alone on the paper configs (a CUDA machine);
``versus_torch`` is the race against torch.distributed.pipelining (the pipeline and hf sections)
with enough paired repeats to tell a few percent (19.7 minutes on a 2-core machine at b4feec6);
``links`` is the link section alone on slow shaped links (10 and 25 Mbit/s; K = 2 and 4; tied and
untied; the strategy's defaults, the placements and torch's schedules, its V schedules included).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from repro.arguments import NonNegativeInt, PositiveFloat, PositiveInt, Probability, check_fields
from repro.experiments.kit.settings import ConfigPath, shipped_settings
from repro.experiments.kit.settings import load_settings as load_settings_file
from repro.pipeline.codecs import METHODS
from repro.pipeline.compressors import build_compressor
from repro.pipeline.options import Placement
from repro.pipeline.schedule import SCHEDULES

# torch's V schedules (two model chunks a rank, torch.distributed.pipelining's class of each): link runs of engine torch
TORCH_V_SCHEDULES = {"zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
LINK_SCHEDULES = (*SCHEDULES, *TORCH_V_SCHEDULES)
ENGINES = ("ours", "torch")  # a link run's pipeline: the clapping strategy, torch.distributed.pipelining
PRESETS = ("full", "quick", "gpu", "versus_torch", "links")
SECTIONS = (
    "lightning",
    "rope",
    "compile",
    "pipeline",
    "compressors",
    "network",
    "memory",
    "scale",
    "data",
    "hf",
    "link",
)


@dataclass(frozen=True)
class NetworkRun:
    method: Literal[METHODS]
    """pipeline method (repro.pipeline.methods.METHODS)"""
    fwd_compressor: str = "identity"
    """activation compressor"""
    bwd_compressor: str = "identity"
    """gradient compressor"""
    p: Probability = 1.0
    """lazy-sampling probability"""
    tied_compressor: str = "identity"
    """link section: the tied embedding/head gradient sum (identity: exact)"""
    untied: bool = False
    """link section: the bench GPT with a head of its own (no tied sum)"""
    schedule: Literal[LINK_SCHEDULES] | None = None
    """link section: gpipe | 1f1b (either engine), zbv | dualpipev (engine torch); None = link_schedule"""
    micro_batches: PositiveInt | None = None
    """link section: M; None = link_micro_batches"""
    engine: Literal[ENGINES] = "ours"
    """link section: ours (the clapping strategy) | torch (torch.distributed.pipelining)"""
    extra_warmup: NonNegativeInt | None = None
    """link section, 1f1b: forwards a stage runs ahead of 1F1B's; None = the strategy's default (1)"""
    placement: Placement = "linear"
    """link section: the strategy's placement ('v': the embedding on the last stage; 'auto': the
    strategy's default, its choice recorded in the row); linear unless named"""

    @property
    def label(self) -> str:
        if self.engine == "torch":
            out = "torch.distributed.pipelining"
        elif self.method == "none":
            out = "none" if self.p == 1.0 else f"none p={self.p:g}"
        else:
            comp = (
                self.fwd_compressor
                if self.fwd_compressor == self.bwd_compressor
                else f"{self.fwd_compressor}/{self.bwd_compressor}"
            )
            out = f"{self.method} {comp}" + (f" p={self.p:g}" if self.p != 1.0 else "")
        if self.placement != "linear":
            out += f", placement {self.placement}"
        if self.untied:
            out += ", untied"
        elif self.tied_compressor != "identity":
            out += f", tied sum {self.tied_compressor}"
        if self.schedule is not None or self.micro_batches is not None:
            out += f" [{self.schedule or ''}{' ' if self.schedule and self.micro_batches else ''}"
            out += f"{f'M={self.micro_batches}' if self.micro_batches else ''}]"
        if self.extra_warmup is not None:
            out += f" [extra_warmup={self.extra_warmup}]"
        return out


NETWORK_RUNS = (
    NetworkRun("none"),
    NetworkRun("clapping_fc", "quant(4)", "quant(8)"),
    NetworkRun("clapping_fc", "quant(4)", "quant(8)", 0.5),
    NetworkRun("clapping_fu", "topk(0.1)", "topk(0.1)", 0.5),
)
LINK_RUNS = (
    NetworkRun("none"),
    NetworkRun("none", untied=True),
    NetworkRun("none", tied_compressor="quant(8)"),
    NetworkRun("clapping_fc", "quant(4)", "quant(8)"),
    NetworkRun("clapping_fc", "quant(4)", "quant(8)", untied=True),
    NetworkRun("clapping_fc", "quant(4)", "quant(8)", tied_compressor="quant(8)"),
)
COMPRESSORS = ("fp16", "bf16", "topk(0.01)", "topk(0.1)", "randk(0.1)", "quant(2)", "quant(4)", "quant(8)")
MESSAGE_SHAPES = ((4, 128, 128), (4, 512, 512), (4, 1024, 768))


@dataclass(frozen=True)
class BenchSettings:
    preset: Literal[PRESETS]
    """the name written into bench.json"""
    n_layer: PositiveInt = 12
    """GPT layers (divisible by every entry of stages)"""
    n_embd: PositiveInt = 128
    """hidden width"""
    n_head: PositiveInt = 4
    """attention heads"""
    vocab_size: PositiveInt = 2048
    """token ids of the synthetic data"""
    block_size: PositiveInt = 128
    """sequence length of every section except scale"""
    batch_size: PositiveInt = 16
    """sequences per optimizer step"""
    micro_batches: PositiveInt = 4
    """M micro-batches per step in every pipeline run"""
    repeats: PositiveInt = 3
    """interleaved repeats of every timed measurement (median and spread over them)"""
    warmup_steps: NonNegativeInt = 5
    """steps run before the clock starts (single process)"""
    timed_steps: PositiveInt = 20
    """steps timed per repeat (single process)"""
    rope_timed_steps: PositiveInt = 10
    """steps timed per repeat and variant (rope section; 6 variants)"""
    pipe_repeats: PositiveInt = 5
    """repeats of the pipeline section (each run starts K processes)"""
    network_repeats: PositiveInt = 2
    """repeats of the network section"""
    pipe_warmup_steps: NonNegativeInt = 3
    """steps run before the clock starts (pipeline runs)"""
    pipe_timed_steps: PositiveInt = 8
    """steps timed per repeat (pipeline runs)"""
    stages: tuple[int, ...] = (2, 4)
    """K of the pipeline comparison and the scale curve"""
    mla_rope_widths: tuple[NonNegativeInt, ...] = (0, 8, 32)
    """MLA physical rotary widths (0 = the reference)"""
    seq_lengths: tuple[PositiveInt, ...] = (64, 128, 256)
    """sequence lengths of the scale curve"""
    seq_stages: PositiveInt = 2
    """K of the sequence-length curve"""
    bandwidth_mbps: PositiveFloat = 100.0
    """emulated link of the network section"""
    network_stages: PositiveInt = 4
    """K of the network section"""
    network_runs: tuple[NetworkRun, ...] = NETWORK_RUNS
    """timed on the slow link; the 1st is none"""
    compressors: tuple[str, ...] = COMPRESSORS
    """compressors timed"""
    compressor_shapes: tuple[tuple[int, ...], ...] = MESSAGE_SHAPES
    """message shapes (micro-batch, T, d)"""
    compressor_repeats: PositiveInt = 5
    """timed compress+decompress calls per compressor and shape"""
    memory_sizes: tuple[PositiveInt, ...] = (1000, 4000, 16000)
    """dataset sizes N of the buffer-memory curve"""
    cpu_configs: tuple[ConfigPath, ...] = ()
    """compile section on a CPU: model configs timed (fp32)"""
    gpu_configs: tuple[ConfigPath, ...] = ()
    """compile section on CUDA: model configs timed (bf16-mixed)"""
    compile_backend: str = "inductor"
    """compile section: torch.compile backend of the compiled rows"""
    compile_warmup_steps: PositiveInt = 10
    """compile section: untimed steps first (compilation happens here)"""
    compile_timed_steps: PositiveInt = 30
    """compile section: timed steps per path and model"""
    compile_repeats: PositiveInt = 3
    """compile section: interleaved repeats (compilation is cached after the first)"""
    data_corpus_mb: PositiveFloat = 16.0
    """data section: generated corpus of the prepare and loader throughput"""
    data_rss_corpus_mb: PositiveFloat = 2048.0
    """data section: generated corpus of the prepare's peak-memory row"""
    data_vocab_size: PositiveInt = 8192
    """data section: BPE vocabulary of the throughput rows"""
    data_workers: NonNegativeInt = 0
    """data section: prepare workers (0 = every core)"""
    data_repeats: PositiveInt = 2
    """data section: interleaved repeats of the throughput rows"""
    data_loader_batches: PositiveInt = 200
    """data section: batches timed per loader repeat"""
    gpu_tokens_per_s: PositiveFloat = 651_000.0
    """data section: tokens/s of a compiled paper_mha step, one H200"""
    link_rates_mbit: tuple[float, ...] = (100.0, 1000.0)
    """link section: rates of the shaped links"""
    link_timed_steps: PositiveInt = 6
    """link section: timed steps per run (after pipe_warmup_steps)"""
    link_stages: tuple[int, ...] = (4,)
    """link section: K (one network namespace per stage)"""
    link_runs: tuple[NetworkRun, ...] = LINK_RUNS
    """link section: the runs; the 1st is the reference none"""
    link_schedule: Literal[SCHEDULES] = "1f1b"
    """link section: the schedule of runs that name none"""
    link_micro_batches: PositiveInt = 16
    """link section: M of runs that name none (batch_size must divide by it)"""
    sections: tuple[Literal[SECTIONS], ...] = SECTIONS
    """which sections run"""
    path: str = field(default="", compare=False)
    """the YAML these settings came from"""

    def __post_init__(self) -> None:
        where = f"bench settings {self.path!r}" if self.path else "bench settings"
        check_fields(self, f"{where}: ", skip=("cpu_configs", "gpu_configs", "network_runs", "link_runs"))
        if self.n_embd % self.n_head:
            raise ValueError(f"{where}: n_head={self.n_head} must divide n_embd={self.n_embd}")
        if self.batch_size % self.micro_batches:
            raise ValueError(
                f"{where}: batch_size={self.batch_size} must divide into micro_batches={self.micro_batches}"
            )
        for name in ("stages", "seq_lengths", "mla_rope_widths", "memory_sizes"):
            if not getattr(self, name):
                raise ValueError(f"{where}: {name} is empty")
        for k in (*self.stages, self.seq_stages, self.network_stages, *self.link_stages):
            if k < 2 or self.n_layer % k:
                raise ValueError(f"{where}: stages {k}: need 2 <= K and K dividing n_layer={self.n_layer}")
        for w in self.mla_rope_widths:
            if w % 2:
                raise ValueError(f"{where}: mla_rope_widths entry {w!r}: must be an even integer >= 0")
        if 0 not in self.mla_rope_widths:
            raise ValueError(
                f"{where}: mla_rope_widths={list(self.mla_rope_widths)}: must include 0 (the reference)"
            )
        if self.block_size not in self.seq_lengths:
            raise ValueError(
                f"{where}: seq_lengths={list(self.seq_lengths)} must include block_size={self.block_size}"
            )
        if not self.network_runs or self.network_runs[0].method != "none" or self.network_runs[0].p != 1.0:
            raise ValueError(f"{where}: network_runs must start with method 'none' (p 1), the reference")
        if (
            not self.link_runs
            or self.link_runs[0].method != "none"
            or self.link_runs[0].p != 1.0
            or self.link_runs[0].engine != "ours"
        ):
            raise ValueError(f"{where}: link_runs must start with method 'none' (p 1), the reference")
        for field_name in ("network_runs", "link_runs"):
            for run in getattr(self, field_name):
                check_fields(run, f"{where}: {field_name} ")
                for part in ("fwd", "bwd", "tied"):
                    build_compressor(
                        getattr(run, f"{part}_compressor"), f"{where}: {field_name} {part}_compressor"
                    )
                if run.engine == "torch" and (
                    field_name != "link_runs"
                    or (run.method, run.fwd_compressor, run.bwd_compressor, run.p, run.tied_compressor)
                    != ("none", "identity", "identity", 1.0, "identity")
                ):
                    raise ValueError(
                        f"{where}: {field_name} engine='torch' (torch.distributed.pipelining) runs in link_runs "
                        f"only, with method none, identity compressors, p 1 and the exact tied sum"
                    )
                if run.placement != "linear" and run.engine != "ours":
                    raise ValueError(
                        f"{where}: {field_name} placement={run.placement!r}: the strategy's option (engine ours); "
                        f"torch's runs are placed by their schedule"
                    )
                if run.schedule in TORCH_V_SCHEDULES and run.engine != "torch":
                    raise ValueError(
                        f"{where}: {field_name} schedule={run.schedule!r}: torch's V schedules run with engine "
                        f"torch; the strategy's schedules are {SCHEDULES}"
                    )
                if run.extra_warmup and (
                    run.engine != "ours" or (run.schedule or self.link_schedule) != "1f1b"
                ):
                    raise ValueError(
                        f"{where}: {field_name} extra_warmup={run.extra_warmup}: the strategy's 1f1b runs only"
                    )
                m = run.micro_batches or self.link_micro_batches
                if self.batch_size % m:
                    raise ValueError(
                        f"{where}: {field_name}: batch_size={self.batch_size} does not split into M={m}"
                    )
        for spec in self.compressors:
            build_compressor(spec, f"{where}: compressors")
        if not self.sections:
            raise ValueError(f"{where}: sections=[]: give at least one of {SECTIONS}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("path")
        return out


def load_settings(path_or_preset: str | Path) -> BenchSettings:
    """Settings from a preset name (full, quick) or a YAML path; unknown keys are refused."""
    text = str(path_or_preset)
    path = shipped_settings("bench", text, PRESETS) if text in PRESETS else Path(text)
    return load_settings_file(BenchSettings, path, "bench settings")

"""Measured training speed: the one plain training loop (:class:`PlainLoop`) and the one step
clock (:class:`StepClock`) of every timing in the suite (``repro bench`` and ``--plan``), and with
them a model config's speed on a device: the Lightning path the runs use (``GPTLightningModule``
under a Trainer) and the same training as the plain loop, eager or compiled, with the training
FLOPs of a step counted by Lightning's ``measure_flops`` (on the meta device, so counting costs
nothing). ``make bench-gpu`` compares them; ``--plan`` uses a measured step time for its GPU-hours.

Timing on CUDA synchronises only at the ends of the timed window, so the steps run as they do in
a real run (asynchronously)."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import measure_flops

from repro.experiments.kit.links import wire_tx_bytes
from repro.files import read_json, write_json_atomic
from repro.lit import GPTLightningModule, OptimConfig
from repro.models import GPTConfig
from repro.models.gpt import GPT
from repro.runs.build import make_trainer

CLIP = 1.0  # gradient clipping by global norm, as the shipped configs do
# dense bf16 peak of the GPUs MFU is reported for (TFLOP/s, vendor datasheets); not Lightning's
# get_available_flops, whose H200 entries are the sparse peak (2.0e15) and miss a plain "NVIDIA H200"
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


@dataclass(frozen=True)
class StepTiming:
    path: str  # 'lightning' or 'plain'
    compiled: bool  # torch.compile of the model
    step_s: float  # seconds per optimizer step over the timed window
    tokens_per_s: float  # tokens of the timed steps over their wall time
    warmup_s: float  # wall time of the untimed first steps (compilation included)
    peak_memory_bytes: int  # CUDA peak allocated memory (0 on CPU)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TimingJob:
    """What a timing trains: the model and optimizer, the batches (already on ``device``), the
    untimed first steps, torch.compile (False or a backend) and bf16 autocast."""

    cfg: GPTConfig
    optim: OptimConfig
    batches: list[dict[str, torch.Tensor]]
    device: torch.device
    warmup: int
    compile: bool | str = False
    bf16: bool = False
    pretrained: str | None = None  # a Hugging Face model trained instead of ``cfg``'s GPT


def training_flops_per_step(cfg: GPTConfig, batch_size: int, block_size: int) -> float:
    """FLOPs of one forward and backward pass over a batch, counted op by op on the meta device
    (Lightning's ``measure_flops``)."""
    with torch.device("meta"):
        model = GPT(cfg)
        idx = torch.zeros(batch_size, block_size, dtype=torch.long)
    return float(measure_flops(model, lambda: model(idx, idx)[1], lambda loss: loss))


def peak_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of this GPU when it is one of PEAK_BF16_TFLOPS, else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def synthetic_batches(
    vocab: int, batch_size: int, block_size: int, count: int, device: torch.device, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        tokens = torch.randint(0, vocab, (batch_size, block_size + 1), generator=g)
        out.append({"input_ids": tokens[:, :-1].to(device), "targets": tokens[:, 1:].to(device)})
    return out


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PlainLoop:
    """The training a LightningModule does, as a plain loop: the module's own optimizer and schedule,
    ``loss(module, batch)`` forward (under bf16 autocast with ``bf16``), backward, clipping, step,
    zero_grad."""

    def __init__(
        self, module: L.LightningModule, loss: Callable[[Any, dict], torch.Tensor], bf16: bool = False
    ) -> None:
        self.module, self.loss = module, loss
        conf = self.module.configure_optimizers()
        self.opt, self.sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.autocast = torch.autocast(module.device.type, dtype=torch.bfloat16, enabled=bf16)
        self.module.train()

    @classmethod
    def gpt(
        cls,
        cfg: GPTConfig,
        optim: OptimConfig | dict,
        seed: int = 0,
        device: torch.device | None = None,
        **kw: Any,
    ) -> PlainLoop:
        """A repro GPT's loop (its own forward's loss); ``kw``: ``compile`` of the module, ``bf16``."""
        torch.manual_seed(seed)
        module = GPTLightningModule(cfg, optim, compile=kw.pop("compile", False)).to(device or "cpu")
        return cls(module, lambda m, b: m.model(b["input_ids"], b["targets"])[1], **kw)

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        with self.autocast:
            loss = self.loss(self.module, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, CLIP)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)


class StepClock(L.Callback):
    """What a process records at the start of training and at the end of each step (a Lightning
    callback, or ``start()`` and ``tick()`` by hand in a plain loop): the wall clock, its CPU time
    (every thread of the process: compute, codecs, the transport's threads) and the bytes its
    network interface has sent (``eth0`` of a link run's namespace, headers included; None
    elsewhere). On a CUDA ``device`` the start and the readings after the steps ``sync_after`` counts
    (1-based: a timed window's ends) wait for the device first; the steps between run as they do in a
    real run (asynchronously)."""

    def __init__(self, device: torch.device | None = None, sync_after: tuple[int, ...] = ()) -> None:
        self.device, self.sync_after = device, sync_after
        self.started = 0.0
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.tx: list[int | None] = []

    def start(self) -> None:
        _sync(self.device)
        self.started = time.perf_counter()

    def tick(self) -> None:
        if len(self.times) + 1 in self.sync_after:
            _sync(self.device)
        self.times.append(time.perf_counter())
        self.cpu.append(time.process_time())
        self.tx.append(wire_tx_bytes())

    def on_train_start(self, trainer, pl_module) -> None:
        self.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.tick()

    def report(self, **extra: Any) -> dict[str, Any]:
        return {"times": self.times, "cpu": self.cpu, "tx": self.tx, "peak_rss": peak_rss_bytes(), **extra}

    def write(self, folder: str | Path, rank: int, **extra: Any) -> None:
        """This rank's report as ``folder/rank<rank>.json`` (what :func:`read_ranks` reads back)."""
        write_json_atomic(Path(folder) / f"rank{rank}.json", self.report(**extra))

    def timing(self, path: str, job: TimingJob) -> StepTiming:
        """The job's timed window: the steps after its ``warmup`` first ones."""
        steps, warmup, device = len(self.times) - job.warmup, job.warmup, job.device
        warm = self.times[warmup - 1] if warmup else self.started
        tokens = job.batches[0]["input_ids"].numel()
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
        span = self.times[-1] - warm
        return StepTiming(
            path, bool(job.compile), span / steps, tokens * steps / span, warm - self.started, peak
        )


def window(job: TimingJob) -> tuple[int, int]:
    """The steps after which a timing's clock waits for the device: the end of the warm-up, the last."""
    return job.warmup, len(job.batches)


def read_ranks(folder: Path, k: int) -> list[dict[str, Any]]:
    """The reports :meth:`StepClock.write` left in ``folder`` by ranks 0 to k - 1 (one missing: an error)."""
    missing = [r for r in range(k) if not (folder / f"rank{r}.json").exists()]
    if missing:
        raise RuntimeError(f"benchmark ranks {missing} wrote no result (see the errors above)")
    return [read_json(folder / f"rank{r}.json", "rank report") for r in range(k)]


def per_step(readings: list[float], warmup: int) -> float:
    """What one of a clock's readings (wall time, CPU time, bytes sent) grew by per step, over the
    steps after the ``warmup`` first ones (over all but the first step without a warm-up)."""
    start = readings[warmup - 1] if warmup > 0 else readings[0]
    steps = len(readings) - warmup if warmup > 0 else len(readings) - 1
    return (readings[-1] - start) / steps


def plain_loop_timing(job: TimingJob) -> StepTiming:
    """The plain loop (fused AdamW on CUDA: the module's optimizer) over the job's batches."""
    if job.pretrained is not None:
        raise ValueError("the plain loop times repro GPTs only (not model.pretrained)")
    loop = PlainLoop.gpt(job.cfg, job.optim, device=job.device, compile=job.compile, bf16=job.bf16)
    if job.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(job.device)
    clock = StepClock(job.device, window(job))
    clock.start()
    for batch in job.batches:
        loop.step(batch)
        clock.tick()
    return clock.timing("plain", job)


def timed_fit(
    module: L.LightningModule, data: Any, steps: int, *callbacks: L.Callback, **options: Any
) -> None:
    """The one timed fit of every single-process timing: ``steps`` steps of ``Trainer.fit`` on
    ``data`` (no logger, no progress bar, no validation, clipping as the shipped configs), the
    clocks as ``callbacks``; ``options``: the Trainer's device and precision."""
    make_trainer(steps=steps, callbacks=list(callbacks), gradient_clip_val=CLIP, **options).fit(
        module, train_dataloaders=data
    )


def lightning_timing(job: TimingJob) -> StepTiming:
    """The suite's path: GPTLightningModule under a Trainer (no logger, no progress bar, no
    validation), bf16-mixed on CUDA, clipping 1.0, the module's optimizer; a pretrained model's
    module (``HFCausalLMModule``) when the job names one."""
    optim, device, compile, pretrained = job.optim, job.device, job.compile, job.pretrained
    torch.manual_seed(0)
    if pretrained is not None:
        from repro.lit.hf_module import HFCausalLMModule

        module = HFCausalLMModule(pretrained, optim, compile=compile)
    else:
        module = GPTLightningModule(job.cfg, optim, compile=compile)
    clock = StepClock(device, window(job))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timed_fit(
        module,
        _OnDevice(job.batches),
        len(job.batches),
        clock,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=[device.index or 0] if device.type == "cuda" else 1,
        precision="bf16-mixed" if job.bf16 else "32-true",
    )
    return clock.timing("lightning", job)


class _OnDevice:
    """Batches already on the device, as a loader (Lightning moves them to the same device: no copy)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def measure_step_time(config_path: str, device: torch.device, warmup: int = 3, timed: int = 5) -> float:
    """Seconds per optimizer step of a model config on ``device``: a few steps of the Lightning
    path (compiled when the config says so), on synthetic tokens of the config's batch shape; a
    config naming ``model.pretrained`` times that model, not a GPT."""
    from repro.runs.model_config import load_model_config

    config = load_model_config(config_path)
    if config.is_pretrained:
        from repro.models.hf_folder import model_folder, read_config

        vocab = int(read_config(model_folder(config.pretrained)).vocab_size)
    else:
        vocab = int(config.data.get("vocab_size") or 256)
    batches = synthetic_batches(vocab, config.batch_size, config.block_size, warmup + timed, device)
    compile = config.value("model.compile") or False
    job = TimingJob(
        config.gpt_config(vocab),
        OptimConfig(**config.optim),
        batches,
        device,
        warmup,
        compile,
        device.type == "cuda",
        config.pretrained,
    )
    return lightning_timing(job).step_s

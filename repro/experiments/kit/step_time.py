"""Measured training speed of a model config on a device: the Lightning path the runs use
(``GPTLightningModule`` under a Trainer) and the same training as a plain PyTorch loop, eager or
compiled, with the training FLOPs of a step counted by ``torch.utils.flop_counter`` (on the meta
device, so counting costs nothing). ``make bench-gpu`` compares them; ``--plan`` uses a measured
step time for its GPU-hours.

Timing on CUDA synchronises only at the ends of the timed window, so the steps run as they do in
a real run (asynchronously)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields

import lightning as L
import torch
from torch.utils.flop_counter import FlopCounterMode

from repro.lit import GPTLightningModule, OptimConfig
from repro.models import GPTConfig
from repro.models.gpt import GPT
from repro.runs.build import make_trainer

CLIP = 1.0  # gradient clipping by global norm, as the shipped configs do
# dense bf16 peak of the GPUs MFU is reported for (TFLOP/s, vendor datasheets)
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
    """FLOPs of one forward and backward pass over a batch, counted op by op on the meta device."""
    with torch.device("meta"):
        model = GPT(cfg)
        idx = torch.zeros(batch_size, block_size, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    return float(counter.get_total_flops())


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


def astuple_shallow(job: TimingJob) -> tuple:
    """The job's fields in order (``dataclasses.astuple`` would deep-copy the batches)."""
    return tuple(getattr(job, f.name) for f in fields(job))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timing(path, compiled, device, start, warm, end, steps, tokens) -> StepTiming:
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return StepTiming(path, compiled, (end - warm) / steps, tokens * steps / (end - warm), warm - start, peak)


def plain_loop_timing(job: TimingJob) -> StepTiming:
    """The plain loop: forward under bf16 autocast (on CUDA), backward, clip, fused AdamW on CUDA,
    zero_grad. Steps ``warmup`` batches untimed, then times the rest."""
    cfg, optim, batches, device, warmup, compile, bf16, pretrained = astuple_shallow(job)
    if pretrained is not None:
        raise ValueError("the plain loop times repro GPTs only (not model.pretrained)")
    torch.manual_seed(0)
    module = GPTLightningModule(cfg, optim, compile=compile).to(device)
    optimizer = module.configure_optimizers()["optimizer"]
    params = [p for p in module.parameters() if p.requires_grad]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    _sync(device)
    start = time.perf_counter()
    warm = start
    for i, batch in enumerate(batches):
        if i == warmup:
            _sync(device)
            warm = time.perf_counter()
        with autocast:
            _, loss = module.model(batch["input_ids"], batch["targets"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    tokens = batches[0]["input_ids"].numel()
    return _timing(
        "plain", bool(compile), device, start, warm, time.perf_counter(), len(batches) - warmup, tokens
    )


class _WindowClock(L.Callback):
    """Synchronises and reads the clock at the start, after ``warmup`` steps, and at the end."""

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup, self.device, self.marks = warmup, device, {}

    def on_train_start(self, trainer, pl_module) -> None:
        _sync(self.device)
        self.marks["start"] = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 == self.warmup:
            _sync(self.device)
            self.marks["warm"] = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        _sync(self.device)
        self.marks["end"] = time.perf_counter()


def lightning_timing(job: TimingJob) -> StepTiming:
    """The suite's path: GPTLightningModule under a Trainer (no logger, no progress bar, no
    validation), bf16-mixed on CUDA, clipping 1.0, the module's optimizer; a pretrained model's
    module (``HFCausalLMModule``) when the job names one."""
    cfg, optim, batches, device, warmup, compile, bf16, pretrained = astuple_shallow(job)
    torch.manual_seed(0)
    if pretrained is not None:
        from repro.lit.hf_module import HFCausalLMModule

        module = HFCausalLMModule(pretrained, optim, compile=compile)
    else:
        module = GPTLightningModule(cfg, optim, compile=compile)
    clock = _WindowClock(warmup, device)
    trainer = make_trainer(
        steps=len(batches),
        callbacks=[clock],
        gradient_clip_val=CLIP,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=[device.index or 0] if device.type == "cuda" else 1,
        precision="bf16-mixed" if bf16 else "32-true",
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer.fit(module, train_dataloaders=_OnDevice(batches))
    m = clock.marks
    tokens = batches[0]["input_ids"].numel()
    return _timing(
        "lightning", bool(compile), device, m["start"], m["warm"], m["end"], len(batches) - warmup, tokens
    )


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

"""The ``compile`` section: the suite's Lightning path against the plain PyTorch loop, eager and
under ``torch.compile``, on model configs the researcher trains: tokens/s, MFU from counted FLOPs,
peak memory. On a CUDA machine it times ``gpu_configs`` (bf16-mixed, fused AdamW: ``make
bench-gpu``); on a CPU it times ``cpu_configs`` (fp32), the numbers that chose the CPU default
of the ``compile`` option. Each row's ratio is against the compiled plain loop of its model."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from repro.experiments.kit.step_time import (
    TimingJob,
    lightning_timing,
    peak_tflops,
    plain_loop_timing,
    synthetic_batches,
    training_flops_per_step,
)
from repro.lit import OptimConfig
from repro.runs.model_config import load_model_config

from .measure import row
from .settings import BenchSettings

PATHS = (("plain", False), ("plain", True), ("lightning", False), ("lightning", True))


def bench_compile(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    cuda = torch.cuda.is_available()
    configs = s.gpu_configs if cuda else s.cpu_configs
    if not configs:
        progress(
            "compile section skipped: "
            + (
                "no gpu_configs in these settings"
                if cuda
                else "no CUDA device here (make bench-gpu needs a GPU)"
            )
        )
        return []
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    peak = peak_tflops(device)
    rows: list[dict[str, Any]] = []
    for path in configs:
        config = load_model_config(str(path))
        vocab = int(config.data.get("vocab_size") or s.vocab_size)
        cfg = config.gpt_config(vocab)
        optim = OptimConfig(**config.optim)
        batch, block = config.batch_size, config.block_size
        name = f"{Path(path).parent.name}/{Path(path).stem}"
        flops = training_flops_per_step(cfg, batch, block)
        batches = synthetic_batches(
            vocab, batch, block, s.compile_warmup_steps + s.compile_timed_steps, device
        )
        timings: dict[tuple[str, bool], list] = {key: [] for key in PATHS}
        for r in range(s.compile_repeats):  # interleaved: a slow spell of the machine hits every path
            for kind, compiled in PATHS:
                label = f"{kind} {'compiled' if compiled else 'eager'}"
                progress(f"compile: {name} {label} on {device.type}, repeat {r + 1} of {s.compile_repeats}")
                torch._dynamo.reset()
                measure = plain_loop_timing if kind == "plain" else lightning_timing
                backend = s.compile_backend if compiled else False
                job = TimingJob(cfg, optim, batches, device, s.compile_warmup_steps, backend, bf16=cuda)
                timings[(kind, compiled)].append(measure(job))
        reference = timings[("plain", True)]
        for (kind, compiled), runs in timings.items():
            label = f"{name} {kind} {'compiled' if compiled else 'eager'}"
            is_ref = (kind, compiled) == ("plain", True)
            step_s = statistics.median(t.step_s for t in runs)
            achieved = flops / step_s / 1e12
            rows.append(
                row(
                    "compile",
                    label,
                    "throughput",
                    "tokens/s",
                    [t.tokens_per_s for t in runs],
                    reference=None if is_ref else f"{name} plain compiled",
                    ratios=None
                    if is_ref
                    else [t.tokens_per_s / ref.tokens_per_s for t, ref in zip(runs, reference)],
                    ratio_meaning=None
                    if is_ref
                    else "tokens/s / tokens/s of the compiled plain loop, same model",
                    goal=0.95 if (kind, compiled) == ("lightning", True) else None,
                    extra={
                        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                        "step_s": step_s,
                        "warmup_s": max(t.warmup_s for t in runs),
                        "tflops_per_s": achieved,
                        "mfu": achieved / peak if peak else None,
                        "peak_memory_bytes": max(t.peak_memory_bytes for t in runs),
                        "flops_per_step": flops,
                        "backend": s.compile_backend if compiled else None,
                    },
                )
            )
    return rows

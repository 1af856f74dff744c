"""What an experiment costs before it runs (``--plan``): its runs, steps and tokens, and the
GPU-hours they need from a step time, with the wall time on N GPUs.

A step time is given for one reference model (``--step_time``, seconds of one GPU per optimizer
step; with several runs sharing a GPU, the GPU's wall time divided by the runs it trains at once),
or measured here by a few steps of it. Runs of other models are scaled by their training FLOPs per
step (counted on the meta device). Wall time on N GPUs packs the runs of each stage onto N GPUs,
longest first; the stages run one after the other (a later stage needs the earlier one's results).
A pipeline run of K stages holds K GPUs for its whole length (its GPU-hours count K), and its
step time is that of the whole run. Evaluation passes and start-up are not counted.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from repro.runs.model_config import load_model_config
from repro.runs.spec import RunSpec


@dataclass(frozen=True)
class PlannedRun:
    name: str  # the run's label
    stage: int  # runs of stage s + 1 start when stage s is done
    steps: int  # optimizer steps
    tokens: int  # training tokens (steps x batch x block)
    flops: float  # training FLOPs (steps x counted FLOPs per step)
    gpus: int = 1  # GPUs the run holds (a pipeline run of K stages: K)


@lru_cache(maxsize=64)
def config_shape(path: str) -> tuple[int, int]:
    """(batch size, block size) of a model config file as written (read once per file)."""
    config = load_model_config(path)
    return config.batch_size, config.block_size


@lru_cache(maxsize=64)
def config_facts(path: str) -> tuple[int, float]:
    """(tokens per step, training FLOPs per step) of a model config file as written (the RoPE
    widths an experiment sets change a step's FLOPs by well under 1%)."""
    from .step_time import training_flops_per_step

    config = load_model_config(path)
    tokens = config.batch_size * config.block_size
    if config.is_pretrained:  # 6 x parameters per token (counted on the meta device)
        from repro.models.hf_causal_lm import HFCausalLM

        params = sum(p.numel() for p in HFCausalLM(config.pretrained).hf.parameters())
        return tokens, 6.0 * params * tokens
    cfg = config.gpt_config(int(config.data.get("vocab_size") or 256))
    return tokens, training_flops_per_step(cfg, config.batch_size, config.block_size)


def planned_runs(specs: Sequence[RunSpec], stage: int) -> list[PlannedRun]:
    out = []
    for spec in specs:
        tokens, flops = config_facts(spec.config)
        shape = {k: v for k, v in spec.override_dict().items() if k in ("data.batch_size", "data.block_size")}
        if shape:  # the run's own batch: a step's FLOPs scale with its tokens
            batch, block = config_shape(spec.config)
            own = int(shape.get("data.batch_size", batch)) * int(shape.get("data.block_size", block))
            tokens, flops = own, flops * own / tokens
        out.append(PlannedRun(spec.display, stage, spec.steps, spec.steps * tokens, spec.steps * flops))
    return out


def wall_seconds(runs: Sequence[PlannedRun], seconds_per_flop: float, gpus: int) -> float:
    """Wall time on ``gpus`` GPUs: each stage's runs packed longest first, stages in sequence."""
    total = 0.0
    for stage in sorted({r.stage for r in runs}):
        part = [r for r in runs if r.stage == stage]
        widest = max(r.gpus for r in part)
        loads = [0.0] * max(1, gpus // widest)  # slots of the stage's widest run
        slower = max(1.0, widest / gpus)  # fewer GPUs than stages: the stages share them
        heapq.heapify(loads)
        for r in sorted(part, key=lambda r: -r.flops):
            heapq.heappush(loads, heapq.heappop(loads) + r.flops * seconds_per_flop * slower)
        total += max(loads)
    return total


PEAK_FLOPS = 989e12  # the bf16 dense peak of the fastest single GPU the suite has seen (H100 / H200 SXM)


def plan_lines(
    title: str,
    runs: Sequence[PlannedRun],
    step_time: float | None,
    reference: str,
    reference_flops: float,
    gpus: Sequence[int] = (1, 8),
    how_measured: str = "given",
    unit: str = "GPU",
) -> list[str]:
    """The plan as printed lines (``unit``: 'GPU', or 'CPU worker' for a CPU scale)."""
    stages = sorted({r.stage for r in runs})
    lines = [
        f"{title}: {len(runs)} runs, {sum(r.steps for r in runs):,} optimizer steps, "
        f"{sum(r.tokens for r in runs) / 1e9:.3g} G training tokens, {sum(r.flops for r in runs):.3g} FLOPs"
    ]
    for stage in stages:
        part = [r for r in runs if r.stage == stage]
        lines.append(
            f"  stage {stage}: {len(part)} runs, {sum(r.steps for r in part):,} steps "
            f"({', '.join(sorted({f'{r.steps} steps' for r in part}, key=lambda t: -int(t.split()[0])))})"
        )
    if step_time is None:
        lines.append(
            f"  {unit}-hours: give --step_time SECONDS (one {unit}'s seconds per optimizer step of "
            f"{reference}, e.g. from make bench-gpu), or run --plan on the GPU machine to measure it"
        )
        return lines
    per_flop = step_time / reference_flops
    gpu_hours = sum(r.flops * r.gpus for r in runs) * per_flop / 3600
    lines.append(
        f"  at {step_time:.4g} s per step of {reference} ({how_measured}; other models scaled by counted "
        f"FLOPs per step): {gpu_hours:.3g} {unit}-hours"
    )
    rate = reference_flops / step_time  # what that step time implies one device does
    lines.append(f"  that step time is {rate / 1e12:.3g} TFLOP/s of training on one {unit}")
    if rate > PEAK_FLOPS:
        lines.append(
            f"  WARNING: above the bf16 dense peak of any one GPU ({PEAK_FLOPS / 1e12:.0f} TFLOP/s, an H200): "
            f"--step_time must be one step of {reference}, not of another scale's model"
        )
    for n in gpus:
        lines.append(
            f"  wall time on {n} {unit}{'s' if n > 1 else ''}: {wall_seconds(runs, per_flop, n) / 3600:.3g} h"
        )
    lines.append("  (training steps only: evaluations and start-up come on top)")
    return lines


def print_plan(
    title: str, runs: Sequence[PlannedRun], reference_config: str, accelerator: str, step_time: float | None
) -> None:
    """Print the plan; without ``step_time``, measure one on this machine's device of
    ``accelerator`` when it has one (a few steps of ``reference_config``)."""
    import torch

    from .step_time import measure_step_time

    how = "given"
    if step_time is None and accelerator == "gpu" and torch.cuda.is_available():
        step_time = measure_step_time(reference_config, torch.device("cuda", 0))
        how = f"measured here on {torch.cuda.get_device_name(0)}"
    elif step_time is None and accelerator == "cpu":
        step_time, how = measure_step_time(reference_config, torch.device("cpu")), "measured here on the CPU"
    unit = "GPU" if accelerator == "gpu" else "CPU worker"
    name = Path(reference_config).name
    for line in plan_lines(
        title, runs, step_time, name, config_facts(reference_config)[1], how_measured=how, unit=unit
    ):
        print(line)

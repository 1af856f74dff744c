"""Single-process benchmarks: the Lightning overhead (Trainer + LightningModule against a plain
PyTorch loop on the same model, data and optimizer), and the compute cost of RoPE coverage."""

from __future__ import annotations

import time
from typing import Any, Callable

import lightning as L
import torch

from repro.lit import GPTLightningModule
from repro.models import GPTConfig

from .measure import pairwise, row
from .settings import BenchSettings
from .workload import OPTIM, gpt_config, loader

CLIP = 1.0  # gradient clipping by global norm, as the shipped configs do


class StepClock(L.Callback):
    """Time at the end of every training batch (after the optimizer step)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter())


def timed_rate(times: list[float], warmup: int, per_step: float) -> float:
    """``per_step`` units per second over the steps after ``warmup`` (times are step ends)."""
    if len(times) < warmup + 2:
        raise RuntimeError(f"only {len(times)} steps were timed; need at least {warmup + 2}")
    start = times[warmup - 1] if warmup > 0 else times[0]
    steps = len(times) - warmup if warmup > 0 else len(times) - 1
    return steps * per_step / (times[-1] - start)


def lightning_times(cfg: GPTConfig, s: BenchSettings, steps: int, seed: int = 0) -> list[float]:
    """Step-end times of ``steps`` steps of Trainer.fit (one CPU process, no logger, no validation)."""
    torch.manual_seed(seed)
    module = GPTLightningModule(cfg, OPTIM)
    clock = StepClock()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        gradient_clip_val=CLIP, callbacks=[clock], num_sanity_val_steps=0,
    )
    trainer.fit(module, train_dataloaders=loader(s, steps, cfg.block_size))
    return clock.times


def plain_times(cfg: GPTConfig, s: BenchSettings, steps: int, seed: int = 0) -> list[float]:
    """The same training written as a plain loop: the module's own optimizer and schedule,
    forward, backward, clipping, step, zero_grad."""
    torch.manual_seed(seed)
    module = GPTLightningModule(cfg, OPTIM)
    conf = module.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    params = [p for p in module.parameters() if p.requires_grad]
    module.train()
    times = []
    for batch in loader(s, steps, cfg.block_size):
        _, loss = module.model(batch["input_ids"], batch["targets"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter())
    return times


def bench_lightning(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    cfg = gpt_config(s)
    steps = s.warmup_steps + s.timed_steps
    tokens = s.batch_size * s.block_size
    ours, plain = [], []
    for r in range(s.repeats):  # interleaved, so the shared machine's drift hits both alike
        progress(f"lightning overhead: repeat {r + 1} of {s.repeats}")
        ours.append(timed_rate(lightning_times(cfg, s, steps, seed=r), s.warmup_steps, tokens))
        plain.append(timed_rate(plain_times(cfg, s, steps, seed=r), s.warmup_steps, tokens))
    return [
        row("lightning", "plain PyTorch loop", "throughput", "tokens/s", plain),
        row("lightning", "Lightning Trainer + GPTLightningModule", "throughput", "tokens/s", ours,
            reference="plain PyTorch loop", ratios=pairwise(ours, plain),
            ratio_meaning="tokens/s of Lightning / tokens/s of the plain loop", goal=0.97),
    ]


def rope_variants(s: BenchSettings) -> list[tuple[str, str, GPTConfig]]:
    """(name, reference name, config): MHA with widths 0, half and full; MLA with each width."""
    hd = s.head_dim
    out = []
    for label, width in (("none", 0), ("half", hd // 2), ("full", hd)):
        out.append((f"MHA rope {width}/{hd} ({label})", f"MHA rope 0/{hd} (none)", gpt_config(s, rope_dims=[width] * s.n_layer)))
    for width in s.mla_rope_widths:
        cfg = gpt_config(s, rope_dims=None, attention="mla", qk_nope_head_dim=hd, v_head_dim=hd,
                         kv_lora_rank=max(2, s.n_embd // 2), qk_rope_head_dim=[width] * s.n_layer)
        out.append((f"MLA rope width {width}", "MLA rope width 0", cfg))
    return out


def bench_rope(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    variants = rope_variants(s)
    steps = s.warmup_steps + s.rope_timed_steps
    step_s: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for r in range(s.repeats):
        progress(f"rope cost: repeat {r + 1} of {s.repeats}")
        for name, _, cfg in variants:
            step_s[name].append(1.0 / timed_rate(plain_times(cfg, s, steps, seed=r), s.warmup_steps, 1.0))
    rows = []
    for name, ref, cfg in variants:
        is_ref = name == ref
        rows.append(row(
            "rope", name, "step time", "s/step", step_s[name],
            reference=None if is_ref else ref, ratios=None if is_ref else pairwise(step_s[name], step_s[ref]),
            ratio_meaning=None if is_ref else "step time / step time without RoPE (1.03 = 3% more)",
            extra={"params": sum(p.numel() for p in GPTLightningModule(cfg, OPTIM).parameters())},
        ))
    return rows

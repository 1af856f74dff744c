"""Single-process benchmarks: the Lightning overhead (Trainer + LightningModule against a plain
PyTorch loop on the same model, data and optimizer), and the compute cost of RoPE coverage."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from repro.experiments.kit.step_time import PlainLoop, StepClock, timed_fit
from repro.lit import GPTLightningModule
from repro.models import GPTConfig

from .measure import pairwise, row
from .settings import BenchSettings
from .workload import OPTIM, gpt_config, loader


def lightning_times(cfg: GPTConfig, s: BenchSettings, steps: int, seed: int = 0) -> list[float]:
    """Step-end times of ``steps`` steps of Trainer.fit (one CPU process, no logger, no validation)."""
    torch.manual_seed(seed)
    module = GPTLightningModule(cfg, OPTIM)
    clock = StepClock()
    timed_fit(module, loader(s, steps, cfg.block_size), steps, clock)
    return clock.times


class _PairedPlainSteps(L.Callback):
    """After each Lightning step, one plain-loop step on its own copy of the model. Lightning's
    time is everything between two plain steps (its loop, hooks, logging, data, the step); the
    plain step's time is its own. Alternating every step, both see the same machine."""

    def __init__(self, loop: PlainLoop, batches: list[dict[str, torch.Tensor]]) -> None:
        self.loop, self.batches = loop, batches
        self.lightning_s: list[float] = []
        self.plain_s: list[float] = []
        self._resumed: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._resumed = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        self.lightning_s.append(now - self._resumed)
        self.loop.step(self.batches[batch_idx])
        self._resumed = time.perf_counter()
        self.plain_s.append(self._resumed - now)


def paired_step_times(
    cfg: GPTConfig, s: BenchSettings, steps: int, seed: int = 0
) -> tuple[list[float], list[float]]:
    """(Lightning step times, plain-loop step times), the two interleaved step by step on the
    same data (one process, no logger, no validation)."""
    data = loader(s, steps, cfg.block_size)
    pairs = _PairedPlainSteps(PlainLoop.gpt(cfg, OPTIM, seed), list(data))
    torch.manual_seed(seed)
    module = GPTLightningModule(cfg, OPTIM)
    timed_fit(module, data, steps, pairs)
    return pairs.lightning_s, pairs.plain_s


def bench_lightning(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    cfg = gpt_config(s)
    steps = s.warmup_steps + s.timed_steps
    tokens = s.batch_size * s.block_size
    ours, plain = [], []
    for r in range(s.repeats):
        progress(
            f"lightning overhead: repeat {r + 1} of {s.repeats} (Lightning and the plain loop alternate every step)"
        )
        lightning_s, plain_s = paired_step_times(cfg, s, steps, seed=r)
        ours.append(tokens * s.timed_steps / sum(lightning_s[s.warmup_steps :]))
        plain.append(tokens * s.timed_steps / sum(plain_s[s.warmup_steps :]))
    return lightning_rows(
        "lightning", "plain PyTorch loop", "Lightning Trainer + GPTLightningModule", ours, plain
    )


def lightning_rows(
    section: str, plain_name: str, ours_name: str, ours: list[float], plain: list[float]
) -> list[dict]:
    """The plain loop's row and Lightning's, with their step-by-step paired ratio (goal >= 0.97)."""
    return [
        row(section, plain_name, "throughput", "tokens/s", plain),
        row(
            section,
            ours_name,
            "throughput",
            "tokens/s",
            ours,
            reference=plain_name,
            ratios=pairwise(ours, plain),
            ratio_meaning=f"tokens/s of {ours_name} / tokens/s of the {plain_name} (alternating step by step)",
            goal=0.97,
        ),
    ]


def rope_variants(s: BenchSettings) -> list[tuple[str, str, GPTConfig]]:
    """(name, reference name, config): MHA with widths 0, half and full; MLA with each width."""
    hd = s.head_dim
    out = []
    for label, width in (("none", 0), ("half", hd // 2), ("full", hd)):
        out.append(
            (
                f"MHA rope {width}/{hd} ({label})",
                f"MHA rope 0/{hd} (none)",
                gpt_config(s, rope_dims=[width] * s.n_layer),
            )
        )
    for width in s.mla_rope_widths:
        cfg = gpt_config(
            s,
            rope_dims=None,
            attention="mla",
            qk_nope_head_dim=hd,
            v_head_dim=hd,
            kv_lora_rank=max(2, s.n_embd // 2),
            qk_rope_head_dim=[width] * s.n_layer,
        )
        out.append((f"MLA rope width {width}", "MLA rope width 0", cfg))
    return out


def bench_rope(s: BenchSettings, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every variant trains in one process, the variants taking turns step by step on the same
    batches, so a slow spell of the machine hits all of them alike."""
    variants = rope_variants(s)
    steps = s.warmup_steps + s.rope_timed_steps
    step_s: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for r in range(s.repeats):
        progress(
            f"rope cost: repeat {r + 1} of {s.repeats} ({len(variants)} variants, alternating every step)"
        )
        loops = {name: PlainLoop.gpt(cfg, OPTIM, seed=r) for name, _, cfg in variants}
        totals = dict.fromkeys(loops, 0.0)
        for i, batch in enumerate(loader(s, steps)):
            for name, loop in loops.items():
                start = time.perf_counter()
                loop.step(batch)
                if i >= s.warmup_steps:
                    totals[name] += time.perf_counter() - start
        for name in loops:
            step_s[name].append(totals[name] / s.rope_timed_steps)
    rows = []
    for name, ref, cfg in variants:
        is_ref = name == ref
        rows.append(
            row(
                "rope",
                name,
                "step time",
                "s/step",
                step_s[name],
                reference=None if is_ref else ref,
                ratios=None if is_ref else pairwise(step_s[name], step_s[ref]),
                ratio_meaning=None
                if is_ref
                else "step time / step time without RoPE (1.03 = 3% more; variants alternate every step)",
                extra={"params": sum(p.numel() for p in GPTLightningModule(cfg, OPTIM).parameters())},
            )
        )
    return rows

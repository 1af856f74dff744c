"""Multi-process benchmark runs: one run of the ``clapping`` strategy at K stages (the emulated slow
network, and how step time and bytes grow with K and T), one process, and what the runs share
with the race against ``torch.distributed.pipelining`` (``versus_torch``).

Every run starts K fresh processes (fork, gloo on CPU). Each process uses ``cores // K`` threads
(at least 1). The clock runs on rank 0 from the end of the warm-up steps."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch

from repro.cores import threads_per_process
from repro.experiments.kit.step_time import StepClock, peak_rss_bytes, per_step, read_ranks
from repro.lit import GPTLightningModule
from repro.models import GPTConfig
from repro.pipeline.lightning import ClappingStrategy
from repro.runs.build import make_trainer

from .settings import BenchSettings, NetworkRun
from .single_process import lightning_times
from .workload import OPTIM, loader

BenchModel = GPTConfig | Path  # the suite's GPT by its config, or a Hugging Face model's local directory


class _RankReport(StepClock):
    """Each rank writes its step-end times (the bench's :class:`StepClock`), the strategy's byte
    counters and its peak memory."""

    def __init__(self, folder: Path, threads: int) -> None:
        super().__init__()
        self.folder, self.threads = folder, threads

    def setup(self, trainer, pl_module, stage) -> None:
        torch.set_num_threads(self.threads)

    def on_train_end(self, trainer, pl_module) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("pipe/")}
        placement = getattr(getattr(trainer.strategy, "split", None), "placement", None)  # auto's choice
        self.write(self.folder, trainer.global_rank, metrics=metrics, placement=placement)


def run_strategy(s: BenchSettings, run: NetworkRun, start_method: str, seed: int = 0, **options: Any):
    """The strategy of one bench run: its method and compressors, the bench's micro-batches
    (``options`` override any of them)."""
    kwargs: dict[str, Any] = dict(
        micro_batches=s.micro_batches,
        method=run.method,
        fwd_compressor=run.fwd_compressor,
        bwd_compressor=run.bwd_compressor,
        p=run.p,
        placement=run.placement,  # as the row says (linear unless named: auto too when named)
        sampler_seed=seed,
        start_method=start_method,
        timeout_s=300,
    )
    return ClappingStrategy(**{**kwargs, **options})


def clapping_run(
    model: BenchModel,
    s: BenchSettings,
    k: int,
    run: NetworkRun | None = None,
    bandwidth_mbps: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """One run of the clapping strategy at K stages; returns step time, bytes per step and peak
    memory per rank."""
    run = run or NetworkRun("none")
    steps = s.pipe_warmup_steps + s.pipe_timed_steps
    with tempfile.TemporaryDirectory(prefix="repro-bench-") as tmp:
        folder = Path(tmp)
        module = bench_module(model, seed)
        strategy = run_strategy(s, run, "fork", seed, bandwidth_mbps=bandwidth_mbps)
        trainer = make_trainer(
            steps=steps, devices=k, strategy=strategy, callbacks=[_RankReport(folder, threads_per_process(k))]
        )
        trainer.fit(module, train_dataloaders=loader(s, steps, _block_size(model)))
        ranks = read_ranks(folder, k)
    m = ranks[0]["metrics"]
    return {
        "step_s": per_step(ranks[0]["times"], s.pipe_warmup_steps),
        "bytes_per_step": m["pipe/bytes_total"] / steps,
        "tied_bytes_per_step": tied_bytes(m) / steps,
        "compression_ratio": m["pipe/compression_ratio"],
        "net_time_per_step_s": m.get("pipe/net_time_s", 0.0) / steps,
        "peak_rss": [r["peak_rss"] for r in ranks],
    }


def tied_bytes(metrics: dict[str, float]) -> float:
    """The tied-gradient sums' bytes within pipe/bytes_total (0 for an untied model)."""
    return sum(v for k, v in metrics.items() if k.startswith("pipe/bytes_total/tied"))


def bench_module(model: BenchModel, seed: int = 0) -> L.LightningModule:
    """The LightningModule of a bench run: the suite's GPT from its config, or a Hugging Face causal
    LM from its local directory (built on the meta device; each stage reads its own weights)."""
    torch.manual_seed(seed)
    if isinstance(model, GPTConfig):
        return GPTLightningModule(model, OPTIM)
    from repro.lit.hf_module import HFCausalLMModule  # transformers: only for the HF rows

    return HFCausalLMModule(str(model), OPTIM)


def _block_size(model: BenchModel) -> int | None:
    return model.block_size if isinstance(model, GPTConfig) else None  # an HF model: the bench's T


def one_process_run(cfg: GPTConfig, s: BenchSettings, seed: int = 0) -> dict[str, Any]:
    """The same model and batch in one process (Lightning, all cores): no pipeline, no bubble."""
    steps = s.pipe_warmup_steps + s.pipe_timed_steps
    torch.set_num_threads(os.cpu_count() or 1)
    times = lightning_times(cfg, s, steps, seed=seed)
    return {"step_s": per_step(times, s.pipe_warmup_steps), "peak_rss": [peak_rss_bytes()]}

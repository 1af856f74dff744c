"""Multi-process benchmarks: the ``clapping`` strategy against ``torch.distributed.pipelining``
(PipelineStage + ScheduleGPipe) on the same model split, micro-batches and processes; one
process; the emulated slow network; and how step time and bytes grow with K and T.

Every run starts K fresh processes (fork, gloo on CPU). Each process uses ``cores // K`` threads
(at least 1) in both frameworks. The clock runs on rank 0 from the end of the warm-up steps."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.fabric.plugins.environments.lightning import find_free_network_port

from repro.cores import threads_per_process
from repro.files import write_json_atomic
from repro.lit import GPTLightningModule
from repro.models import GPTConfig
from repro.pipeline.lightning import ClappingStrategy
from repro.pipeline.stage_parts import MaterializesStages, StageSplit, layers_per_stage, stage_adapter_for
from repro.runs.build import make_trainer

from .settings import BenchSettings, NetworkRun
from .single_process import lightning_times
from .workload import OPTIM, loader, peak_rss_bytes

BenchModel = GPTConfig | Path  # the suite's GPT by its config, or a Hugging Face model's local directory


def _read_ranks(folder: Path, k: int) -> list[dict[str, Any]]:
    missing = [r for r in range(k) if not (folder / f"rank{r}.json").exists()]
    if missing:
        raise RuntimeError(f"benchmark ranks {missing} wrote no result (see the errors above)")
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(k)]


def _mean_step_s(times: list[float], warmup: int) -> float:
    start = times[warmup - 1] if warmup > 0 else times[0]
    steps = len(times) - warmup if warmup > 0 else len(times) - 1
    return (times[-1] - start) / steps


class _RankReport(L.Callback):
    """Each rank writes its step-end times, the strategy's byte counters and its peak memory."""

    def __init__(self, folder: Path, threads: int) -> None:
        self.folder, self.threads = folder, threads
        self.times: list[float] = []

    def setup(self, trainer, pl_module, stage) -> None:
        torch.set_num_threads(self.threads)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("pipe/")}
        write_json_atomic(
            self.folder / f"rank{trainer.global_rank}.json",
            {"times": self.times, "metrics": metrics, "peak_rss": peak_rss_bytes()},
        )


def run_strategy(s: BenchSettings, run: NetworkRun, start_method: str, seed: int = 0, **options: Any):
    """The strategy of one bench run: its method and compressors, the bench's micro-batches."""
    return ClappingStrategy(
        micro_batches=s.micro_batches,
        method=run.method,
        fwd_compressor=run.fwd_compressor,
        bwd_compressor=run.bwd_compressor,
        p=run.p,
        sampler_seed=seed,
        start_method=start_method,
        timeout_s=options.pop("timeout_s", 300),
        **options,
    )


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
        ranks = _read_ranks(folder, k)
    m = ranks[0]["metrics"]
    return {
        "step_s": _mean_step_s(ranks[0]["times"], s.pipe_warmup_steps),
        "bytes_per_step": m["pipe/bytes_total"] / steps,
        "compression_ratio": m["pipe/compression_ratio"],
        "net_time_per_step_s": m.get("pipe/net_time_s", 0.0) / steps,
        "peak_rss": [r["peak_rss"] for r in ranks],
    }


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


def stage_module(module: L.LightningModule, rank: int, k: int) -> tuple[torch.nn.Sequential, list]:
    """Stage ``rank`` of the module for torch.distributed.pipelining, cut by the same stage adapter
    as the clapping strategy's stages (equal layer counts), with only its own parts materialized;
    and its parameters that other stages hold too (tied weights)."""
    adapter = stage_adapter_for(module)
    parts = adapter.parts()
    split = StageSplit(rank, k, layers_per_stage(len(parts.layers), k), parts)
    modules = split.modules_of(rank)
    if isinstance(adapter, MaterializesStages):
        adapter.materialize(modules)
    stage = torch.nn.Sequential(*modules)
    others = {id(q) for st in range(k) if st != rank for m in split.modules_of(st) for q in m.parameters()}
    return stage, [q for q in stage.parameters() if id(q) in others]


def _torch_worker(
    rank: int, k: int, port: int, model: BenchModel, s: BenchSettings, folder: str, seed: int
) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe  # heavy; only in these workers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads_per_process(k))
    dist.init_process_group("gloo", rank=rank, world_size=k)
    try:
        module = bench_module(model, seed)  # the same model object and optimizer as ours
        adapter = stage_adapter_for(module)
        stage_part, tied = stage_module(module, rank, k)
        stage = PipelineStage(stage_part, rank, k, torch.device("cpu"))
        schedule = ScheduleGPipe(
            stage, s.micro_batches, loss_fn=lambda out, y: adapter.loss(out, {"targets": y})
        )
        params = [p for p in stage_part.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=OPTIM["lr"])
        # a tied embedding and head (the suite's GPT): the first and last stage each hold the weight,
        # and summing its two gradients keeps them one weight (as the clapping strategy does)
        tied_group = dist.new_group([0, k - 1])
        steps = s.pipe_warmup_steps + s.pipe_timed_steps
        times = []
        for batch in loader(s, steps, _block_size(model)):
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                schedule.step(batch["input_ids"])
            elif rank == k - 1:
                schedule.step(target=batch["targets"])
            else:
                schedule.step()
            for weight in tied:
                dist.all_reduce(weight.grad, group=tied_group)
            opt.step()
            times.append(time.perf_counter())
        write_json_atomic(Path(folder) / f"rank{rank}.json", {"times": times, "peak_rss": peak_rss_bytes()})
    finally:
        dist.destroy_process_group()


def torch_pipelining_run(model: BenchModel, s: BenchSettings, k: int, seed: int = 0) -> dict[str, Any]:
    """One run of PyTorch's own pipeline (PipelineStage + ScheduleGPipe) at K stages."""
    with tempfile.TemporaryDirectory(prefix="repro-bench-") as tmp:
        mp.start_processes(
            _torch_worker,
            args=(k, find_free_network_port(), model, s, tmp, seed),
            nprocs=k,
            start_method="fork",
        )
        ranks = _read_ranks(Path(tmp), k)
    return {
        "step_s": _mean_step_s(ranks[0]["times"], s.pipe_warmup_steps),
        "peak_rss": [r["peak_rss"] for r in ranks],
    }


def one_process_run(cfg: GPTConfig, s: BenchSettings, seed: int = 0) -> dict[str, Any]:
    """The same model and batch in one process (Lightning, all cores): no pipeline, no bubble."""
    steps = s.pipe_warmup_steps + s.pipe_timed_steps
    torch.set_num_threads(os.cpu_count() or 1)
    times = lightning_times(cfg, s, steps, seed=seed)
    return {"step_s": _mean_step_s(times, s.pipe_warmup_steps), "peak_rss": [peak_rss_bytes()]}

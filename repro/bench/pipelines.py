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
from lightning.fabric.plugins.environments.lightning import find_free_network_port

from repro.files import write_json_atomic
from repro.lit import GPTLightningModule
from repro.models import GPT, GPTConfig

from .settings import BenchSettings, NetworkRun
from .workload import OPTIM, loader, peak_rss_bytes


def threads_per_process(k: int) -> int:
    return max(1, (os.cpu_count() or 1) // k)


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
        write_json_atomic(self.folder / f"rank{trainer.global_rank}.json",
                    {"times": self.times, "metrics": metrics, "peak_rss": peak_rss_bytes()})


def clapping_run(cfg: GPTConfig, s: BenchSettings, k: int, run: NetworkRun | None = None,
                 bandwidth_mbps: float | None = None, seed: int = 0) -> dict[str, Any]:
    """One run of the clapping strategy at K stages; returns step time, bytes per step and peak
    memory per rank."""
    from repro.pipeline import ClappingStrategy

    run = run or NetworkRun("none")
    steps = s.pipe_warmup_steps + s.pipe_timed_steps
    with tempfile.TemporaryDirectory(prefix="repro-bench-") as tmp:
        folder = Path(tmp)
        torch.manual_seed(seed)
        module = GPTLightningModule(cfg, OPTIM)
        strategy = ClappingStrategy(
            micro_batches=s.micro_batches, method=run.method, fwd_compressor=run.fwd_compressor,
            bwd_compressor=run.bwd_compressor, p=run.p, sampler_seed=seed, bandwidth_mbps=bandwidth_mbps,
            start_method="fork", timeout_s=300,
        )
        trainer = L.Trainer(
            accelerator="cpu", devices=k, strategy=strategy, max_steps=steps, limit_val_batches=0, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, callbacks=[_RankReport(folder, threads_per_process(k))],
        )
        trainer.fit(module, train_dataloaders=loader(s, steps, cfg.block_size))
        ranks = _read_ranks(folder, k)
    m = ranks[0]["metrics"]
    return {
        "step_s": _mean_step_s(ranks[0]["times"], s.pipe_warmup_steps),
        "bytes_per_step": m["pipe/bytes_total"] / steps,
        "compression_ratio": m["pipe/compression_ratio"],
        "net_time_per_step_s": m.get("pipe/net_time_s", 0.0) / steps,
        "peak_rss": [r["peak_rss"] for r in ranks],
    }


class _StageModule(torch.nn.Module):
    """Stage ``rank`` of the GPT for torch.distributed.pipelining: the embedding on the first
    stage, its share of the blocks, the final norm and head on the last."""

    def __init__(self, gpt: GPT, rank: int, k: int) -> None:
        super().__init__()
        per = len(gpt.blocks) // k
        self._gpt = [gpt]
        self.first, self.last = rank == 0, rank == k - 1
        self.wte = gpt.wte if self.first else None
        self.blocks = torch.nn.ModuleList(list(gpt.blocks)[rank * per:(rank + 1) * per])
        self.norm_f = gpt.norm_f if self.last else None
        self.lm_head = gpt.lm_head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self._gpt[0].embed(x)
        for block in self.blocks:
            x = block(x)
        return self._gpt[0].head(x) if self.last else x


def _torch_worker(rank: int, k: int, port: int, cfg: GPTConfig, s: BenchSettings, folder: str, seed: int) -> None:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads_per_process(k))
    dist.init_process_group("gloo", rank=rank, world_size=k)
    try:
        torch.manual_seed(seed)
        module = GPTLightningModule(cfg, OPTIM)  # the same model object and optimizer as ours
        stage_module = _StageModule(module.model, rank, k)
        stage = PipelineStage(stage_module, rank, k, torch.device("cpu"))
        schedule = ScheduleGPipe(stage, s.micro_batches, loss_fn=module.model.loss)
        params = [p for p in stage_module.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=OPTIM["lr"])
        # the GPT ties its embedding and head: the first and last stage each hold the weight, and
        # summing its two gradients keeps them one weight (as the clapping strategy does)
        tied_group = dist.new_group([0, k - 1])
        tied = module.model.lm_head.weight if rank in (0, k - 1) else None
        steps = s.pipe_warmup_steps + s.pipe_timed_steps
        times = []
        for batch in loader(s, steps, cfg.block_size):
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                schedule.step(batch["input_ids"])
            elif rank == k - 1:
                schedule.step(target=batch["targets"])
            else:
                schedule.step()
            if tied is not None:
                dist.all_reduce(tied.grad, group=tied_group)
            opt.step()
            times.append(time.perf_counter())
        write_json_atomic(Path(folder) / f"rank{rank}.json", {"times": times, "peak_rss": peak_rss_bytes()})
    finally:
        dist.destroy_process_group()


def torch_pipelining_run(cfg: GPTConfig, s: BenchSettings, k: int, seed: int = 0) -> dict[str, Any]:
    """One run of PyTorch's own pipeline (PipelineStage + ScheduleGPipe) at K stages."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="repro-bench-") as tmp:
        mp.start_processes(_torch_worker, args=(k, find_free_network_port(), cfg, s, tmp, seed), nprocs=k, start_method="fork")
        ranks = _read_ranks(Path(tmp), k)
    return {"step_s": _mean_step_s(ranks[0]["times"], s.pipe_warmup_steps), "peak_rss": [r["peak_rss"] for r in ranks]}


def one_process_run(cfg: GPTConfig, s: BenchSettings, seed: int = 0) -> dict[str, Any]:
    """The same model and batch in one process (Lightning, all cores): no pipeline, no bubble."""
    from .single_process import lightning_times

    steps = s.pipe_warmup_steps + s.pipe_timed_steps
    torch.set_num_threads(os.cpu_count() or 1)
    times = lightning_times(cfg, s, steps, seed=seed)
    return {"step_s": _mean_step_s(times, s.pipe_warmup_steps), "peak_rss": [peak_rss_bytes()]}

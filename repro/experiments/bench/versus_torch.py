"""Ours against ``torch.distributed.pipelining`` (PipelineStage + ScheduleGPipe): the same model,
cut into the same stages by the same stage adapter, the same micro-batches, processes and threads.

The two pipelines run at once and take turns step by step. Both start their K processes (fork,
gloo on CPU); every rank of both waits at one shared barrier before the first step, and after
each step of either, so only one pipeline computes at a time and the two steps of a pair are
timed about a second apart. On a shared machine whose speed drifts by 10 % from one minute to the
next (a whole run of one against a whole run of the other moved the ratio from 0.86 to 1.12
here), the drift cancels within a pair. A step's time runs from the release that starts it to the
release that ends it: every rank's work, the slowest rank's included, and for ours everything
Lightning does between two steps (its loop, hooks, data, the optimizer step)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.fabric.plugins.environments.lightning import find_free_network_port

from repro.cores import threads_per_process
from repro.experiments.kit.step_time import StepClock, read_ranks
from repro.files import write_json_atomic
from repro.pipeline.stage_parts import MaterializesStages, StageSplit, layers_per_stage, stage_adapter_for
from repro.runs.build import make_trainer

from .measure import pairwise, row
from .pipelines import (
    BenchModel,
    _block_size,
    _RankReport,
    bench_module,
    run_strategy,
    tied_bytes,
)
from .settings import TORCH_V_SCHEDULES, BenchSettings, NetworkRun
from .workload import OPTIM, loader

OURS = "clapping none+identity"
TORCH = "torch.distributed.pipelining GPipe"
TURN_TIMEOUT_S = 300.0  # seconds a rank waits at the barrier for the other pipeline's step


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


def v_chunks(module: L.LightningModule, rank: int, k: int) -> list[tuple[int, torch.nn.Sequential]]:
    """Rank ``rank``'s two chunks for torch's V schedules, each with its stage index: the model cut by
    the same stage adapter into 2K chunks (equal layer counts), this rank holding chunks ``rank`` and
    ``2K - 1 - rank``, so rank 0 holds both the embedding and the head (a tied weight's two gradients
    are then summed on that rank: :func:`own_copies`)."""
    adapter = stage_adapter_for(module)
    parts = adapter.parts()
    counts = layers_per_stage(len(parts.layers), 2 * k)
    held = {c: StageSplit(c, 2 * k, counts, parts).modules_of(c) for c in (rank, 2 * k - 1 - rank)}
    if isinstance(adapter, MaterializesStages):
        adapter.materialize([m for modules in held.values() for m in modules])
    return [(c, torch.nn.Sequential(*modules)) for c, modules in held.items()]


def own_copies(
    second: torch.nn.Module, first: torch.nn.Module
) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    """Give ``second`` its own copy of every parameter it shares with ``first`` (a tied embedding and
    head on rank 0 of a V schedule); returns the (first's, second's) pairs, whose gradients the step
    sums. torch's ZBV and DualPipeV (2.13) drop part of a shared weight's gradient: rank 0's tied
    weight got a gradient of norm 0.094 where one process gets 0.359 (K = 2, the links model)."""
    shared = {id(p): p for p in first.parameters()}
    pairs = []
    for name, p in list(second.named_parameters(remove_duplicate=False)):
        if id(p) in shared:
            owner_name, _, attr = name.rpartition(".")
            copy = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
            setattr(second.get_submodule(owner_name), attr, copy)
            pairs.append((p, copy))
    return pairs


class TorchPipelineRank:
    """One rank of ``torch.distributed.pipelining`` on a bench module: the stage cut by the same stage
    adapter as ours, its GPipe, 1F1B, ZBV or DualPipeV schedule over M micro-batches, AdamW; ``step``
    is one optimizer step (zero_grad, the schedule, the tied weights' gradient sum, the update). The
    V schedules hold two chunks a rank (:func:`v_chunks`): no tied sum. Every rank builds one, in the
    same order (it creates a process group)."""

    def __init__(
        self, module: L.LightningModule, rank: int, k: int, micro_batches: int, schedule: str = "gpipe"
    ):
        from torch.distributed import pipelining  # heavy; workers only
        from torch.distributed.pipelining import PipelineStage

        adapter = stage_adapter_for(module)
        device = torch.device("cpu")

        def loss_fn(out, y):
            return adapter.loss(out, {"targets": y})

        if schedule in TORCH_V_SCHEDULES:
            indexed = v_chunks(module, rank, k)
            chunks = [chunk for _, chunk in indexed]
            self.local_pairs = own_copies(chunks[1], chunks[0])  # summed on the rank: no bytes
            stages = [PipelineStage(chunk, i, 2 * k, device) for i, chunk in indexed]
            schedule_class = getattr(pipelining.schedules, TORCH_V_SCHEDULES[schedule])
            self.schedule = schedule_class(stages, micro_batches, loss_fn=loss_fn)
            params = [p for c in chunks for p in c.parameters()]
            self.tied: list = []
            self.holds_ends = rank == 0  # chunk 0 (the inputs) and chunk 2K - 1 (the loss)
        else:
            part, self.tied = stage_module(module, rank, k)
            schedule_class = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule]
            self.schedule = schedule_class(
                PipelineStage(part, rank, k, device), micro_batches, loss_fn=loss_fn
            )
            params = part.parameters()
            self.holds_ends, self.local_pairs = False, []
        self.opt = torch.optim.AdamW([p for p in params if p.requires_grad], lr=OPTIM["lr"])
        # a tied embedding and head (the suite's GPT), linear stages: the first and last stage each
        # hold the weight, and summing its two gradients keeps them one weight (as the clapping strategy does)
        self.tied_group = dist.new_group([0, k - 1])
        self.rank, self.k = rank, k

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        self.opt.zero_grad(set_to_none=True)
        if self.holds_ends:
            self.schedule.step(batch["input_ids"], target=batch["targets"])
        elif self.rank == 0:
            self.schedule.step(batch["input_ids"])
        elif self.rank == self.k - 1:
            self.schedule.step(target=batch["targets"])
        else:
            self.schedule.step()
        for weight in self.tied:
            dist.all_reduce(weight.grad, group=self.tied_group)
        for a, b in self.local_pairs:  # one weight in two chunks of this rank: both get the sum
            a.grad += b.grad
            b.grad.copy_(a.grad)
        self.opt.step()


def _torch_worker(
    rank: int, k: int, port: int, model: BenchModel, s: BenchSettings, folder: str, seed: int, turns
) -> None:
    """One rank of torch's pipeline: its own step (zero_grad, the GPipe schedule, the tied weights'
    gradient sum, AdamW) between two turns at the shared barrier."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads_per_process(k))
    dist.init_process_group("gloo", rank=rank, world_size=k)
    try:
        pipe = TorchPipelineRank(
            bench_module(model, seed), rank, k, s.micro_batches
        )  # ours' model, optimizer
        steps = s.pipe_warmup_steps + s.pipe_timed_steps
        batches = iter(loader(s, steps, _block_size(model)))
        turns.wait()  # both pipelines are set up
        for _ in range(steps):
            turns.wait()  # ours has done its step: this one's turn
            pipe.step(next(batches))
            turns.wait()  # every rank of this pipeline is done: ours' turn
        StepClock().write(folder, rank)  # its peak memory (turn_times times the steps)
    except BaseException:
        turns.abort()  # ours stops waiting for this pipeline
        raise
    finally:
        dist.destroy_process_group()


class _TakeTurns(L.Callback):
    """Ours' side of the turns: every rank waits at the shared barrier before the first step and
    twice after each (ours done, then torch's done); rank 0 writes when each wait ended."""

    def __init__(self, turns, folder: Path) -> None:
        self.turns, self.folder = turns, folder
        self.releases: list[float] = []

    def _wait(self) -> None:
        self.turns.wait()
        self.releases.append(time.perf_counter())

    def on_train_start(self, trainer, pl_module) -> None:
        self._wait()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._wait()  # every rank of ours is done: torch's turn
        self._wait()  # torch's step is done: ours' next step

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.turns.abort()  # torch's ranks stop waiting for ours

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_rank == 0:
            write_json_atomic(self.folder / "releases.json", self.releases)


def _broken_turns(error: BaseException) -> bool:
    """A failure that only says the other pipeline broke the barrier (it failed first)."""
    return isinstance(error, threading.BrokenBarrierError) or "BrokenBarrierError" in str(error)


def turn_times(releases: list[float]) -> tuple[list[float], list[float]]:
    """(ours' step times, torch's step times) from the barrier's release times: the first release
    starts ours' step 0, and each later one ends the step of one pipeline and starts the other's."""
    if len(releases) % 2 != 1:
        raise ValueError(f"{len(releases)} releases: expected one before the steps and two per step")
    gaps = [b - a for a, b in zip(releases, releases[1:])]
    return gaps[0::2], gaps[1::2]


def paired_runs(model: BenchModel, s: BenchSettings, k: int, seed: int = 0) -> tuple[dict, dict]:
    """Ours (the clapping strategy, method none) and torch.distributed.pipelining at K stages, taking
    turns step by step. Returns (ours, torch), each with ``step_s`` (the mean of the timed steps),
    ``step_times`` (every step) and ``peak_rss`` per rank; ours also with its bytes per step."""
    steps = s.pipe_warmup_steps + s.pipe_timed_steps
    turns = mp.get_context("fork").Barrier(2 * k, timeout=TURN_TIMEOUT_S)
    with tempfile.TemporaryDirectory(prefix="repro-bench-") as tmp:
        ours_dir, torch_dir = Path(tmp) / "ours", Path(tmp) / "torch"
        ours_dir.mkdir()
        torch_dir.mkdir()
        torch_ranks = mp.start_processes(
            _torch_worker,
            args=(k, find_free_network_port(), model, s, str(torch_dir), seed, turns),
            nprocs=k,
            join=False,
            start_method="fork",
        )
        try:
            module = bench_module(model, seed)
            strategy = run_strategy(s, NetworkRun("none"), "fork", seed)
            callbacks = [_RankReport(ours_dir, threads_per_process(k)), _TakeTurns(turns, ours_dir)]
            trainer = make_trainer(steps=steps, devices=k, strategy=strategy, callbacks=callbacks)
            trainer.fit(module, train_dataloaders=loader(s, steps, _block_size(model)))
        except BaseException as ours_error:
            turns.abort()
            try:
                while not torch_ranks.join():
                    pass
            except Exception as torch_error:
                # the first failure is the one to report; the other pipeline only found the barrier broken
                if _broken_turns(ours_error) and not _broken_turns(torch_error):
                    raise torch_error from None
            raise
        while not torch_ranks.join():
            pass
        ours_reports, torch_reports = read_ranks(ours_dir, k), read_ranks(torch_dir, k)
        ours_steps, torch_steps = turn_times(json.loads((ours_dir / "releases.json").read_text()))
    m = ours_reports[0]["metrics"]
    timed = slice(s.pipe_warmup_steps, None)

    def mean(times: list[float]) -> float:
        return sum(times[timed]) / len(times[timed])

    ours = {
        "step_s": mean(ours_steps),
        "step_times": ours_steps,
        "bytes_per_step": m["pipe/bytes_total"] / steps,
        "tied_bytes_per_step": tied_bytes(m) / steps,
        "compression_ratio": m["pipe/compression_ratio"],
        "net_time_per_step_s": m.get("pipe/net_time_s", 0.0) / steps,
        "peak_rss": [r["peak_rss"] for r in ours_reports],
    }
    theirs = {
        "step_s": mean(torch_steps),
        "step_times": torch_steps,
        "peak_rss": [r["peak_rss"] for r in torch_reports],
    }
    return ours, theirs


def versus_torch_rows(
    section: str, model: str, k: int, tokens: int, ours: list[dict], ref: list[dict], same: str = ""
) -> list[dict[str, Any]]:
    """torch.distributed.pipelining's throughput at K stages, and ours against it (goal >= 1.0);
    ``model`` prefixes the labels, ``same`` ends the ratio's meaning."""
    ours_tps = [tokens / x["step_s"] for x in ours]
    ref_tps = [tokens / x["step_s"] for x in ref]

    def peak(runs: list[dict]) -> dict[str, Any]:
        return {"stages": k, "peak_rss_max": max(max(x["peak_rss"]) for x in runs)}

    torch_label = f"{model}{TORCH} K={k}"
    return [
        row(section, torch_label, "throughput", "tokens/s", ref_tps, extra=peak(ref)),
        row(
            section,
            f"{model}{OURS} K={k}",
            "throughput",
            "tokens/s",
            ours_tps,
            reference=torch_label,
            ratios=pairwise(ours_tps, ref_tps),
            ratio_meaning="tokens/s of ours / tokens/s of torch.distributed.pipelining, the two taking turns "
            "step by step" + same,
            goal=1.0,
            extra=peak(ours),
        ),
    ]

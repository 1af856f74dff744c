"""Short training runs of one config with other RoPE widths: the unit the profilers are made of.

A run trains the config's GPT through the LightningModule and a Lightning Trainer with given
per-layer widths, seed and steps, evaluates every ``eval_every`` steps, and writes a result JSON
atomically (``<runs_dir>/<name>.json``). A run whose result file exists with the same
fingerprint is not trained again, so an interrupted profile resumes where it stopped.
Same seed = same init seed and same data order.

``train_runs`` trains a list of runs one after another, or in ``workers`` spawned processes
(independent runs, each writing its own result file). On a small model two single-thread
processes train faster than one process with two threads. A run's numbers depend on its torch
thread count only through float rounding; the count is recorded in the result.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from repro.files import write_json_atomic
from repro.run_config import RunConfig


@dataclass(frozen=True)
class RunSpec:
    name: str  # file stem of the result (unique within a runs directory)
    widths: tuple[int, ...]  # per-layer rotary widths
    seed: int  # init seed and data-order seed
    steps: int  # optimizer steps to train
    eval_every: int  # evaluate the validation loss every this many steps
    schedule_steps: int | None = None  # decay_steps of the lr schedule (None = the config's own)
    save_checkpoint: bool = False  # also write <name>.ckpt (used for the phase-off reference)


def run_name(high_layers: list[int] | tuple[int, ...] | None, seed: int, prefix: str = "high") -> str:
    layers = "none" if not high_layers else "_".join(str(i) for i in sorted(high_layers))
    return f"{prefix}-{layers}-s{seed}"


class ValLossRecorder(L.Callback):
    """Collects (global step, val/loss) after every validation."""

    def __init__(self) -> None:
        self.curve: list[tuple[int, float]] = []

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get("val/loss")
        if value is not None:
            self.curve.append((int(trainer.global_step), float(value)))


def fingerprint(run_config: RunConfig, spec: RunSpec) -> str:
    payload = {
        "gpt": run_config.gpt,
        "optim": run_config.optim,
        "data": {k: v for k, v in run_config.data.items() if k not in ("cache_dir", "num_workers")},
        "trainer": {k: run_config.trainer.get(k) for k in ("gradient_clip_val", "limit_val_batches", "precision")},
        "widths": list(spec.widths),
        "seed": spec.seed,
        "steps": spec.steps,
        "eval_every": spec.eval_every,
        "schedule_steps": spec.schedule_steps,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_finished(path: Path, expected_fingerprint: str) -> dict[str, Any] | None:
    """The result of a finished run, or None when it is missing or from another setting."""
    if not path.is_file():
        return None
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return result if result.get("fingerprint") == expected_fingerprint else None


def train_run(
    run_config: RunConfig, spec: RunSpec, runs_dir: Path, datamodule, accelerator: str = "cpu",
    threads: int | None = None,
) -> dict[str, Any]:
    """Train one variant (or reuse its finished result) and return the result record."""
    import torch

    from repro.lit import GPTLightningModule, OptimConfig
    from repro.lit.precision import default_precision

    runs_dir.mkdir(parents=True, exist_ok=True)
    result_path = runs_dir / f"{spec.name}.json"
    fp = fingerprint(run_config, spec)
    finished = reusable_result(run_config, spec, runs_dir)
    if finished is not None:
        return finished

    start = time.perf_counter()
    if threads is not None:
        torch.set_num_threads(threads)
    datamodule.shuffle_seed = spec.seed
    L.seed_everything(spec.seed, workers=True, verbose=False)
    list_field = "rope_dims" if run_config.shape_config().attention == "mha" else "qk_rope_head_dim"
    gpt = run_config.gpt_config(datamodule.vocab_size, **{list_field: list(spec.widths)})
    optim_fields = dict(run_config.optim)
    if spec.schedule_steps is not None:
        optim_fields["decay_steps"] = spec.schedule_steps
    module = GPTLightningModule(gpt, OptimConfig(**optim_fields))
    recorder = ValLossRecorder()
    tb_dir = runs_dir / "tb" / spec.name
    if tb_dir.exists():  # left by an interrupted attempt
        shutil.rmtree(tb_dir)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=run_config.trainer.get("precision") or default_precision(accelerator),
        max_steps=spec.steps,
        val_check_interval=spec.eval_every,
        check_val_every_n_epoch=None,
        limit_val_batches=run_config.trainer.get("limit_val_batches", 1.0),
        num_sanity_val_steps=0,
        gradient_clip_val=run_config.trainer.get("gradient_clip_val"),
        logger=TensorBoardLogger(save_dir=str(runs_dir / "tb"), name=spec.name, version=0, default_hp_metric=False),
        callbacks=[recorder],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=max(1, min(10, spec.eval_every)),
    )
    trainer.fit(module, datamodule=datamodule)
    if spec.save_checkpoint:
        trainer.save_checkpoint(runs_dir / f"{spec.name}.ckpt")
    result = {
        "name": spec.name,
        "fingerprint": fp,
        "widths": list(spec.widths),
        "seed": spec.seed,
        "steps": spec.steps,
        "eval_every": spec.eval_every,
        "schedule_steps": spec.schedule_steps,
        "global_step": int(trainer.global_step),
        "val_curve": recorder.curve,
        "tokens_trained": int(trainer.global_step) * datamodule.batch_size * datamodule.block_size,
        "wall_s": time.perf_counter() - start,
        "threads": torch.get_num_threads(),
        "checkpoint": str(runs_dir / f"{spec.name}.ckpt") if spec.save_checkpoint else None,
        "config": run_config.path,
    }
    write_json_atomic(result_path, result)
    result["reused"] = False
    return result


_WORKER: dict[str, Any] = {}


def data_key(data_args: dict[str, Any]) -> str:
    """The key of a data setting in the ``datamodules`` map of ``train_jobs``."""
    return json.dumps(data_args, sort_keys=True, default=str)


def _worker_init(accelerator: str, threads: int) -> None:
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    _WORKER.update(accelerator=accelerator, threads=threads, datamodules={})


def _worker_datamodule(data_args: dict[str, Any]):
    """One datamodule per data setting and worker (it loads the tokenizer and tokens the parent cached)."""
    from repro.data import TextDataModule

    key = data_key(data_args)
    if key not in _WORKER["datamodules"]:
        datamodule = TextDataModule(**data_args)
        datamodule.setup("fit")
        _WORKER["datamodules"][key] = datamodule
    return _WORKER["datamodules"][key]


def _worker_train(job: "RunJob") -> dict[str, Any]:
    w = _WORKER
    datamodule = _worker_datamodule(job.data_args)
    return train_run(job.run_config, job.spec, job.runs_dir, datamodule, w["accelerator"], w["threads"])


@dataclass(frozen=True)
class RunJob:
    """One run of any config: what ``train_jobs`` trains (runs of several configs share one pool)."""

    run_config: RunConfig  # the model, optimizer, data and trainer settings
    spec: RunSpec  # widths, seed, steps of this run
    runs_dir: Path  # where its result JSON and TensorBoard log go
    data_args: dict[str, Any]  # TextDataModule arguments (the parent's datamodule hparams)

    @property
    def key(self) -> str:
        return str(self.runs_dir / self.spec.name)


def train_jobs(
    jobs: list[RunJob],
    datamodules: dict[str, Any],
    accelerator: str = "cpu",
    workers: int = 1,
    threads: int | None = None,
    label: str = "runs",
    progress: "Progress | None" = None,
) -> dict[str, dict[str, Any]]:
    """Train (or reuse) runs of one or more configs; ``job.key`` -> result.

    ``datamodules`` maps the data key of every job (``data_key(job.data_args)``) to a datamodule
    of the parent process, used when training sequentially; with ``workers > 1`` each spawned
    worker builds its own from ``job.data_args`` after the parent has cached tokenizer and tokens.
    ``threads``: torch threads per run (default: the current count when sequential,
    cpu_count // workers in worker processes). Workers are spawned, so a script that calls this
    with ``workers > 1`` needs the usual ``if __name__ == "__main__":`` guard. ``progress``: a
    shared progress (several calls of one experiment), else one is made for these jobs.
    """
    import os

    if not isinstance(workers, int) or isinstance(workers, bool) or workers <= 0:
        raise ValueError(f"workers={workers!r}: must be a positive integer")
    keys = [job.key for job in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"run names are not unique: {sorted({k for k in keys if keys.count(k) > 1})}")
    parallel = workers > 1 and accelerator == "cpu" and len(jobs) > 1
    if progress is None:
        progress = Progress(len(jobs), label, min(workers, len(jobs)) if parallel else 1)
    results: dict[str, dict[str, Any]] = {}
    pending = []
    for job in jobs:  # finished runs are reused here, without starting a worker for them
        finished = reusable_result(job.run_config, job.spec, job.runs_dir)
        if finished is not None:
            results[job.key] = finished
            progress.update(job.spec.name, finished)
        else:
            pending.append(job)
    if not parallel or len(pending) <= 1:
        for job in pending:
            datamodule = datamodules[data_key(job.data_args)]
            results[job.key] = train_run(job.run_config, job.spec, job.runs_dir, datamodule, accelerator, threads)
            progress.update(job.spec.name, results[job.key])
        return {key: results[key] for key in keys}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    for datamodule in datamodules.values():
        datamodule.setup("fit")  # train the tokenizer and cache the tokens once, before the workers load them
    with ProcessPoolExecutor(
        max_workers=min(workers, len(pending)),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=(accelerator, threads),
    ) as pool:
        futures = {pool.submit(_worker_train, job): job for job in pending}
        for future in as_completed(futures):
            job = futures[future]
            results[job.key] = future.result()
            progress.update(job.spec.name, results[job.key])
    return {key: results[key] for key in keys}


def reusable_result(run_config: RunConfig, spec: RunSpec, runs_dir: Path) -> dict[str, Any] | None:
    """The finished result of this run (marked ``reused``), or None when it must be trained."""
    finished = load_finished(runs_dir / f"{spec.name}.json", fingerprint(run_config, spec))
    if finished is None or (spec.save_checkpoint and not (runs_dir / f"{spec.name}.ckpt").is_file()):
        return None
    finished["reused"] = True
    return finished


def train_runs(
    run_config: RunConfig,
    specs: list[RunSpec],
    runs_dir: Path,
    datamodule,
    accelerator: str = "cpu",
    workers: int = 1,
    threads: int | None = None,
    label: str = "runs",
    quiet: bool = False,
) -> dict[str, dict[str, Any]]:
    """Train (or reuse) every run of one config, in order or in ``workers`` processes; name -> result.

    See ``train_jobs`` for threads and workers; ``quiet`` prints no progress lines.
    """
    data_args = dict(datamodule.hparams)
    jobs = [RunJob(run_config, spec, runs_dir, data_args) for spec in specs]
    progress = Progress(len(jobs), label, workers, quiet=True) if quiet else None
    results = train_jobs(jobs, {data_key(data_args): datamodule}, accelerator, workers, threads, label, progress)
    return {job.spec.name: results[job.key] for job in jobs}


def mean_last(curve: list[tuple[int, float]] | list[list[float]], n: int, name: str = "run") -> float:
    """Mean of the last n evaluations of a validation curve."""
    if len(curve) < n:
        raise ValueError(f"{name}: {len(curve)} evaluations, fewer than the {n} to average; train longer or lower n")
    return sum(loss for _, loss in curve[-n:]) / n


class Progress:
    """'run i of N' lines with elapsed time and an estimate of what is left (stderr).

    With ``total_steps`` the estimate is by optimizer steps (runs of different lengths, such as
    profile runs and full runs, share one progress); otherwise by runs. ``extend`` adds runs that
    become known later (a later stage of an experiment).
    """

    def __init__(self, total: int, label: str, workers: int = 1, total_steps: int | None = None,
                 quiet: bool = False) -> None:
        self.total, self.label, self.workers, self.quiet = total, label, workers, quiet
        self.total_steps = total_steps
        self.done = 0
        self.done_steps = 0
        self.trained_s = 0.0
        self.trained = 0
        self.trained_steps = 0
        self.start = time.perf_counter()

    def extend(self, runs: int, steps: int = 0) -> None:
        self.total += runs
        if self.total_steps is not None:
            self.total_steps += steps

    def update(self, name: str, result: dict[str, Any]) -> None:
        self.done += 1
        steps = int(result.get("steps", 0))
        self.done_steps += steps
        if not result.get("reused"):
            self.trained += 1
            self.trained_s += float(result.get("wall_s", 0.0))
            self.trained_steps += steps
        if self.total_steps is not None and self.trained_steps:
            seconds_per_step = self.trained_s / self.trained_steps
            left = seconds_per_step * max(0, self.total_steps - self.done_steps) / self.workers
        else:
            per_run = self.trained_s / self.trained if self.trained else 0.0
            left = per_run * (self.total - self.done) / self.workers  # workers train runs side by side
        if self.quiet:
            return
        status = "reused" if result.get("reused") else f"trained in {result.get('wall_s', 0):.1f}s"
        elapsed = time.perf_counter() - self.start
        print(
            f"[{self.label}] run {self.done} of {self.total}: {name} {status}; "
            f"elapsed {elapsed:.0f}s, about {left:.0f}s left",
            file=sys.stderr,
            flush=True,
        )

"""Train one run: the model config goes through ``ReproCLI`` exactly as under ``repro fit``; the
engine then sets only what the experiment owns (seed, steps, evaluation interval, the overrides
of the spec) and what the engine itself decides (where logs and results go, the device, the
pipeline strategy). The result is written atomically when the run ends.

``make_trainer`` is the same engine-side Trainer set-up for code that trains without a config
file (the bench's timed runs on synthetic data).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from jsonargparse import ArgumentError
from lightning.pytorch.loggers import TensorBoardLogger

from repro.argument_errors import one_line
from repro.files import read_json, write_json_atomic
from repro.lit.cli import VERBOSE_ENV, ConfigError, ReproCLI
from repro.lit.gpt_module import GPTLightningModule
from repro.lit.hf_module import HFCausalLMModule
from repro.pipeline.lightning import ClappingStrategy
from repro.pipeline.lightning.seams import ReportsPipeline
from repro.stop import STOP

from .model_config import load_model_config
from .placement import Slot
from .provenance import provenance
from .spec import RunSpec
from .store import RunResult, checkpoint_path, result_path, save_result, tensorboard_dir

# Lightning's lines that say nothing about a run of the suite (device banners, tips, the
# distributed preamble, and warnings about settings the engine chose on purpose).
QUIET_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero")
HARMLESS_WARNINGS = (
    r".*smaller than the logging interval.*",
    r".*does not have many workers.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r".*is not resumable.*",
    r".*Checkpoint directory .* exists and is not empty.*",
    r".*LightningCLI.s args parameter is intended to run from within Python.*",
)


def quiet_lightning() -> None:
    """Silence Lightning's banners, tips and known-harmless warnings in this process (unless -v)."""
    if os.environ.get(VERBOSE_ENV):
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for pattern in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)


class RunRecorder(L.Callback):
    """Records the validation curve; when training ends, rank 0 writes what it saw (the parent
    process adds the wall time and provenance), and every rank takes part in the checkpoint."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.curve: list[tuple[int, float]] = []
        self.bytes: list[float] = []  # pipeline runs: bytes sent by each evaluation

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        every, step = self.spec.checkpoint_every, trainer.global_step
        if every and step % every == 0 and step < self.spec.steps:
            trainer.save_checkpoint(Path(self.spec.folder) / f"{self.spec.name}-step{step}.ckpt")

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get("val/loss")
        if value is not None:
            self.curve.append((int(trainer.global_step), float(value)))
            sent = trainer.callback_metrics.get("pipe/bytes_total")
            if sent is not None:
                self.bytes.append(float(sent))

    def on_train_end(self, trainer, pl_module) -> None:
        pipeline = trainer.strategy if isinstance(trainer.strategy, ReportsPipeline) else None
        if pipeline is not None:  # a pipeline reduces its statistics only when they are read
            pipeline.flush_statistics()
        if self.spec.save_checkpoint:
            # a collective on pipeline runs
            trainer.save_checkpoint(checkpoint_path(self.spec), weights_only=self.spec.weights_only)
        summary = pipeline.run_summary if pipeline is not None else None
        record = {
            "val_curve": self.curve,
            "val_bytes": self.bytes or None,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
            "global_step": int(trainer.global_step),
            "pipeline": summary() if callable(summary) else None,
            "batch_tokens": int(trainer.datamodule.batch_size * trainer.datamodule.block_size)
            if trainer.datamodule is not None
            else 0,
        }
        if trainer.global_rank == 0:
            write_json_atomic(_partial_path(self.spec), record)


def _partial_path(spec: RunSpec) -> Path:
    """Where rank 0 leaves what it saw, for the main process to finish the result."""
    return Path(spec.folder) / ".partial" / f"{spec.name}.json"


class _EngineCLI(ReproCLI):
    """ReproCLI that builds the engine's Trainer: the config's own trainer settings, with the
    engine's logger, callbacks, devices and strategy on top."""

    def __init__(self, args: list[str], trainer_kwargs: dict[str, Any], model_class: type) -> None:
        self._engine_trainer_kwargs = trainer_kwargs
        super().__init__(
            args=args,
            model_class=model_class,
            run=False,
            save_config_callback=None,
            parser_kwargs={"exit_on_error": False},
        )

    def instantiate_trainer(self, **kwargs: Any):
        return super().instantiate_trainer(**{**kwargs, **self._engine_trainer_kwargs})


def cli_args(spec: RunSpec, cache_dir: str | None = None) -> list[str]:
    """The command line of ``repro fit`` that trains this run (apart from logs and devices)."""
    args = [
        "--config",
        spec.config,
        f"--seed_everything={spec.seed}",
        f"--data.shuffle_seed={spec.seed}",
        f"--trainer.max_steps={spec.steps}",
        f"--trainer.val_check_interval={spec.eval_every}",
        "--trainer.check_val_every_n_epoch=null",
    ]
    args += [
        f"--{key}={value if isinstance(value, str) else json.dumps(value)}"
        for key, value in spec.override_dict().items()
    ]
    if cache_dir:
        args.append(f"--data.cache_dir={cache_dir}")
    return args


def _trainer_kwargs(spec: RunSpec, slot: Slot, recorder: RunRecorder, backend: str | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        logger=TensorBoardLogger(
            save_dir=str(Path(spec.folder) / "tb"), name=spec.name, version=0, default_hp_metric=False
        ),
        callbacks=[recorder],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=max(1, min(10, spec.eval_every)),
        accelerator=slot.accelerator,
    )
    if spec.stages > 1:
        options = {"start_method": "fork", "process_group_backend": backend, **spec.pipeline_dict()}
        if slot.accelerator == "gpu":  # one device per stage, a GPU named twice when stages share it
            options["parallel_devices"] = [torch.device("cuda", i) for i in slot.devices]
            # a forked rank cannot use CUDA once this process has (gpu-check's bench, an earlier run)
            options["start_method"] = "spawn"
        kwargs["strategy"] = ClappingStrategy(**options)
        # Lightning refuses a GPU named twice in devices; the strategy's parallel_devices rule
        kwargs["devices"] = sorted(set(slot.devices)) if slot.accelerator == "gpu" else spec.stages
    else:
        kwargs["strategy"] = "auto"
        kwargs["devices"] = list(slot.devices) if slot.accelerator == "gpu" else 1
    return kwargs


def train_run(
    spec: RunSpec,
    slot: Slot,
    cache_dir: str | None = None,
    backend: str | None = None,
    fingerprint: str | None = None,
) -> RunResult:
    """Train ``spec`` on ``slot`` and write its result (the caller checked it is not finished)."""
    start = time.perf_counter()
    torch.set_num_threads(slot.threads)
    folder = Path(spec.folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (_partial_path(spec), result_path(spec)):
        stale.unlink(missing_ok=True)
    tb = tensorboard_dir(spec)
    if tb.exists():  # left by an interrupted attempt
        shutil.rmtree(tb)
    recorder = RunRecorder(spec)
    try:
        model_class = HFCausalLMModule if load_model_config(spec.config).is_pretrained else GPTLightningModule
        cli = _EngineCLI(
            cli_args(spec, cache_dir), _trainer_kwargs(spec, slot, recorder, backend), model_class
        )
    except (ArgumentError, ConfigError) as exc:  # a config the experiment's overrides do not fit
        raise ValueError(f"run {spec.display}: {one_line(exc)}") from None
    STOP.signum = STOP.stopped = None
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if STOP.stopped is not None:  # stopped by a signal at a step boundary: not finished
        raise KeyboardInterrupt(
            f"run {spec.display} stopped by {STOP.stopped.name} after step {STOP.stopped.step}"
        )
    # A stop signal that came after the last step boundary (or to the launcher before its ranks
    # existed) stopped no step: the run finished and is kept, and the experiment stops after it.
    late = STOP.signum
    partial = read_json(_partial_path(spec), "run record")
    result = RunResult(
        name=spec.name,
        fingerprint=fingerprint or spec.fingerprint(),
        seed=spec.seed,
        steps=spec.steps,
        global_step=partial["global_step"],
        val_curve=tuple((int(s), float(v)) for s, v in partial["val_curve"]),
        metrics=partial["metrics"],
        overrides=spec.override_dict(),
        config=spec.config,
        wall_s=time.perf_counter() - start,
        tokens_trained=partial["global_step"] * partial["batch_tokens"],
        threads=slot.threads,
        device=slot.device,
        provenance=provenance(slot.threads),
        pipeline=partial["pipeline"],
        val_bytes=tuple(partial["val_bytes"]) if partial.get("val_bytes") else None,
        checkpoint=str(checkpoint_path(spec)) if spec.save_checkpoint else None,
    )
    save_result(spec, result)
    _partial_path(spec).unlink(missing_ok=True)
    if late is not None:
        raise KeyboardInterrupt(
            f"run {spec.display} finished as {signal.Signals(late).name} arrived; its result is kept"
        )
    return result


def make_trainer(
    *,
    steps: int,
    devices: int = 1,
    accelerator: str = "cpu",
    strategy: Any = "auto",
    callbacks: list | None = None,
    eval_every: int | None = None,
    **kwargs: Any,
) -> L.Trainer:
    """A Trainer set up as the engine sets up its runs (no logger, checkpoints, progress bar or
    summary; validation only with ``eval_every``), for timed runs without a config file."""
    options: dict[str, Any] = dict(
        accelerator=accelerator,
        devices=devices,
        strategy=strategy,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=list(callbacks or []),
    )
    if eval_every is None:
        options["limit_val_batches"] = 0
    else:
        options.update(val_check_interval=eval_every, check_val_every_n_epoch=None)
    options.update(kwargs)
    return L.Trainer(**options)

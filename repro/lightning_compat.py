"""Every use of Lightning's private API in the suite, in one place.

The strategy needs a few things Lightning keeps private: its process-group set-up, its launchers,
moving optimizer state, two counters of the fit loop, and the precision plugin's clipping. When a
Lightning upgrade moves one of them, ``missing_symbols()`` names it (a test calls it), and this is
the only file to change. A test also fails on a private Lightning import anywhere else in
``repro/``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import tempfile
import types
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.fabric.utilities.distributed import _init_dist_connection
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher, _WorkerOutput
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from repro.stop import STOP, Stopped

# module path -> private names imported from it (checked by missing_symbols)
PRIVATE_IMPORTS = {
    "lightning.fabric.utilities.distributed": ("_init_dist_connection",),
    "lightning.fabric.utilities.optimizer": ("_optimizers_to_device",),
    "lightning.pytorch.strategies.launchers.multiprocessing": ("_MultiProcessingLauncher", "_WorkerOutput"),
    "lightning.pytorch.strategies.launchers.subprocess_script": ("_SubprocessScriptLauncher",),
    "lightning.pytorch.utilities.model_summary.model_summary": ("_format_summary_table",),
}
# private attributes read or written on Lightning objects: (what, attribute)
PRIVATE_ATTRIBUTES = (
    ("Trainer", "_accelerator_connector"),
    ("Trainer", "_checkpoint_connector"),
    ("Trainer.fit_loop", "_should_accumulate"),
    ("Trainer.fit_loop", "_data_source"),
    ("Trainer.fit_loop.epoch_loop", "_batches_that_stepped"),
    ("Strategy", "_launcher"),
    ("_MultiProcessingLauncher", "_collect_rank_zero_results"),
    ("ModelSummary", "_max_depth"),
)


def init_process_group(cluster_environment, backend: str, **kwargs: Any) -> None:
    """Lightning's process-group set-up (it exports MASTER_ADDR/PORT from the cluster environment)."""
    _init_dist_connection(cluster_environment, backend, **kwargs)


def optimizers_to_device(optimizers, device) -> None:
    _optimizers_to_device(optimizers, device)


def should_accumulate(trainer) -> bool:
    """Whether this training batch only accumulates gradients (no optimizer step)."""
    return trainer.fit_loop._should_accumulate()


def batches_that_stepped(trainer) -> int:
    """The optimizer steps Lightning's logger connector counts (its logging step)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def requeue_signal_of(trainer) -> int | None:
    """The signal that requeues the job under SLURM with auto-requeue (None elsewhere)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return environment.requeue_signal
    return None


def hpc_save_path(trainer, folder: str) -> str:
    """Where Lightning saves (and on a requeued start finds and resumes) a SLURM checkpoint."""
    return trainer._checkpoint_connector.hpc_save_path(folder)


def requeue_slurm_job() -> int:
    """``scontrol requeue`` this job (an array task: its own id), as Lightning's SLURM handler does."""
    import subprocess

    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]
    return subprocess.call(["scontrol", "requeue", job])


def launched_ranks(trainer) -> bool:
    """Whether this process is a rank that the suite's fork/spawn launcher started (the launching
    process handles Ctrl-C for it)."""
    return trainer.world_size > 1 and isinstance(
        getattr(trainer.strategy, "launcher", None), _MultiProcessingLauncher
    )


def set_launcher(strategy, launcher) -> None:
    """A strategy's launcher (Lightning's own strategies set this attribute in _configure_launcher)."""
    strategy._launcher = launcher


def override_grad_norm_clipping(precision_plugin, clip: Callable[[Any, float], None]) -> None:
    """Make the precision plugin clip by ``clip(optimizer, max_norm)`` (a norm over all stages)."""
    precision_plugin.clip_grad_by_norm = types.MethodType(
        lambda _self, optimizer, value: clip(optimizer, value), precision_plugin
    )


def script_launcher(cluster_environment, num_processes: int, num_nodes: int):
    """Lightning's popen launcher (the CLI, torchrun, SLURM)."""
    return _SubprocessScriptLauncher(cluster_environment, num_processes, num_nodes)


class FullModelLauncher(_MultiProcessingLauncher):
    """Lightning's spawn/fork launcher with two changes: a failed rank is named (torch stops the
    others), and rank 0 sends the *full* model back to the main process (gathered from every
    stage), not its own stage's part."""

    def launch(self, function, *args: Any, trainer=None, **kwargs: Any) -> Any:
        STOP.install("launcher")  # a stop signal here is forwarded to the ranks, which stop together
        try:
            return super().launch(function, *args, trainer=trainer, **kwargs)
        except ProcessExitedException as exc:
            how = (
                f"was killed by signal {exc.signal_name}"
                if exc.signal_name
                else f"exited with code {exc.exit_code}"
            )
            raise RuntimeError(
                f"strategy='clapping': rank {exc.error_index} (pid {exc.error_pid}) {how}; every other rank was stopped"
            ) from None
        except ProcessRaisedException as exc:
            raise RuntimeError(
                f"strategy='clapping': rank {exc.error_index} failed; every other rank was stopped.\n{exc.msg}"
            ) from None
        finally:
            STOP.restore()

    def get_extra_results(self, trainer) -> dict[str, Any]:
        extra = super().get_extra_results(trainer)
        extra["stopped"] = None if STOP.stopped is None else dataclasses.asdict(STOP.stopped)
        return extra

    def update_main_process_results(self, trainer, extra: dict[str, Any]) -> None:
        super().update_main_process_results(trainer, extra)
        STOP.stopped = Stopped(**extra["stopped"]) if extra.get("stopped") else None

    def _collect_rank_zero_results(self, trainer, results: Any):
        checkpoint_callback = trainer.checkpoint_callback
        best_model_path = (
            getattr(checkpoint_callback, "best_model_path", None) if checkpoint_callback else None
        )
        state_dict = self._strategy.lightning_module_state_dict()  # a collective: every rank calls it
        if self._strategy.local_rank != 0:
            return None
        weights_path = None
        if trainer.state.fn == TrainerFn.FITTING:
            weights_path = os.path.join(tempfile.mkdtemp(), ".temp.ckpt")
            self._strategy.checkpoint_io.save_checkpoint(state_dict, weights_path)
        extra = self.get_extra_results(trainer)
        return _WorkerOutput(best_model_path, weights_path, trainer.state, results, extra)


class ModelSummary(L.pytorch.callbacks.ModelSummary):
    """Lightning's model summary without FLOPs where it measured none: it counts them only by running
    a module's ``example_input_array``, which no module of the suite sets (a pipeline stage could not
    run it), so its FLOPs column and 'Total FLOPs' line said 0 for every run."""

    @staticmethod
    def summarize(
        summary_data, total_parameters, trainable_parameters, model_size, total_training_modes, total_flops,
        **summarize_kwargs: Any,
    ) -> None:  # fmt: skip
        if not total_flops:
            summary_data = [column for column in summary_data if column[0] != "FLOPs"]
        table = _format_summary_table(
            total_parameters,
            trainable_parameters,
            model_size,
            total_training_modes,
            total_flops,
            *summary_data,
        )
        if not total_flops:
            table = "\n".join(
                line for line in table.splitlines() if not line.rstrip().endswith("Total Flops")
            )
        logging.getLogger(L.pytorch.callbacks.model_summary.__name__).info("\n" + table)


def summary_without_unmeasured_flops(trainer) -> None:
    """Lightning's own model summary callback on ``trainer`` (plain or rich, not a user's subclass)
    replaced by :class:`ModelSummary` of the same depth."""
    lightnings = (L.pytorch.callbacks.ModelSummary, L.pytorch.callbacks.RichModelSummary)
    for i, callback in enumerate(trainer.callbacks):
        if type(callback) in lightnings:
            trainer.callbacks[i] = ModelSummary(max_depth=callback._max_depth)


def passed_train_loader(trainer) -> Any:
    """The train dataloader handed to ``trainer.fit`` itself (``train_dataloaders=``), None when the
    module or a datamodule makes it (asking them would run their hook early)."""
    instance = getattr(getattr(trainer.fit_loop, "_data_source", None), "instance", None)
    return None if isinstance(instance, (L.LightningModule, L.LightningDataModule)) else instance


def missing_symbols() -> list[str]:
    """The private Lightning names this module relies on that the installed Lightning lacks."""
    missing = []
    for module, names in PRIVATE_IMPORTS.items():
        mod = importlib.import_module(module)
        missing += [f"{module}.{name}" for name in names if not hasattr(mod, name)]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    owners = {
        "Trainer": trainer,
        "Trainer.fit_loop": trainer.fit_loop,
        "Trainer.fit_loop.epoch_loop": trainer.fit_loop.epoch_loop,
        "Strategy": trainer.strategy,
        "_MultiProcessingLauncher": _MultiProcessingLauncher,
        "ModelSummary": L.pytorch.callbacks.ModelSummary(),
    }
    missing += [f"{what}.{attr}" for what, attr in PRIVATE_ATTRIBUTES if not hasattr(owners[what], attr)]
    return missing

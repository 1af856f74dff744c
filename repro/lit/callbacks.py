"""Small callbacks the configs use."""

from __future__ import annotations

import os
import signal
import time

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from repro.lightning_compat import hpc_save_path, requeue_signal_of, requeue_slurm_job
from repro.stop import STOP, Stopped, install_stop


class TokenThroughput(L.Callback):
    """Logs ``train/tokens_per_sec``: tokens of the last ``window`` training batches over their wall time.

    Args:
        window: Number of batches to average over.
    """

    def __init__(self, window: int = 10) -> None:
        if not isinstance(window, int) or window <= 0:
            raise ValueError(f"TokenThroughput.window={window!r}: must be a positive integer")
        self.window = window
        self._start: float | None = None
        self._tokens = 0
        self._batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._start is None:  # the first batch includes start-up costs: start timing after it
            self._start = now
            return
        self._tokens += int(batch["input_ids"].numel())
        self._batches += 1
        if self._batches >= self.window:
            rate = self._tokens / max(now - self._start, 1e-9)
            pl_module.log("train/tokens_per_sec", rate, on_step=True, on_epoch=False)
            self._start, self._tokens, self._batches = now, 0, 0


class FinalCheckpoint(L.Callback):
    """The checkpoint of a fit: ``<log_dir>/checkpoints/<filename>`` when training ends, whatever
    step it stopped at (Lightning's ModelCheckpoint saves on its own schedule and can miss the last
    steps), or ``<log_dir>/checkpoints/interrupted.ckpt`` when a signal stops it.

    SIGINT (Ctrl-C) and SIGTERM (a scheduler's time limit or preemption) stop the fit at the end of
    the step under way (``repro.stop``): every process saves the checkpoint together at that
    step boundary, so ``repro fit --config ... --ckpt_path <that file>`` resumes exactly. Under
    SLURM with auto-requeue, its requeue signal (``sbatch --signal=SIGUSR1@90``) saves Lightning's
    ``hpc_ckpt_<n>.ckpt`` instead and requeues the job, which then resumes from it. Another
    exception (a second Ctrl-C included) saves ``interrupted.ckpt`` in a single process.

    Args:
        filename: File name of the checkpoint written at the end of ``fit``.
    """

    def __init__(self, filename: str = "final.ckpt") -> None:
        if not filename or "/" in filename:
            raise ValueError(f"FinalCheckpoint.filename={filename!r}: must be a plain file name")
        self.filename = filename
        self.path: str | None = None

    def _save(self, trainer, filename: str) -> None:
        root = trainer.log_dir or trainer.default_root_dir
        self.path = os.path.join(root, "checkpoints", filename)
        trainer.save_checkpoint(self.path)

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.world_size == 1:  # a pipeline's strategy handles the signals of its ranks
            install_stop("process", requeue_signal_of(trainer))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.world_size == 1 and STOP.signum is not None and STOP.stopped is None:
            STOP.stop_after(STOP.signum, int(trainer.global_step))
            trainer.should_stop = True
        stopped = STOP.stopped
        if stopped is None or stopped.path is not None:
            return
        if stopped.signum == requeue_signal_of(trainer):  # save where a requeued start finds it, requeue
            self.path = hpc_save_path(trainer, trainer.default_root_dir)
            trainer.save_checkpoint(self.path)
            if trainer.is_global_zero:
                requeue_slurm_job()
        else:
            self._save(trainer, "interrupted.ckpt")  # every process together (a pipeline: a collective)
        stopped.path = self.path

    def on_train_end(self, trainer, pl_module) -> None:
        if STOP.stopped is None:
            self._save(trainer, self.filename)
            if "val/loss" not in trainer.callback_metrics and trainer.limit_val_batches != 0:
                rank_zero_info(
                    f"no validation ran during this fit (it ended before an epoch did): set trainer.val_check_interval "
                    f"(and check_val_every_n_epoch: null) to validate every N steps, or run repro validate with "
                    f"--ckpt_path={self.path}"
                )
        if trainer.world_size == 1:
            STOP.restore()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if trainer.world_size == 1:
            STOP.restore()
        if (
            trainer.state.fn == "fit" and trainer.global_step > 0 and trainer.world_size == 1
        ):  # several processes save only together, at a step boundary (above)
            self._save(trainer, "interrupted.ckpt")
            if isinstance(exception, KeyboardInterrupt):  # a second Ctrl-C
                STOP.stopped = Stopped(signal.SIGINT, int(trainer.global_step), self.path)
            rank_zero_info(
                f"training stopped at step {trainer.global_step}; resume with --ckpt_path={self.path}"
            )


class _CountsSteps:
    """A progress bar of a run bounded by steps (``max_steps`` with ``max_epochs: -1``): its total is
    ``max_steps``, it counts optimizer steps from where a resumed run starts, and it reads ``Steps``;
    Lightning's reads ``Epoch 0/-2`` and counts batches of the epoch against the steps left."""

    def _steps_bound(self) -> bool:
        trainer = self.trainer
        return trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0

    @property
    def total_train_batches(self):
        return self.trainer.max_steps if self._steps_bound() else super().total_train_batches


class StepsRichProgressBar(_CountsSteps, RichProgressBar):
    """Lightning's rich progress bar, counting the steps of a step-bounded run (see ``_CountsSteps``)."""

    def _show_steps(self, trainer) -> None:
        if self._steps_bound() and self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.update(
                self.train_progress_bar_id,
                completed=trainer.global_step,
                total=trainer.max_steps,
                description="Steps",
            )

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._show_steps(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._show_steps(trainer)
        self.refresh()


class StepsTQDMProgressBar(_CountsSteps, TQDMProgressBar):
    """Lightning's tqdm progress bar, counting the steps of a step-bounded run (see ``_CountsSteps``)."""

    def _show_steps(self, trainer) -> None:
        if self._steps_bound():
            bar = self.train_progress_bar
            bar.total, bar.n = trainer.max_steps, trainer.global_step
            bar.set_description("Steps")
            bar.refresh()

    def on_train_epoch_start(self, trainer, *args) -> None:
        super().on_train_epoch_start(trainer, *args)
        self._show_steps(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._show_steps(trainer)


def counting_steps(bar):
    """The step-counting variant of Lightning's default progress bar ``bar`` (others as they are)."""
    if type(bar) is RichProgressBar:
        return StepsRichProgressBar()
    if type(bar) is TQDMProgressBar:
        return StepsTQDMProgressBar()
    return bar

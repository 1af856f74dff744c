"""Small callbacks the configs use."""

from __future__ import annotations

import os
import time

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_info


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
    """Saves ``<log_dir>/checkpoints/<filename>`` when training ends, whatever step it stopped at
    (Lightning's ModelCheckpoint saves on its own schedule and can miss the last steps), and
    ``<log_dir>/checkpoints/interrupted.ckpt`` when training stops on an exception (Ctrl-C
    included); resume with ``repro fit --config ... --ckpt_path <that file>``.

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

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, self.filename)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if (
            trainer.state.fn == "fit" and trainer.global_step > 0 and trainer.world_size == 1
        ):  # a collective elsewhere
            self._save(trainer, "interrupted.ckpt")
            rank_zero_info(
                f"training stopped at step {trainer.global_step}; resume with --ckpt_path={self.path}"
            )

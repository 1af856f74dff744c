"""Callbacks the stop tests put into runs (importable by class path from a config or the CLI)."""

from __future__ import annotations

import json
import os
import signal

import lightning as L


class SignalAt(L.Callback):
    """Sends ``signum`` when the training step ``step`` starts (on rank ``rank``): to this process,
    or to its parent (``to_parent``: the launching process, as Ctrl-C in a terminal reaches it)."""

    def __init__(self, step: int, signum: int, rank: int = 0, to_parent: bool = False) -> None:
        self.step, self.signum, self.rank, self.to_parent = step, signum, rank, to_parent

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getppid() if self.to_parent else os.getpid(), signal.Signals(self.signum))


class LossLog(L.Callback):
    """Appends ``{"step": global step after the batch, "loss": train loss}`` lines to ``path`` (rank 0)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank == 0:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": int(trainer.global_step), "loss": float(loss)}) + "\n")


def read_losses(path) -> dict[int, float]:
    with open(path) as f:
        return {row["step"]: row["loss"] for row in map(json.loads, f)}

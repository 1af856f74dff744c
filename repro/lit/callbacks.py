"""Small callbacks the configs use."""

from __future__ import annotations

import time

import lightning as L


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

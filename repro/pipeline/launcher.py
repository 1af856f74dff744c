"""Lightning's spawn/fork launcher, with one change: rank 0 sends the *full* model back to the
main process (gathered from every stage), not its own stage's part."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Optional

from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher, _WorkerOutput
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException
from lightning.pytorch.trainer.states import TrainerFn


class PipelineMultiProcessingLauncher(_MultiProcessingLauncher):
    def launch(self, function, *args: Any, trainer=None, **kwargs: Any) -> Any:
        """As Lightning's, but a failed rank is named (torch stops the other ranks)."""
        try:
            return super().launch(function, *args, trainer=trainer, **kwargs)
        except ProcessExitedException as exc:
            how = f"was killed by signal {exc.signal_name}" if exc.signal_name else f"exited with code {exc.exit_code}"
            raise RuntimeError(
                f"strategy='clapping': rank {exc.error_index} (pid {exc.error_pid}) {how}; every other rank was stopped"
            ) from exc
        except ProcessRaisedException as exc:
            raise RuntimeError(f"strategy='clapping': rank {exc.error_index} failed; every other rank was stopped.\n{exc.msg}") from exc

    def _collect_rank_zero_results(self, trainer, results: Any) -> Optional[_WorkerOutput]:
        checkpoint_callback = trainer.checkpoint_callback
        best_model_path = (
            checkpoint_callback.best_model_path
            if checkpoint_callback and hasattr(checkpoint_callback, "best_model_path")
            else None
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
